# shellcheck shell=bash
# tests/cluster/provisioner-e2e.d/clone-guest.sh — clones of LVM and NFS claims (issue #24, 4),
# sourced by provisioner-e2e (its helpers, lvm.sh's and nfs.sh's). Guest only (real LVM, the
# guest's NFS server):
#   tests/vm/run --nfs-server --mem 4096 --timeout 900 --env PROVISIONER_HOSTNS=1 \
#     tests/cluster/provisioner-e2e lvm-clone nfs-clone
#
#   lvm-clone  thin: a 64Mi claim of a thin class written through its pod (and synced); a 96Mi
#              clone made while that pod runs (a thin snapshot: crash-consistent, allowed in use)
#              -> its pod Running on node-a with the data, the filesystem grown to the LV on
#              first mount (no flexvol.grow-fs tag left), the clone tagged for its own PV only;
#              the source deleted first -> its LV gone, the clone still reads its data.
#              thick: a clone of a mounted thick LV waits with an event saying why; the source's
#              pod deleted -> block copy, the clone's pod reads the data. All deleted -> no LV
#              of ours left in the VG.
#   nfs-clone  a claim of nfs-delete with files written on the export (a 20 MB file, a
#              symlink); a writer on the server appending line N to `first`, then to
#              `sub/second` (N = 1, 2, ...) while the clone is asked for -> either the copy is
#              not kept ("changed while it was copied") or the kept copy is one moment of the
#              source (first = 1..k, second = 1..k or 1..k-1, whole lines; the 20 MB file is
#              copied between the two); whichever happens, the copy kept is checked so; writer
#              stopped -> the clone's pod Running on the other node with the data, the symlink
#              a symlink; a claim of another class naming the source -> refused; all deleted ->
#              both directories gone.

# clone_of NAME CLASS SOURCE SIZE [MODE]
clone_of() {
	apply "pvc $1" <<EOF
{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"name":"$1","namespace":"default"},
 "spec":{"accessModes":["${5:-ReadWriteOnce}"],"storageClassName":"$2",
  "dataSource":{"kind":"PersistentVolumeClaim","name":"$3"},
  "resources":{"requests":{"storage":"$4"}}}}
EOF
}
lv_has_tag() { tr ',' '\n' <<<"$(lv_tags "$1")" | grep -qx "$2"; }
ours_in_vg() { lvm lvs --noheadings -o lv_tags "$LVP_VG" 2>/dev/null | tr ',' '\n' | tr -d ' ' | grep -c '^flexvol.created$' || true; }

