# tests/cluster/provisioner-e2e.d/quota.sh — enforced hostPath sizes (project quotas), sourced by
# provisioner-e2e. Guest only (xfsprogs, loop devices):
#   tests/vm/run --mem 4096 --timeout 1800 tests/cluster/provisioner-e2e quota quota-off quota-kill
#
# node-a's config gets two more roots through storageClassConfigs: class flexvol-quota's on an XFS
# loop mount with prjquota, class flexvol-noquota's on XFS without it (both nodes share one kernel;
# only node-a's config names them).
#   quota       32Mi claim -> pod Running, PV size-enforced "true", the marker holds the project
#               ID; statfs of the pod's volume directory (kubelet's bind mount) shows 32Mi; a write
#               past the size fails (ENOSPC); `flexvol status` says enforced; claim patched to
#               64Mi -> PV, claim status, limit and statfs at 64Mi and 16Mi more can be written;
#               deleted -> directory, PV and the project's limit gone
#   quota-off   root on XFS without prjquota -> PV size-enforced "false" with the fix in
#               flexvol/size-note, `flexvol status` says "size not enforced"
#   quota-kill  kill -9 after the project ID is recorded in the marker, before the quota is set;
#               restart -> one directory, one PV, size enforced, statfs shows the claim's size

QUOTA_READY=""
ROOT_Q=""
ROOT_N=""

# quota_disk NAME OPTS: a fresh 320 MiB XFS on a loop device mounted at $CLUSTER_DIR/roots/NAME
# (mount options OPTS, "" for none).
quota_disk() {
	local img="$CLUSTER_DIR/$1.img" mnt="$CLUSTER_DIR/roots/$1" dev
	truncate -s 320M "$img" || fail "truncate $img"
	dev="$(losetup -f --show "$img")" || fail "losetup $img"
	mkfs.xfs -q "$dev" || fail "mkfs.xfs $dev"
	mkdir -p "$mnt"
	mount ${2:+-o "$2"} "$dev" "$mnt" || fail "mount $dev at $mnt ($2)"
}

# quota_config: node-a's config names the two class roots (storageClassConfigs). Checked at the
# start of every quota scenario: another scenario file may have rewritten the config meanwhile.
# The provisioner re-reads its config every pass, the driver on every call.
quota_config() {
	local cfg
	cfg="$(kc_node_dir node-a)/flexvol-config.json"
	grep -q '"flexvol-quota"' "$cfg" && return 0
	sed -i '$ s#}$#,"storageClassConfigs":{"flexvol-quota":{"nodePathMap":[{"node":"node-a","paths":["'"$ROOT_Q"'"]}]},"flexvol-noquota":{"nodePathMap":[{"node":"node-a","paths":["'"$ROOT_N"'"]}]}}}#' "$cfg"
	grep -q '"flexvol-quota"' "$cfg" || fail "could not add the quota roots to $cfg"
}

quota_setup() {
	if [ -n "$QUOTA_READY" ]; then
		quota_config
		return 0
	fi
	command -v mkfs.xfs >/dev/null && command -v xfs_quota >/dev/null ||
		fail "quota scenarios need xfsprogs: run them in the guest (tests/vm/run)"
	ROOT_Q="$CLUSTER_DIR/roots/quota"
	ROOT_N="$CLUSTER_DIR/roots/noquota"
	quota_disk quota prjquota
	quota_disk noquota ""
	quota_config
	local c
	for c in flexvol-quota flexvol-noquota; do
		apply "class $c" <<EOF
{"apiVersion":"storage.k8s.io/v1","kind":"StorageClass","metadata":{"name":"$c"},
 "provisioner":"flexvol/hostpath","volumeBindingMode":"WaitForFirstConsumer","allowVolumeExpansion":true,
 "allowedTopologies":[{"matchLabelExpressions":[{"key":"flexvol/hostpath","values":["true"]}]}]}
EOF
	done
	QUOTA_READY=1
}

# sized_claim NAME CLASS SIZE
sized_claim() {
	apply "pvc $1" <<EOF
{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"name":"$1","namespace":"default"},
 "spec":{"accessModes":["ReadWriteOnce"],"storageClassName":"$2","resources":{"requests":{"storage":"$3"}}}}
EOF
}

