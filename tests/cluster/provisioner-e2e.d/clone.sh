# tests/cluster/provisioner-e2e.d/clone.sh — clones of hostPath claims (issue #24, 4), sourced by
# provisioner-e2e. Runs on the host:
#   flock /tmp/cluster-tier.lock tests/cluster/provisioner-e2e clone
#
#   clone   a claim c-src of flexvol-hostpath, written through its pod (a file, a directory, a
#           symlink pointing out of the volume); a claim c-clone with dataSource
#           {kind: PersistentVolumeClaim, name: c-src}: the API server keeps the dataSource (1.20
#           drops only other kinds without the AnyVolumeDataSource gate); while c-src's pod runs,
#           c-clone waits with a ProvisioningFailed event saying the source is mounted, nothing
#           made; pod deleted -> c-clone's pod Running with the data, the symlink still a symlink
#           with the same text, the PV annotated flexvol/cloned-from; a claim of namespace
#           tenant-b naming c-src (which is default's) -> ProvisioningFailed "does not exist",
#           no PV, no directory; a smaller request -> refused the same way; all deleted -> root
#           clean

# clone_claim NAMESPACE NAME SOURCE SIZE
clone_claim() {
	apply "pvc $1/$2" <<EOF
{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"name":"$2","namespace":"$1"},
 "spec":{"accessModes":["ReadWriteOnce"],"storageClassName":"flexvol-hostpath",
  "dataSource":{"kind":"PersistentVolumeClaim","name":"$3"},
  "resources":{"requests":{"storage":"$4"}}}}
EOF
}
# ns_pod NAMESPACE NAME CLAIM: a pod of NAMESPACE using CLAIM
ns_pod() {
	apply "pod $1/$2" <<EOF
{"apiVersion":"v1","kind":"Pod","metadata":{"name":"$2","namespace":"$1"},
 "spec":{"automountServiceAccountToken":false,"terminationGracePeriodSeconds":0,
  "containers":[{$(kc_container "$2"),
   "volumeMounts":[{"name":"data","mountPath":"/data"}]}],
  "volumes":[{"name":"data","persistentVolumeClaim":{"claimName":"$3"}}]}}
EOF
}
ns_jp() { kc_kubectl -n "$1" get "$2" "$3" -o "jsonpath=$4" 2>/dev/null; }
dirs_in_root() { find "$ROOT_A" -mindepth 1 -maxdepth 1 ! -name .flexvol | wc -l; }