scenario_lvm_clone() {
	lvmprov_setup
	local t0 secs spv cpv d d2 size ev tpv kpv
	lvm lvcreate -y -L 256M -T "$LVP_VG/pool" >/dev/null || fail "lvcreate thin pool $LVP_VG/pool"
	lvclass flexvol-lvm-thin Delete "{\"volumegroup\":\"$LVP_VG\",\"thinpool\":\"pool\"}"

	# Thin: snapshot of a source in use, larger than the source.
	t0="$(kl_now)"
	lvclaim c-thin flexvol-lvm-thin 64Mi
	pod p-thin c-thin node-a
	wait_until "pod p-thin Running" 120 pod_running p-thin
	spv="$(pv_of c-thin)"
	d="$(lvm_voldir p-thin "$spv")"
	echo "written through p-thin" >"$d/proof"
	head -c 5000000 /dev/urandom >"$d/blob"
	sync
	clone_of c-thin-clone flexvol-lvm-thin c-thin 96Mi
	pod p-thin-clone c-thin-clone node-a
	wait_until "pod p-thin-clone Running" 120 pod_running p-thin-clone
	secs="$(kl_since "$t0")"
	cpv="$(pv_of c-thin-clone)"
	d2="$(lvm_voldir p-thin-clone "$cpv")"
	[ "$(cat "$d2/proof")" = "written through p-thin" ] || fail "the thin clone lacks the source's data"
	cmp -s "$d/blob" "$d2/blob" || fail "the thin clone's blob differs"
	if ! lv_has_tag "$cpv" "flexvol.pv.$cpv" || ! lv_has_tag "$cpv" flexvol.created; then
		fail "clone LV tags: $(lv_tags "$cpv")"
	fi
	! lv_has_tag "$cpv" "flexvol.pv.$spv" || fail "the clone carries its source's tag: $(lv_tags "$cpv")"
	! lv_has_tag "$cpv" flexvol.grow-fs || fail "flexvol.grow-fs left on the clone after its mount: $(lv_tags "$cpv")"
	[ "$(lvm lvs --noheadings -o origin "$LVP_VG/$cpv" | tr -d ' ')" = "$spv" ] || fail "$cpv is not a thin snapshot of $spv: $(lvm lvs "$LVP_VG")"
	size="$(df -m --output=size "$d2" | tail -n1 | tr -d ' ')"
	[ "$size" -gt 80 ] || fail "the clone's filesystem is $size MiB: not grown to the 96 MiB LV"
	ev="$(jp pv "$cpv" '{.metadata.annotations.flexvol/cloned-from}')"
	[ "$ev" = "$spv (thin snapshot)" ] || fail "cloned-from '$ev'"
	echo "the clone's own" >"$d2/proof"
	[ "$(cat "$d/proof")" = "written through p-thin" ] || fail "writing the clone changed the source"
	pass "lvm-clone: thin snapshot of $spv taken while p-thin ran -> p-thin-clone Running ${secs} s after the source claim; data equal, filesystem ${size} MiB (grown on first mount), tags its own, writes independent"
	echo "provisioner-e2e: TIME lvm-clone-thin ${secs}s"

	# The source goes first; the snapshot is an independent thin LV.
	delete_pod p-thin
	kc_kubectl delete pvc c-thin --wait=false >/dev/null
	wait_until "PV $spv to be deleted" 90 gone pv "$spv"
	lv_gone "$spv" || fail "LV $spv still exists after its PV was deleted"
	[ "$(cat "$d2/proof")" = "the clone's own" ] || fail "the clone lost its data when its source went"
	pass "lvm-clone: thin source deleted first -> its LV gone, the clone still reads its data"
	delete_pod p-thin-clone
	kc_kubectl delete pvc c-thin-clone --wait=false >/dev/null
	wait_until "PV $cpv to be deleted" 90 gone pv "$cpv"
	lv_gone "$cpv" || fail "LV $cpv still exists"

	# Thick: a block copy, only once nothing uses the source.
	t0="$(kl_now)"
	lvclaim c-thick flexvol-lvm 64Mi
	pod p-thick c-thick node-a
	wait_until "pod p-thick Running" 120 pod_running p-thick
	tpv="$(pv_of c-thick)"
	d="$(lvm_voldir p-thick "$tpv")"
	echo "written through p-thick" >"$d/proof"
	clone_of c-thick-clone flexvol-lvm c-thick 64Mi
	pod p-thick-clone c-thick-clone node-a
	kpv="$(pv_of c-thick-clone)"
	wait_until "c-thick-clone to wait for its mounted source" 60 has_event c-thick-clone \
		"ProvisioningFailed: .*waiting: its source volume $tpv is mounted on this node"
	gone pv "$kpv" || fail "a PV for c-thick-clone while its source is mounted"
	lv_gone "$kpv" || fail "an LV for c-thick-clone while its source is mounted"
	pass "lvm-clone: thick source mounted -> '$(first_event c-thick-clone 'waiting: its source.*' 150)...'; no PV, no LV"
	delete_pod p-thick
	wait_until "pod p-thick-clone Running" 120 pod_running p-thick-clone
	secs="$(kl_since "$t0")"
	d2="$(lvm_voldir p-thick-clone "$kpv")"
	[ "$(cat "$d2/proof")" = "written through p-thick" ] || fail "the thick clone lacks the source's data"
	lv_has_tag "$kpv" "flexvol.pv.$kpv" || fail "thick clone LV tags: $(lv_tags "$kpv")"
	ev="$(jp pv "$kpv" '{.metadata.annotations.flexvol/cloned-from}')"
	[ "$ev" = "$tpv (block copy)" ] || fail "cloned-from '$ev'"
	pass "lvm-clone: source released -> block copy; p-thick-clone Running ${secs} s after the source claim, with the data"
	echo "provisioner-e2e: TIME lvm-clone-thick ${secs}s"
	delete_pod p-thick-clone
	kc_kubectl delete pvc c-thick c-thick-clone --wait=false >/dev/null
	wait_until "PVs $tpv and $kpv to be deleted" 90 sh -c "! '$KC_BIN/kubectl' --kubeconfig '$KC_DIR/admin.kubeconfig' get pv $tpv $kpv -o name 2>/dev/null | grep -q ."
	[ "$(ours_in_vg)" = 0 ] || fail "LVs of ours left in $LVP_VG: $(lvm lvs "$LVP_VG")"
	lvm lvremove -y "$LVP_VG/pool" >/dev/null || fail "lvremove the thin pool"
	pass "lvm-clone: all deleted -> no LV of ours left in $LVP_VG"
}

