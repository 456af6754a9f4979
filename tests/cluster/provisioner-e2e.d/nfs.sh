# shellcheck shell=bash
# tests/cluster/provisioner-e2e.d/nfs.sh — NFS-subdirectory scenarios of provisioner-e2e (sourced
# by it; the helpers fail, pass, jp, wait_until, ... are its own). Guest only: they need the
# guest's kernel NFS server (127.0.0.1:/srv/nfs):
#   tests/vm/run --nfs-server --mem 4096 --timeout 1800 tests/cluster/provisioner-e2e nfs nfs-ondelete nfs-dead nfs-kill
#
#   nfs           two claims of a `delete` class with a nested pathPattern -> two subdirectories of
#                 /srv/nfs/prov with markers naming their PVs; a pod on each node shares one claim
#                 (ReadWriteMany) and each sees the other's write; claims deleted -> exactly their
#                 directories go (the pattern's parent stays); inline pods of a claim's directory
#                 and of the export root get FailedMount (#20). Prints TIME nfs-pvc-to-bound and
#                 nfs-pvc-to-running
#   nfs-ondelete  `archive` (the default, nested pattern): the directory moves to
#                 /srv/nfs/prov/archived-<pv>-<time> with its data; `retain`: it stays; both PVs go
#   nfs-dead      a class whose server is 192.0.2.1 (no route): ProvisioningFailed "unreachable"
#                 within a bounded time (printed as TIME nfs-dead-server-event), no PV, no mount left
#   nfs-kill      kill -9 after the private mkdir (before the record and the PV; the private mount left behind),
#                 then after the tombstone rename of a delete: restart -> one PV, one marked
#                 directory, made by the other instance; then PV and directory gone, no mount left
#
# Every node's provisioner may provision and delete NFS volumes (not node-local): both run.

NFS_EXPORT=/srv/nfs/prov

nfs_check() {
	[ -d /srv/nfs ] && [ -e /proc/fs/nfsd/versions ] ||
		fail "no NFS server here: NFS scenarios run in the guest (tests/vm/run --nfs-server)"
}
# nfs_class NAME PARAMETER_MEMBERS [SERVER [SHARE]] (JSON members after server and share)
nfs_class() {
	apply "storageclass $1" <<EOF
{"apiVersion":"storage.k8s.io/v1","kind":"StorageClass","metadata":{"name":"$1"},
 "provisioner":"flexvol/nfs","reclaimPolicy":"Delete","volumeBindingMode":"Immediate",
 "parameters":{"server":"${3:-127.0.0.1}","share":"${4:-$NFS_EXPORT}"${2:+,$2}}}
EOF
}
nfs_setup() {
	nfs_check
	mkdir -p "$NFS_EXPORT"
	nfs_class nfs-delete '"onDelete":"delete","pathPattern":"{{ .PVC.Namespace }}/{{ .PVC.Name }}","uid":"1000","gid":"1000","mode":"0770"'
	nfs_class nfs-archive '"pathPattern":"{{ .PVC.Namespace }}/{{ .PVC.Name }}"'
	nfs_class nfs-retain '"onDelete":"retain"'
	nfs_class nfs-dead '' 192.0.2.1 /srv/nfs
}
# nfs_claim NAME CLASS
nfs_claim() {
	apply "pvc $1" <<EOF
{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"name":"$1","namespace":"default"},
 "spec":{"accessModes":["ReadWriteMany"],"storageClassName":"$2","resources":{"requests":{"storage":"64Mi"}}}}