# statfs_bytes DIR: the total size statfs reports (what df in the pod and kubelet's volume stats show)
statfs_bytes() { stat -f -c '%b %S' "$1" | awk '{ printf "%d", $1 * $2 }'; }
statfs_is() { [ "$(statfs_bytes "$1")" = "$2" ]; }
# qty_bytes QUANTITY: bytes of a Kubernetes quantity (plain, Ki, Mi, Gi)
qty_bytes() {
	case "$1" in
	*Ki) echo $((${1%Ki} << 10)) ;;
	*Mi) echo $((${1%Mi} << 20)) ;;
	*Gi) echo $((${1%Gi} << 30)) ;;
	*) echo "$1" ;;
	esac
}
pv_bytes_is() { [ "$(qty_bytes "$(jp pv "$1" '{.spec.capacity.storage}')")" = "$2" ]; }
claim_bytes_is() { [ "$(qty_bytes "$(jp pvc "$1" '{.status.capacity.storage}')")" = "$2" ]; }
pod_volume_dir() { # POD PV
	echo "$(kc_node_dir node-a)/root/pods/$(jp pod "$1" '{.metadata.uid}')/volumes/flexvol~hostpath/$2"
}
# node_status: `flexvol status` on node-a (exit 1 just means something else is flagged)
node_status() { FLEXVOL_CONFIG="$(kc_node_dir node-a)/flexvol-config.json" "$KC_FLEXVOL" status || true; }
# status_size DIR: the size line `flexvol status` prints for the provisioned directory DIR
status_size() { node_status | grep -A2 -F "provisioned $1 " | sed -n 's/^ *size: *//p'; }
# project_limit MNT ID: the hard block limit (KiB) of project ID, empty when it has no record
project_limit() { xfs_quota -x -c 'report -p -b -N -n' "$1" | awk -v id="#$2" '$1 == id { print $4 }'; }

scenario_quota() {
	local t0 secs pv dir d id out lim
	quota_setup
	t0="$(kl_now)"
	sized_claim c-quota flexvol-quota 32Mi
	pod p-quota c-quota
	wait_until "pod p-quota Running" 120 pod_running p-quota
	secs="$(kl_since "$t0")"
	pv="$(pv_of c-quota)"
	[ "$(jp pv "$pv" '{.metadata.annotations.flexvol/size-enforced}')" = true ] ||
		fail "PV $pv: size-enforced=$(jp pv "$pv" '{.metadata.annotations.flexvol/size-enforced}') note=$(jp pv "$pv" '{.metadata.annotations.flexvol/size-note}')"
	dir="$(jp pv "$pv" '{.spec.flexVolume.options.path}')"
	[ "$dir" = "$ROOT_Q/${pv}_default_c-quota" ] || fail "PV path $dir is not on the quota root $ROOT_Q"
	id="$(sed -n 's/.*"projectId":\([0-9]*\).*/\1/p' "$dir/.flexvol-provisioned")"
	[ -n "$id" ] || fail "the marker of $dir has no projectId: $(cat "$dir/.flexvol-provisioned")"
	[ "$(jp pv "$pv" '{.metadata.annotations.flexvol/quota-project}')" = "$id" ] || fail "PV's quota-project is not $id"
	d="$(pod_volume_dir p-quota "$pv")"
	[ "$(stat -c %d:%i "$d")" = "$(stat -c %d:%i "$dir")" ] || fail "$d is not a mount of $dir"
	statfs_is "$d" $((32 << 20)) || fail "statfs of the pod's volume $d says $(statfs_bytes "$d") bytes, not 32Mi: $(df -h "$d" | tail -1)"
	echo "provisioner-e2e: df of the pod's volume: $(df -h "$d" | tail -1)"
	if out="$(dd if=/dev/zero of="$d/fill" bs=1M count=48 conv=fsync 2>&1)"; then
		fail "48 MiB written into a 32Mi volume: $out"
	fi
	grep -q "No space left on device" <<<"$out" || fail "the write past the size failed, but not with ENOSPC: $out"
	[ "$(stat -c %s "$d/fill")" -le $((32 << 20)) ] || fail "fill is $(stat -c %s "$d/fill") bytes"
	out="$(status_size "$dir")"
	grep -q "^enforced (project quota $id): limit 32.0 MiB, used " <<<"$out" || fail "flexvol status says: '$out'"
	pass "quota: 32Mi claim -> pod Running in $secs s; PV size-enforced, project $id; df in the pod: 32Mi; a 48 MiB write failed with ENOSPC; status: '$out'"
	echo "provisioner-e2e: TIME pvc-to-running (hostPath with quota) ${secs}s"

	kc_kubectl patch pvc c-quota --type merge -p '{"spec":{"resources":{"requests":{"storage":"64Mi"}}}}' >/dev/null ||
		fail "patch claim c-quota to 64Mi"
	wait_until "PV $pv size-bytes at 64Mi" 60 sh -c "[ \"\$('$KC_BIN/kubectl' --kubeconfig '$KC_DIR/admin.kubeconfig' get pv $pv -o jsonpath='{.metadata.annotations.flexvol/size-bytes}')\" = $((64 << 20)) ]"
	wait_until "PV $pv capacity 64Mi" 60 pv_bytes_is "$pv" $((64 << 20))
	wait_until "claim c-quota status capacity 64Mi" 60 claim_bytes_is c-quota $((64 << 20))
	statfs_is "$d" $((64 << 20)) || fail "after the resize, statfs of $d says $(statfs_bytes "$d") bytes"
	lim="$(project_limit "$ROOT_Q" "$id")"
	[ "$lim" = $((64 << 10)) ] || fail "project $id's limit is '$lim' KiB, not 64Mi"
	out="$(dd if=/dev/zero of="$d/more" bs=1M count=16 conv=fsync 2>&1)" || fail "16 MiB more after the resize failed: $out"
	out="$(status_size "$dir")"
	grep -q "^enforced (project quota $id): limit 64.0 MiB" <<<"$out" || fail "flexvol status after the resize says: '$out'"
	pass "quota: claim 32Mi -> 64Mi: PV, claim status, project limit and df in the pod at 64Mi ($(df -h "$d" | tail -1 | awk '{print $2, $3}')); 16 MiB more written; status: '$out'"

	delete_pod p-quota
	kc_kubectl delete pvc c-quota --wait=false >/dev/null
	wait_until "PV $pv to be deleted" 60 gone pv "$pv"
	[ ! -e "$dir" ] || fail "$dir still exists after its PV was deleted"
	lim="$(project_limit "$ROOT_Q" "$id")"
	[ -z "$lim" ] || [ "$lim" = 0 ] || fail "project $id still has a limit of $lim KiB after the delete"
	pass "quota: deleted -> directory, PV and project $id's limit gone"
}