scenario_nfs_clone() {
	nfs_setup
	local t0 secs spv cpv s c wpid n ev
	t0="$(kl_now)"
	nfs_claim c-nsrc nfs-delete
	wait_until "claim c-nsrc Bound" 60 bound c-nsrc
	spv="$(pv_of c-nsrc)"
	s="$NFS_EXPORT/default/c-nsrc"
	echo "written on the server" >"$s/proof"
	mkdir -p "$s/sub"
	head -c 20000000 /dev/urandom >"$s/sub/blob"
	ln -s /etc/hostname "$s/sub/out"
	chown -R 1000:1000 "$s/proof" "$s/sub"
	# A writer on the server's side (bash builtins: no fork per write, faster than a copy)
	# appends line N to first, then line N to sub/second, N = 1, 2, ...: at any one moment the
	# source holds first = 1..k and second = 1..k or 1..k-1. A copy takes first, then the 20 MB
	# sub/blob, then sub/second (name order), so a copy torn by the writer has second ahead of
	# first (or further behind).
	# It stops when killed below or, should a check fail first, when this script ($$) has exited.
	(
		n=0
		while kill -0 "$$" 2>/dev/null; do
			n=$((n + 1))
			echo "$n" >>"$s/first"
			echo "$n" >>"$s/sub/second"
		done
	) &
	wpid=$!
	sleep 1
	clone_of c-nclone nfs-delete c-nsrc 64Mi ReadWriteMany
	cpv="$(pv_of c-nclone)"
	# Either outcome is sound: the provisioner sees the source change during a copy and keeps
	# nothing (event), or the copy is made in a window in which the writer did not run (NFSv4.2
	# copies server-side in milliseconds; the provisioner's read delegation holds the server's
	# local writer off until it is returned) and is one moment of the source: checked below,
	# whichever copy was kept, whether or not the writer still ran when it was made.
	nclone_settled() { lookup pv "$cpv" || has_event c-nclone "ProvisioningFailed: .*waiting: its source volume $spv changed while it was copied"; }
	wait_until "c-nclone to wait for its changing source, or be copied" 60 nclone_settled
	kill "$wpid"
	wait "$wpid" 2>/dev/null || true
	if has_event c-nclone "ProvisioningFailed: .*changed while it was copied"; then
		pass "nfs-clone: a writer on the source -> '$(first_event c-nclone 'ProvisioningFailed: .*' 170)...'"
	else
		echo "nfs-clone: note: the first copy saw no change of the source (made while the writer was held off)"
	fi
	nfs_pod p-nclone c-nclone node-b
	wait_until "claim c-nclone Bound" 120 bound c-nclone
	wait_until "pod p-nclone Running" 120 pod_running p-nclone
	secs="$(kl_since "$t0")"
	c="$NFS_EXPORT/default/c-nclone"
	[ "$(cat "$c/proof")" = "written on the server" ] || fail "the NFS clone lacks the proof file"
	cmp -s "$s/sub/blob" "$c/sub/blob" || fail "the NFS clone's blob differs"
	# One moment of the source: first = 1..k, second = 1..k or 1..k-1, whole lines.
	local k j total
	k="$(wc -l <"$c/first")"
	j="$(wc -l <"$c/sub/second")"
	total="$(wc -l <"$s/first")"
	seq 1 "$k" | cmp -s - "$c/first" || fail "the clone's first is not lines 1..$k (a torn copy): $(tail -c 40 "$c/first" | tr '\n' ' ')"
	seq 1 "$j" | cmp -s - "$c/sub/second" || fail "the clone's sub/second is not lines 1..$j (a torn copy): $(tail -c 40 "$c/sub/second" | tr '\n' ' ')"
	[ "$j" -le "$k" ] && [ "$j" -ge $((k - 1)) ] || fail "the clone holds first 1..$k but sub/second 1..$j: not one moment of the source (a torn copy kept)"
	[ "$k" -ge 1 ] && [ "$k" -le "$total" ] || fail "the clone's first has $k lines, the source's $total"
	pass "nfs-clone: the kept copy is one moment of the source: first 1..$k, sub/second 1..$j (the writer made $total in all; $([ "$k" -lt "$total" ] && echo 'copied while it still ran' || echo 'copied after it stopped'))"
	[ -L "$c/sub/out" ] && [ "$(readlink "$c/sub/out")" = /etc/hostname ] || fail "the symlink was not copied as a symlink: $(ls -l "$c/sub")"
	[ "$(stat -c %u:%g "$c/sub/blob")" = 1000:1000 ] || fail "owner not kept: $(stat -c %u:%g "$c/sub/blob")"
	marker_names "$c" "$cpv" || fail "the clone's marker is not its own"
	ev="$(jp pv "$cpv" '{.metadata.annotations.flexvol/cloned-from}')"
	[[ "$ev" == "$spv ("* ]] || fail "cloned-from '$ev'"
	n="$(kc_node_dir node-b)/root/pods/$(jp pod p-nclone '{.metadata.uid}')/volumes/flexvol~nfs/$cpv"
	[ "$(cat "$n/proof")" = "written on the server" ] || fail "p-nclone does not read the data"
	pass "nfs-clone: writer stopped -> copied; p-nclone Running on node-b ${secs} s after the source claim, data, owner and symlink kept; cloned-from '$ev'"
	echo "provisioner-e2e: TIME nfs-clone ${secs}s"

	# Another class naming the source: refused.
	clone_of c-nother nfs-archive c-nsrc 64Mi ReadWriteMany
	wait_until "ProvisioningFailed on c-nother" 60 has_event c-nother "ProvisioningFailed: .*is of StorageClass \"nfs-delete\", not \"nfs-archive\""
	gone pv "$(pv_of c-nother)" || fail "a PV for c-nother"
	pass "nfs-clone: a claim of nfs-archive naming c-nsrc -> '$(first_event c-nother 'ProvisioningFailed: .*' 150)...'"

	kc_kubectl delete pvc c-nother --wait=false >/dev/null 2>&1 || true
	delete_pod p-nclone
	kc_kubectl delete pvc c-nsrc c-nclone --wait=false >/dev/null
	wait_until "PVs $spv and $cpv to be deleted" 60 sh -c "! '$KC_BIN/kubectl' --kubeconfig '$KC_DIR/admin.kubeconfig' get pv $spv $cpv -o name 2>/dev/null | grep -q ."
	[ ! -e "$s" ] && [ ! -e "$c" ] || fail "directories left: $(ls -A "$NFS_EXPORT/default")"
	[ "$(nfs_private_mounts)" = 0 ] || fail "provisioner mounts left"
	pass "nfs-clone: all deleted -> both directories gone, no mount left"
}
