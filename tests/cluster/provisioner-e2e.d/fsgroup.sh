# shellcheck shell=bash
# tests/cluster/provisioner-e2e.d/fsgroup.sh — fsGroup scenarios of provisioner-e2e (issue #24;
# sourced by it; the helpers fail, pass, jp, wait_until, ... are its own).
#
#   fsgroup       this machine. A pod with securityContext runAsUser 1000, fsGroup 2000 on a
#                 provisioned hostPath claim: kubelet passes kubernetes.io/mounterArgs.FsGroup to
#                 mount (node-a's call log), the driver applies it (the volume directory has group
#                 2000 and mode 2770), uid 1000 with group 2000 writes into the pod's volume and the
#                 file gets group 2000. Then 10,000 root-owned files, a pod with fsGroup 3000 (root
#                 mismatches: walked) and another with 3000 (root matches: not walked): prints
#                 TIME fsgroup-mount-walk-10k and fsgroup-mount-matching from the call log. A static
#                 hostPath PV with the same pod security context: FsGroup reaches the driver, the
#                 directory's ownership is untouched, uid 1000 cannot write.
#   nfs-fsgroup   guest (NFS server). The same on a provisioned NFS claim (class nfs-retain):
#                 group 2000 and set-gid on the claim's directory on the server, uid 1000 with
#                 primary group 2000 writes (the guest's server ignores supplementary groups:
#                 manage-gids; see fsg_write_as).
#   lvm-fsgroup   guest (LVM). A provisioned LV: kubelet applies the fsGroup itself (flexvol/lvm
#                 reports capability fsGroup): the LV's root has group 2000 and set-gid.

FSG_STATIC="$CLUSTER_DIR/static"

# fsg_pod NAME CLAIM NODE FSGROUP [SCRIPT]: SCRIPT runs in the container on real containers
# (kc_container).
fsg_pod() {
	apply "pod $1" <<EOF2
{"apiVersion":"v1","kind":"Pod","metadata":{"name":"$1","namespace":"default"},
 "spec":{"nodeSelector":{"kubernetes.io/hostname":"$3"},"automountServiceAccountToken":false,
  "terminationGracePeriodSeconds":0,
  "securityContext":{"runAsUser":1000,"runAsGroup":1000,"fsGroup":$4},
  "containers":[{$(kc_container "$1" "${5:-}"),
   "volumeMounts":[{"name":"data","mountPath":"/data"}]}],
  "volumes":[{"name":"data","persistentVolumeClaim":{"claimName":"$2"}}]}}
EOF2
}
# fsg_voldir POD PV DRIVER: the pod's volume directory on its node.
fsg_voldir() { echo "$(kc_node_dir "$(jp pod "$1" '{.spec.nodeName}')")/root/pods/$(jp pod "$1" '{.metadata.uid}')/volumes/flexvol~$3/$2"; }
# fsg_mount_line NODE POD: the call-log line of the mount of POD's volume.
fsg_mount_line() {
	grep -F '"verb":"mount"' "$(kc_node_dir "$2")/flexvol.log" | grep -F "pods/$(jp pod "$1" '{.metadata.uid}')/" | tail -1
}
# fsg_write_as POD PV DRIVER: uid 1000, gid 1000, groups 2000/3000 write into the pod's volume (the
# container's processes, without a container: the fake runtime runs none). cd as root first:
# kubelet's pod directories above the volume are root's.
# The guest's NFS server runs rpc.mountd --manage-gids (Debian's nfs.conf): it replaces the
# client's supplementary groups with the uid's groups in the server's own user database, where
# uid 1000 has none. So on NFS the writer's *primary* group is the fsGroup (a pod with
# runAsGroup equal to its fsGroup); docs/fsgroup.md says what that means for users. FSG_GID: the
# writer's primary group (default 1000).
fsg_write_as() {
	(cd "$(fsg_voldir "$1" "$2" "$3")" && setpriv --reuid 1000 --regid "${FSG_GID:-1000}" --groups 2000,3000 -- sh -c "echo by-uid-1000 >written-by-$1") 2>/dev/null
}
fsg_ms() { grep -o '"durationMs":[0-9.]*' | cut -d: -f2; }