scenario_clone() {
	local t0 src_pv src_dir uid d clone_pv clone_dir ev n
	t0="$(kl_now)"
	claim c-src flexvol-hostpath
	pod p-src c-src
	wait_until "pod p-src Running" 120 pod_running p-src
	src_pv="$(pv_of c-src)"
	src_dir="$(jp pv "$src_pv" '{.spec.flexVolume.options.path}')"
	uid="$(jp pod p-src '{.metadata.uid}')"
	d="$(kc_node_dir node-a)/root/pods/$uid/volumes/flexvol~hostpath/$src_pv"
	echo "written through p-src" >"$d/proof"
	mkdir -p "$d/sub/deeper"
	head -c 3000000 /dev/urandom >"$d/sub/deeper/blob"
	ln -s /etc/hostname "$d/sub/out"
	[ "$(cat "$src_dir/proof")" = "written through p-src" ] || fail "the write did not land in $src_dir"

	# The source in use: the clone waits, with an event saying why.
	clone_claim default c-clone c-src 1Gi
	[ "$(jp pvc c-clone '{.spec.dataSource.kind}/{.spec.dataSource.name}')" = PersistentVolumeClaim/c-src ] ||
		fail "the API server dropped c-clone's dataSource: '$(jp pvc c-clone '{.spec.dataSource}')'"
	pod p-clone c-clone
	wait_until "c-clone to wait for its mounted source" 90 has_event c-clone \
		"ProvisioningFailed: .*waiting: its source volume $src_pv is mounted on this node \\(by pod default/p-src\\)"
	clone_pv="$(pv_of c-clone)"
	gone pv "$clone_pv" || fail "a PV for c-clone while its source is mounted"
	[ "$(dirs_in_root)" = 1 ] || fail "something was made beside the source: $(ls -A "$ROOT_A")"
	pass "clone: the API server kept dataSource PersistentVolumeClaim/c-src; while p-src runs: '$(first_event c-clone 'waiting: its source.*' 160)...'; no PV, nothing made"

	# The source released: copied.
	delete_pod p-src
	wait_until "pod p-clone Running" 120 pod_running p-clone
	local secs
	secs="$(kl_since "$t0")"
	clone_dir="$(jp pv "$clone_pv" '{.spec.flexVolume.options.path}')"
	[ "$clone_dir" = "$ROOT_A/${clone_pv}_default_c-clone" ] || fail "clone PV path $clone_dir"
	[ "$(cat "$clone_dir/proof")" = "written through p-src" ] || fail "the clone has no proof file"
	cmp -s "$src_dir/sub/deeper/blob" "$clone_dir/sub/deeper/blob" || fail "the clone's blob differs"
	if [ ! -L "$clone_dir/sub/out" ] || [ "$(readlink "$clone_dir/sub/out")" != /etc/hostname ]; then
		fail "the symlink was not copied as a symlink: $(ls -l "$clone_dir/sub")"
	fi
	grep -q "\"volume\":\"$clone_pv\"" "$clone_dir/.flexvol-provisioned" || fail "the clone's marker is not its own"
	ev="$(jp pv "$clone_pv" '{.metadata.annotations.flexvol/cloned-from}')"
	[[ "$ev" == "$src_pv ("* ]] || fail "PV $clone_pv: flexvol/cloned-from is '$ev'"
	uid="$(jp pod p-clone '{.metadata.uid}')"
	d="$(kc_node_dir node-a)/root/pods/$uid/volumes/flexvol~hostpath/$clone_pv"
	echo "the clone's own" >"$d/proof"
	[ "$(cat "$src_dir/proof")" = "written through p-src" ] || fail "a write to the clone changed the source"
	pass "clone: source released -> p-clone Running ${secs} s after c-src was created; the data, a 3 MB file and a symlink (as a link) are in $clone_dir; cloned-from '$ev'; writing the clone leaves the source alone"
	echo "provisioner-e2e: TIME clone-to-running ${secs}s"

	# Another tenant names c-src: there is no c-src in its namespace; nothing is read or made.
	kc_kubectl create namespace tenant-b >/dev/null 2>&1 || true
	clone_claim tenant-b c-steal c-src 1Gi
	ns_pod tenant-b p-steal c-steal
	wait_until "ProvisioningFailed on tenant-b/c-steal" 90 has_event c-steal \
		'ProvisioningFailed: .*its source claim tenant-b/c-src does not exist'
	sleep 4 # more than a resync
	n="$(kc_kubectl get pv -o name | grep -c "pvc-$(ns_jp tenant-b pvc c-steal '{.metadata.uid}')" || true)"
	[ "$n" = 0 ] || fail "a PV was made for tenant-b/c-steal"
	[ "$(dirs_in_root)" = 2 ] || fail "something was made for tenant-b: $(ls -A "$ROOT_A")"
	pass "clone: tenant-b's claim naming c-src -> '$(first_event c-steal 'ProvisioningFailed: .*' 140)...'; no PV, nothing made"

	# Smaller than the source: refused.
	clone_claim default c-small c-src 1Mi
	pod p-small c-small
	wait_until "ProvisioningFailed on c-small" 90 has_event c-small 'ProvisioningFailed: .*it requests 1048576 bytes, less than its source default/c-src'
	gone pv "$(pv_of c-small)" || fail "a PV for c-small"
	[ "$(dirs_in_root)" = 2 ] || fail "something was made for c-small: $(ls -A "$ROOT_A")"
	pass "clone: a 1Mi clone of a 1Gi source -> '$(first_event c-small 'ProvisioningFailed: .*' 120)...'; nothing made"

	kc_kubectl -n tenant-b delete pod p-steal --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
	kc_kubectl -n tenant-b delete pvc c-steal --wait=false >/dev/null 2>&1 || true
	kc_kubectl delete pod p-small --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
	kc_kubectl delete pvc c-small --wait=false >/dev/null 2>&1 || true
	delete_pod p-clone
	kc_kubectl delete pvc c-clone c-src --wait=false >/dev/null
	wait_until "PVs $src_pv and $clone_pv to be deleted" 60 sh -c "! '$KC_BIN/kubectl' --kubeconfig '$KC_DIR/admin.kubeconfig' get pv $src_pv $clone_pv -o name 2>/dev/null | grep -q ."
	wait_until "the root to be clean" 30 root_clean "$ROOT_A"
	pass "clone: all deleted -> both PVs and directories gone, root clean"
}