EOF
}
# nfs_pod NAME CLAIM NODE (required, not preferred: one pod per node)
nfs_pod() {
	apply "pod $1" <<EOF
{"apiVersion":"v1","kind":"Pod","metadata":{"name":"$1","namespace":"default"},
 "spec":{"nodeSelector":{"kubernetes.io/hostname":"$3"},"automountServiceAccountToken":false,
  "terminationGracePeriodSeconds":0,
  "containers":[{$(kc_container "$1"),
   "volumeMounts":[{"name":"data","mountPath":"/data"}]}],
  "volumes":[{"name":"data","persistentVolumeClaim":{"claimName":"$2"}}]}}
EOF
}
# nfs_inline_pod NAME NODE VOLUME_NAME SHARE: a pod author's inline flexVolume of 127.0.0.1:SHARE,
# its volume named as the author likes (a claim's PV name, to look like the PV).
nfs_inline_pod() {
	apply "pod $1" <<EOF
{"apiVersion":"v1","kind":"Pod","metadata":{"name":"$1","namespace":"default"},
 "spec":{"nodeSelector":{"kubernetes.io/hostname":"$2"},"automountServiceAccountToken":false,
  "terminationGracePeriodSeconds":0,
  "containers":[{$(kc_container "$1"),
   "volumeMounts":[{"name":"$3","mountPath":"/data"}]}],
  "volumes":[{"name":"$3","flexVolume":{"driver":"flexvol/nfs","options":{"server":"127.0.0.1","share":"$4"}}}]}}
EOF
}
bound() { [ "$(jp pvc "$1" '{.status.phase}')" = Bound ]; }
nfs_label() { jp node "$1" '{.metadata.labels.flexvol/nfs}'; }
# Provisioner mounts of the export left under the nodes' run dirs.
nfs_private_mounts() { grep -c " $KC_DIR/nodes/[^/]*/run/provisioner-nfs/" /proc/self/mountinfo || true; }
marker_names() { grep -q "\"volume\":\"$2\"" "$1/.flexvol-provisioned" 2>/dev/null; }