scenario_fsgroup() {
	local t0 pv dir line d ms_walk ms_match
	t0="$(kl_now)"
	claim c-fsg flexvol-hostpath
	fsg_pod p-fsg1 c-fsg node-a 2000 "echo uid \$(id -u) groups \$(id -G) > /data/written-in-pod-\$HOSTNAME"
	wait_until "pod p-fsg1 Running" 120 pod_running p-fsg1
	pv="$(pv_of c-fsg)"
	dir="$(jp pv "$pv" '{.spec.flexVolume.options.path}')"
	line="$(fsg_mount_line p-fsg1 node-a)"
	[[ "$line" == *'mounterArgs.FsGroup\":\"2000'* ]] || fail "kubelet did not pass FsGroup 2000 to mount: $line"
	[[ "$line" == *'fsGroup 2000 applied'* ]] || fail "the driver did not apply fsGroup 2000: $line"
	[ "$(stat -c '%g %a' "$dir")" = "2000 2770" ] || fail "$dir is $(stat -c '%g %a' "$dir"), want group 2000 mode 2770"
	fsg_write_as p-fsg1 "$pv" hostpath || fail "uid 1000 (group 2000) cannot write into the provisioned volume"
	[ "$(stat -c %g "$dir/written-by-p-fsg1")" = 2000 ] || fail "a new file has group $(stat -c %g "$dir/written-by-p-fsg1"), not the set-gid directory's 2000"
	pass "fsgroup: pod (uid 1000, fsGroup 2000) Running in $(kl_since "$t0") s; kubelet sent FsGroup 2000 to mount, $dir is group 2000 mode 2770, uid 1000 wrote into it and the file is group 2000"
	if kc_real_containers; then
		local f="$dir/written-in-pod-p-fsg1" i
		for ((i = 0; i < 200; i++)); do [ -s "$f" ] && break; sleep 0.3; done
		[ -s "$f" ] || fail "pod p-fsg1's process (uid 1000, fsGroup 2000) wrote nothing into $dir within 60 s"
		[ "$(stat -c %u:%g "$f")" = 1000:2000 ] || fail "$f is $(stat -c %u:%g "$f"), want 1000:2000 (the pod's uid, the set-gid directory's group)"
		[[ "$(cat "$f")" == "uid 1000 groups "*2000* ]] || fail "pod p-fsg1 ran as '$(cat "$f")', want uid 1000 with group 2000"
		pass "fsgroup: the pod's own process ($(cat "$f")) wrote into the provisioned volume; the file is 1000:2000"
	fi
	delete_pod p-fsg1
	# 10,000 files the pod's group does not own, then a new fsGroup: the root mismatches.
	mkdir -p "$dir/many"
	(cd "$dir/many" && seq 1 10000 | xargs touch)
	chown -R 0:0 "$dir/many"
	fsg_pod p-fsg2 c-fsg node-a 3000
	wait_until "pod p-fsg2 Running" 120 pod_running p-fsg2
	line="$(fsg_mount_line p-fsg2 node-a)"
	[[ "$line" == *'fsGroup 3000 applied'* ]] || fail "fsGroup 3000 not applied: $line"
	ms_walk="$(fsg_ms <<<"$line")"
	[ "$(stat -c %g "$dir/many/10000")" = 3000 ] || fail "$dir/many/10000 has group $(stat -c %g "$dir/many/10000")"
	fsg_pod p-fsg3 c-fsg node-a 3000
	wait_until "pod p-fsg3 Running" 120 pod_running p-fsg3
	line="$(fsg_mount_line p-fsg3 node-a)"
	[[ "$line" != *'applied'* ]] || fail "the second mount with a matching root walked again: $line"
	ms_match="$(fsg_ms <<<"$line")"
	echo "provisioner-e2e: TIME fsgroup-mount-walk-10k ${ms_walk}ms fsgroup-mount-matching ${ms_match}ms"
	pass "fsgroup: 10,000 files: the mount that walked took $ms_walk ms, the next (root matches, OnRootMismatch) $ms_match ms"
	delete_pod p-fsg2
	delete_pod p-fsg3
	kc_kubectl delete pvc c-fsg --wait=false >/dev/null

	# A static hostPath PV: FsGroup reaches the driver, which leaves the directory alone.
	mkdir -p "$FSG_STATIC/s1"
	chmod 0755 "$FSG_STATIC/s1"
	apply "pv pv-fsg-static" <<EOF2
{"apiVersion":"v1","kind":"PersistentVolume","metadata":{"name":"pv-fsg-static"},
 "spec":{"capacity":{"storage":"1Gi"},"accessModes":["ReadWriteOnce"],"persistentVolumeReclaimPolicy":"Retain",
  "storageClassName":"","flexVolume":{"driver":"flexvol/hostpath","options":{"path":"$FSG_STATIC/s1","type":"Directory"}},
  "nodeAffinity":{"required":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"kubernetes.io/hostname","operator":"In","values":["node-a"]}]}]}}}}
EOF2
	apply "pvc c-fsg-static" <<EOF2
{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"name":"c-fsg-static","namespace":"default"},
 "spec":{"accessModes":["ReadWriteOnce"],"storageClassName":"","volumeName":"pv-fsg-static","resources":{"requests":{"storage":"1Gi"}}}}