scenario_quota_off() {
	local pv note out dir
	quota_setup
	sized_claim c-noq flexvol-noquota 32Mi
	pod p-noq c-noq
	wait_until "pod p-noq Running" 120 pod_running p-noq
	pv="$(pv_of c-noq)"
	[ "$(jp pv "$pv" '{.metadata.annotations.flexvol/size-enforced}')" = false ] ||
		fail "PV $pv on a root without prjquota: size-enforced=$(jp pv "$pv" '{.metadata.annotations.flexvol/size-enforced}')"
	note="$(jp pv "$pv" '{.metadata.annotations.flexvol/size-note}')"
	grep -q "filesystem xfs without prjquota on $ROOT_N/.*mount it with -o prjquota to enforce sizes" <<<"$note" ||
		fail "PV $pv's size-note: '$note'"
	dir="$(jp pv "$pv" '{.spec.flexVolume.options.path}')"
	out="$(status_size "$dir")"
	grep -q "^size not enforced: filesystem xfs without prjquota" <<<"$out" || fail "flexvol status says: '$out'"
	pass "quota-off: root on XFS without prjquota -> pod Running, PV size-enforced=false, note '$note'; status: '$out'"
	delete_pod p-noq
	kc_kubectl delete pvc c-noq --wait=false >/dev/null
	wait_until "PV $pv to be deleted" 60 gone pv "$pv"
}

scenario_quota_kill() {
	local pid uid pv dir d
	quota_setup
	stop_provisioner node-a
	start_provisioner node-a FLEXVOL_TEST_KILL_AT=provisioner-quota-after-id
	pid="$(kc_pid_of provisioner-node-a)"
	sized_claim c-qkill flexvol-quota 16Mi
	pod p-qkill c-qkill
	wait_killed node-a "$pid"
	uid="$(claim_uid c-qkill)"
	pv="pvc-$uid"
	dir="$ROOT_Q/${pv}_default_c-qkill"
	grep -q '"projectId":' "$dir/.flexvol-provisioned" || fail "after the kill, $dir's marker has no projectId"
	gone pv "$pv" || fail "PV $pv exists although the kill came before it"
	statfs_is "$dir" $((16 << 20)) && fail "$dir is limited already: the kill came too late to test anything"
	start_provisioner node-a
	wait_until "pod p-qkill Running" 120 pod_running p-qkill
	[ "$(find "$ROOT_Q" -mindepth 1 -maxdepth 1 -name "${pv}_*" | wc -l)" = 1 ] || fail "not one directory for $pv: $(ls "$ROOT_Q")"
	[ "$(pvs_for_claim "$uid")" = 1 ] || fail "$(pvs_for_claim "$uid") PVs for claim c-qkill"
	[ "$(jp pv "$pv" '{.metadata.annotations.flexvol/size-enforced}')" = true ] || fail "PV $pv not size-enforced after the restart"
	d="$(pod_volume_dir p-qkill "$pv")"
	statfs_is "$d" $((16 << 20)) || fail "statfs of $d says $(statfs_bytes "$d") bytes, not 16Mi"
	pass "quota-kill: kill -9 after the project ID was recorded, before the quota; restart -> one directory, one PV, size enforced, df in the pod 16Mi"
	delete_pod p-qkill
	kc_kubectl delete pvc c-qkill --wait=false >/dev/null
	wait_until "PV $pv to be deleted" 60 gone pv "$pv"
}