scenario_nfs() {
	local t0 secs pv1 pv2 d1 d2 n p d uid dirs=()
	nfs_setup
	# Both serve NFS: each provisioner says so (it advises the operator to label its node; it never
	# labels a Node itself).
	for n in node-a node-b; do
		wait_until "$n's provisioner to serve flexvol/nfs" 30 grep -q "node $n serves flexvol/nfs but is not labelled" "$KC_DIR/logs/provisioner-$n.log"
	done
	t0="$(kl_now)"
	nfs_claim c-nfs-1 nfs-delete
	nfs_pod p-nfs-a c-nfs-1 node-a
	nfs_pod p-nfs-b c-nfs-1 node-b
	wait_until "claim c-nfs-1 Bound" 60 bound c-nfs-1
	echo "provisioner-e2e: TIME nfs-pvc-to-bound $(kl_since "$t0")s (claim created $(jp pvc c-nfs-1 '{.metadata.creationTimestamp}'), PV created $(jp pv "$(pv_of c-nfs-1)" '{.metadata.creationTimestamp}'))"
	grep -h "$(pv_of c-nfs-1)" "$KC_DIR"/logs/provisioner-*.log | head -4 || true
	wait_until "pod p-nfs-a Running" 180 pod_running p-nfs-a
	secs="$(kl_since "$t0")"
	wait_until "pod p-nfs-b Running" 120 pod_running p-nfs-b
	echo "provisioner-e2e: TIME nfs-pvc-to-running ${secs}s (both pods: $(kl_since "$t0")s)"
	nfs_claim c-nfs-2 nfs-delete
	wait_until "claim c-nfs-2 Bound" 60 bound c-nfs-2
	pv1="$(pv_of c-nfs-1)"
	pv2="$(pv_of c-nfs-2)"
	d1="$NFS_EXPORT/default/c-nfs-1"
	d2="$NFS_EXPORT/default/c-nfs-2"
	marker_names "$d1" "$pv1" || fail "no marker for $pv1 in $d1: $(ls -la "$d1" 2>&1)"
	marker_names "$d2" "$pv2" || fail "no marker for $pv2 in $d2"
	[ "$(stat -c %u:%g:%a "$d1")" = 1000:1000:770 ] || fail "$d1 is $(stat -c %u:%g:%a "$d1"), the class says 1000:1000 0770"
	[ "$(jp pv "$pv1" '{.spec.flexVolume.driver}')" = flexvol/nfs ] || fail "PV $pv1 driver $(jp pv "$pv1" '{.spec.flexVolume.driver}')"
	[ "$(jp pv "$pv1" '{.spec.flexVolume.options.share}')" = "$d1" ] || fail "PV $pv1 share $(jp pv "$pv1" '{.spec.flexVolume.options.share}')"
	[ "$(jp pv "$pv1" '{.metadata.annotations.flexvol/size-enforced}')" = false ] || fail "PV $pv1 does not say its size is not enforced"
	[ -z "$(jp pv "$pv1" '{.spec.nodeAffinity}')" ] || fail "PV $pv1 is pinned to a node: $(jp pv "$pv1" '{.spec.nodeAffinity}')"
	pass "nfs: two claims -> two marked subdirectories $d1 and $d2 (1000:1000 0770), PVs flexvol/nfs with those shares, not pinned"
	for p in p-nfs-a p-nfs-b; do
		n="$(jp pod "$p" '{.spec.nodeName}')"
		uid="$(jp pod "$p" '{.metadata.uid}')"
		d="$(kc_node_dir "$n")/root/pods/$uid/volumes/flexvol~nfs/$pv1"
		[ "$(findmnt -n -o SOURCE --mountpoint "$d" | tail -n1)" = "127.0.0.1:$d1" ] || fail "$d is not a mount of 127.0.0.1:$d1"
		echo "from $n" >"$d/from-$n"
		dirs+=("$d")
	done
	sync
	for d in "${dirs[@]}"; do
		for n in node-a node-b; do
			[ "$(cat "$d/from-$n" 2>/dev/null)" = "from $n" ] || fail "$d does not see the write from $n"
		done
	done
	[ "$(cat "$d1/from-node-a")$(cat "$d1/from-node-b")" = "from node-afrom node-b" ] || fail "the writes are not in $d1 on the server"
	[ "$(nfs_private_mounts)" = 0 ] || fail "provisioner mounts left: $(grep provisioner-nfs /proc/self/mountinfo)"
	pass "nfs: pods on node-a and node-b share claim c-nfs-1 (ReadWriteMany) and see each other's writes; no provisioner mount left"
	# #20: inline volumes of the claim's directory (named like its PV) and of the export root
	# get FailedMount, nothing mounted; the claim's own pods (above) carry the PV's token.
	nfs_inline_pod p-nfs-steal node-a "$pv1" "$d1"
	nfs_inline_pod p-nfs-root node-b data "$NFS_EXPORT"
	for p in p-nfs-steal p-nfs-root; do
		wait_until "FailedMount of $p" 120 has_event "$p" 'FailedMount: .*served only to the PV'
		n="$(jp pod "$p" '{.spec.nodeName}')"
		uid="$(jp pod "$p" '{.metadata.uid}')"
		d="$(kc_node_dir "$n")/root/pods/$uid/volumes/flexvol~nfs"
		! grep -q " $d/" /proc/self/mountinfo || fail "$p got a mount: $(grep " $d/" /proc/self/mountinfo)"
		! pod_running "$p" || fail "$p is Running"
	done
	pass "nfs: inline volumes of $d1 (named $pv1) and of the export root $NFS_EXPORT -> FailedMount '$(first_event p-nfs-steal 'FailedMount: .*' 160)...', nothing mounted"
	delete_pod p-nfs-steal
	delete_pod p-nfs-root
	delete_pod p-nfs-a
	delete_pod p-nfs-b
	kc_kubectl delete pvc c-nfs-1 c-nfs-2 --wait=false >/dev/null
	wait_until "PV $pv1 deleted" 60 gone pv "$pv1"
	wait_until "PV $pv2 deleted" 60 gone pv "$pv2"
	[ ! -e "$d1" ] && [ ! -e "$d2" ] || fail "directories left: $(ls -A "$NFS_EXPORT/default")"
	[ -d "$NFS_EXPORT/default" ] || fail "the pattern's parent $NFS_EXPORT/default was removed"
	[ -z "$(root_contents "$NFS_EXPORT" | grep -vx default)" ] || fail "left in the export: $(root_contents "$NFS_EXPORT")"
	pass "nfs: claims deleted (onDelete delete) -> PVs and exactly their directories gone, $NFS_EXPORT/default kept"
	rmdir "$NFS_EXPORT/default"
}