EOF2
	fsg_pod p-fsg-static c-fsg-static node-a 2000
	wait_until "pod p-fsg-static Running" 120 pod_running p-fsg-static
	line="$(fsg_mount_line p-fsg-static node-a)"
	[[ "$line" == *'mounterArgs.FsGroup\":\"2000'* ]] || fail "kubelet did not pass FsGroup to the static volume's mount: $line"
	[ "$(stat -c '%g %a' "$FSG_STATIC/s1")" = "0 755" ] || fail "the static directory changed: $(stat -c '%g %a' "$FSG_STATIC/s1")"
	! fsg_write_as p-fsg-static pv-fsg-static hostpath || fail "uid 1000 could write into the static root-owned 0755 directory"
	pass "fsgroup: static hostPath PV with the same pod: FsGroup 2000 reached mount, $FSG_STATIC/s1 stays 0:0 0755, uid 1000 cannot write ($(kl_since "$t0") s in all)"
	delete_pod p-fsg-static
	kc_kubectl delete pvc c-fsg-static --wait=false >/dev/null
	kc_kubectl delete pv pv-fsg-static --wait=false >/dev/null
}

scenario_nfs_fsgroup() {
	local t0 pv dir line
	nfs_setup
	t0="$(kl_now)"
	nfs_claim c-nfs-fsg nfs-retain
	fsg_pod p-nfs-fsg c-nfs-fsg node-a 2000
	wait_until "claim c-nfs-fsg Bound" 60 bound c-nfs-fsg
	wait_until "pod p-nfs-fsg Running" 180 pod_running p-nfs-fsg
	pv="$(pv_of c-nfs-fsg)"
	line="$(fsg_mount_line p-nfs-fsg node-a)"
	[[ "$line" == *'fsGroup 2000 applied'* ]] || fail "the driver did not apply fsGroup 2000 on NFS: $line"
	dir="$(jp pv "$pv" '{.spec.flexVolume.options.share}')" # the server is this guest
	[ "$(stat -c %g "$dir")" = 2000 ] && [ "$(($(stat -c '0%a' "$dir") & 02070))" = $((02070)) ] ||
		fail "$dir on the server is $(stat -c '%g %a' "$dir"), want group 2000, set-gid, group rwx"
	FSG_GID=2000 fsg_write_as p-nfs-fsg "$pv" nfs || fail "uid 1000 (primary group 2000) cannot write into the provisioned NFS volume"
	[ "$(stat -c %g "$dir/written-by-p-nfs-fsg")" = 2000 ] || fail "the new file on the server has group $(stat -c %g "$dir/written-by-p-nfs-fsg")"
	echo "provisioner-e2e: TIME nfs-fsgroup-pvc-to-running $(kl_since "$t0")s mount $(fsg_ms <<<"$line")ms"
	pass "nfs-fsgroup: provisioned NFS claim, pod (uid 1000, fsGroup 2000): $dir on the server is $(stat -c '%g %a' "$dir"); uid 1000 wrote and the file is group 2000 ($(kl_since "$t0") s)"
	delete_pod p-nfs-fsg
	kc_kubectl delete pvc c-nfs-fsg --wait=false >/dev/null
}

scenario_lvm_fsgroup() {
	local t0 pv d line
	lvmprov_setup
	t0="$(kl_now)"
	lvclaim c-lvm-fsg flexvol-lvm 64Mi
	fsg_pod p-lvm-fsg c-lvm-fsg node-a 2000
	wait_until "pod p-lvm-fsg Running" 180 pod_running p-lvm-fsg
	pv="$(pv_of c-lvm-fsg)"
	line="$(fsg_mount_line p-lvm-fsg node-a)"
	[[ "$line" == *'mounterArgs.FsGroup\":\"2000'* ]] || fail "kubelet did not pass FsGroup 2000 to the LVM mount: $line"
	d="$(lvm_voldir p-lvm-fsg "$pv")"
	[ "$(stat -c %g "$d")" = 2000 ] && [ "$(($(stat -c '0%a' "$d") & 02070))" = $((02070)) ] ||
		fail "the LV's root is $(stat -c '%g %a' "$d"), want group 2000, set-gid, group rwx (kubelet's SetVolumeOwnership)"
	fsg_write_as p-lvm-fsg "$pv" lvm || fail "uid 1000 (group 2000) cannot write into the provisioned LV"
	[ "$(stat -c %g "$d/written-by-p-lvm-fsg")" = 2000 ] || fail "the new file on the LV has group $(stat -c %g "$d/written-by-p-lvm-fsg")"
	echo "provisioner-e2e: TIME lvm-fsgroup-pvc-to-running $(kl_since "$t0")s"
	pass "lvm-fsgroup: provisioned LV, pod (uid 1000, fsGroup 2000): kubelet applied the group (root $(stat -c '%g %a' "$d")); uid 1000 wrote and the file is group 2000 ($(kl_since "$t0") s)"
	delete_pod p-lvm-fsg
	kc_kubectl delete pvc c-lvm-fsg --wait=false >/dev/null
}