scenario_nfs_ondelete() {
	local pva pvr da dr arch
	nfs_setup
	nfs_claim c-nfs-arch nfs-archive
	nfs_claim c-nfs-keep nfs-retain
	wait_until "claim c-nfs-arch Bound" 60 bound c-nfs-arch
	wait_until "claim c-nfs-keep Bound" 60 bound c-nfs-keep
	pva="$(pv_of c-nfs-arch)"
	pvr="$(pv_of c-nfs-keep)"
	da="$NFS_EXPORT/default/c-nfs-arch"
	dr="$NFS_EXPORT/${pvr}_default_c-nfs-keep"
	[ "$(jp pv "$pva" '{.metadata.annotations.flexvol/nfs-on-delete}')" = archive ] || fail "PV $pva is not onDelete archive (the default)"
	marker_names "$da" "$pva" || fail "no marker for $pva in $da"
	marker_names "$dr" "$pvr" || fail "no marker for $pvr in $dr"
	echo archived >"$da/data"
	echo kept >"$dr/data"
	kc_kubectl delete pvc c-nfs-arch c-nfs-keep --wait=false >/dev/null
	wait_until "PV $pva deleted" 60 gone pv "$pva"
	wait_until "PV $pvr deleted" 60 gone pv "$pvr"
	[ ! -e "$da" ] || fail "$da is still there after its archive"
	arch="$(find "$NFS_EXPORT" -maxdepth 1 -name "archived-$pva-*")"
	[ "$(echo "$arch" | grep -c .)" = 1 ] || fail "archives of $pva in $NFS_EXPORT: '$arch'"
	[ "$(cat "$arch/data")" = archived ] || fail "the archive $arch lost the data"
	marker_names "$arch" "$pva" || fail "the archive $arch lost its marker"
	[ -d "$NFS_EXPORT/default" ] || fail "the pattern's parent was archived with it"
	[ "$(cat "$dr/data")" = kept ] || fail "onDelete retain did not keep $dr"
	pass "nfs-ondelete: archive -> $(basename "$arch") in the export root with the data (nested pattern: exactly default/c-nfs-arch moved); retain -> $dr kept; both PVs gone"
	rm -rf "$arch" "$dr" "$NFS_EXPORT/default"
}

scenario_nfs_dead() {
	local t0 secs
	nfs_setup
	t0="$(kl_now)"
	nfs_claim c-nfs-dead nfs-dead
	wait_until "ProvisioningFailed on c-nfs-dead" 90 has_event c-nfs-dead 'ProvisioningFailed: .*192\.0\.2\.1 is unreachable'
	secs="$(kl_since "$t0")"
	echo "provisioner-e2e: TIME nfs-dead-server-event ${secs}s"
	grep -h "c-nfs-dead" "$KC_DIR"/logs/provisioner-*.log | head -4 || true
	# The attempt itself is bounded by the probe (5 s; no route here fails at once); the rest is
	# the control plane on the guest's one CPU (claim annotated by the PV controller, watches,
	# the event), which takes ~20-30 s there for a working class too (TIME nfs-pvc-to-bound).
	awk -v s="$secs" 'BEGIN { exit !(s < 60) }' || fail "the failure took ${secs}s (bound: 60 s)"
	[ -z "$(jp pvc c-nfs-dead '{.spec.volumeName}')" ] || fail "c-nfs-dead got a PV"
	[ "$(pvs_for_claim "$(claim_uid c-nfs-dead)")" = 0 ] || fail "a PV exists for c-nfs-dead"
	[ "$(nfs_private_mounts)" = 0 ] || fail "provisioner mounts left: $(grep provisioner-nfs /proc/self/mountinfo)"
	pass "nfs-dead: ProvisioningFailed '$(first_event c-nfs-dead 'ProvisioningFailed: .*unreachable' 140)...' after ${secs}s; no PV, no mount left"
	kc_kubectl delete pvc c-nfs-dead --wait=false >/dev/null
}

scenario_nfs_kill() {
	local pid uid pv dir tomb
	nfs_setup
	# One instance at a time, so the kill hits the instance that does the work.
	stop_provisioner node-b
	stop_provisioner node-a
	start_provisioner node-a FLEXVOL_TEST_KILL_AT=provisioner-nfs-after-mkdir
	pid="$(kc_pid_of provisioner-node-a)"
	nfs_claim c-nfs-kill nfs-delete
	wait_killed node-a "$pid"
	uid="$(claim_uid c-nfs-kill)"
	pv="pvc-$uid"
	dir="$NFS_EXPORT/default/c-nfs-kill"
	# The directory is made under a private name first (never at its own name until it is set up
	# and recorded), so the kill leaves only that.
	[ ! -e "$dir" ] || fail "after the kill: $dir exists, although it is renamed into place last"
	ls -d "$NFS_EXPORT/default/.flexvol-new-$pv@node-a."* >/dev/null 2>&1 || fail "after the kill: no private directory of node-a in $NFS_EXPORT/default: $(ls -A "$NFS_EXPORT/default")"
	gone pv "$pv" || fail "PV $pv exists although the kill came before it"
	[ "$(nfs_private_mounts)" = 1 ] || fail "the kill did not leave the provisioner's mount (test premise): $(nfs_private_mounts)"
	# The other instance finishes the job with a directory of its own (node-a's leftover is never
	# adopted; it is removed once it is a minute old).
	start_provisioner node-b
	wait_until "claim c-nfs-kill Bound" 60 bound c-nfs-kill
	marker_names "$dir" "$pv" || fail "no marker for $pv in $dir"
	grep -q '"node":"node-b"' "$dir/.flexvol-provisioned" || fail "the marker was not written by node-b: $(cat "$dir/.flexvol-provisioned")"
	[ "$(stat -c %u:%g:%a "$dir")" = 1000:1000:770 ] || fail "$dir is $(stat -c %u:%g:%a "$dir"), the class says 1000:1000 0770"
	[ "$(pvs_for_claim "$uid")" = 1 ] || fail "$(pvs_for_claim "$uid") PVs for claim c-nfs-kill"
	# node-a's restart removes the mount the kill left.
	start_provisioner node-a
	wait_until "node-a's leftover mount to go" 30 sh -c "[ \"\$(grep -c ' $KC_DIR/nodes/[^/]*/run/provisioner-nfs/' /proc/self/mountinfo)\" = 0 ]"
	pass "nfs-kill: kill -9 after the private mkdir (mount left): node-b made the directory (marker, record, ownership), one PV; node-a's restart unmounted its leftover"

	stop_provisioner node-b
	stop_provisioner node-a
	start_provisioner node-a FLEXVOL_TEST_KILL_AT=provisioner-delete-after-rename
	pid="$(kc_pid_of provisioner-node-a)"
	kc_kubectl delete pvc c-nfs-kill --wait=false >/dev/null
	wait_killed node-a "$pid"
	tomb="$NFS_EXPORT/.flexvol-deleting-$pv"
	[ ! -e "$dir" ] || fail "$dir still there after the rename"
	[ -d "$tomb" ] || fail "no tombstone $tomb after the kill: $(ls -A "$NFS_EXPORT")"
	still_there pv "$pv" || fail "PV $pv deleted before its directory was"
	start_provisioner node-b
	start_provisioner node-a
	wait_until "PV $pv deleted after the restart" 60 gone pv "$pv"
	[ ! -e "$tomb" ] || fail "the tombstone $tomb is left"
	wait_until "no provisioner mount left" 30 sh -c "[ \"\$(grep -c ' $KC_DIR/nodes/[^/]*/run/provisioner-nfs/' /proc/self/mountinfo)\" = 0 ]"
	pass "nfs-kill: kill -9 after the tombstone rename of a delete, restart -> PV gone, tombstone finished, no mount left"
	# The loser of the first kill, node-a, left its EMPTY private directory beside the volume: the
	# delete (here the restart that finishes it) removes every instance's empty leftover of the PV.
	if ls -d "$NFS_EXPORT/default/.flexvol-new-$pv@"* >/dev/null 2>&1; then
		fail "private directories of $pv left after its delete: $(ls -A "$NFS_EXPORT/default")"
	fi
	pass "nfs-kill: no private directory of $pv left after the delete"
	rmdir "$NFS_EXPORT/default"
}
