# tests/cluster/provisioner-e2e.d/lvm.sh — the `flexvol/lvm` provisioner scenarios (sourced by
# provisioner-e2e; guest only: real LVM). Run them in the test VM:
#   tests/vm/run --nfs-server --mem 4096 --timeout 1800 tests/cluster/provisioner-e2e lvm lvm-reschedule lvm-kill lvm-retain
#
#   lvm             claim (WaitForFirstConsumer) + pod -> LV on node-a tagged for the PV, PV flexvol/lvm
#                   pinned to node-a, pod Running, a write through it lands on the LV (formatted by the
#                   driver with the class's mkfsOptions); `flexvol status --capacity` agrees with
#                   vgs, vgReserve applied, node-b none (issue #24, 1); claim 64Mi -> 128Mi: LV and the mounted
#                   filesystem grow; an inline pod naming the LV gets FailedMount (#20); claim deleted
#                   -> LV and PV gone. Prints the PVC-to-Running time.
#   lvm-reschedule  node-b picked (the operator labelled it by mistake) though its config grants no
#                   VG -> selected-node removed with an event saying why, node-b's provisioner advises
#                   removing the label; the operator does -> pod Running on node-a
#   lvm-kill        kill -9 of node-a's provisioner after lvcreate (before the PV), then before and
#                   after lvremove of a delete: each restart converges to one LV and one PV, then none
#   lvm-retain      reclaimPolicy Retain: claim deleted -> PV Released, LV and data kept; the class's
#                   fsType (ext3) reached mkfs through the PV's options
#
# The two nodes are processes on one kernel, so they see the same volume groups: "node-b has no
# VG" can only be node-b's flexvol config not granting it (lvm.allowedVolumeGroups), which is what
# the provisioner checks first; the scenario says so.

LVP_VG=""
LVP_LOOP=""
LVP_IMG=""

lvmprov_cleanup() {
	[ -n "$LVP_VG" ] || return 0
	lvm vgremove -y -ff "$LVP_VG" >/dev/null 2>&1 || true
	[ -z "$LVP_LOOP" ] || losetup -d "$LVP_LOOP" 2>/dev/null || true
	rm -f "$LVP_IMG"
}

# lvm_grant NODE: node's config grants the VG (lvm.allowedVolumeGroups).
# The provisioner re-reads its config on every pass, the driver on every call.
lvm_grant() {
	local c
	c="$(kc_node_dir "$1")/flexvol-config.json"
	[ -e "$c.orig" ] || cp "$c" "$c.orig"
	sed "s/}\$/,\"lvm\":{\"allowedVolumeGroups\":[\"$LVP_VG\"]}}/" "$c.orig" >"$c.tmp" && mv "$c.tmp" "$c"
}

lvm_label_of() { jp node "$1" '{.metadata.labels.flexvol/lvm}'; }
lvm_unlabelled() { [ -z "$(lvm_label_of "$1")" ]; }
# lvm_advised NODE serves|is: the provisioner of NODE advised the operator about flexvol/lvm (it
# never labels a Node itself: "serves ... but is not labelled", "is labelled ... but cannot serve").
lvm_advised() { grep -q "node $1 $2 .*flexvol/lvm" "$KC_DIR/logs/provisioner-$1.log" 2>/dev/null; }
jp_is() { [ "$(jp "$1" "$2" "$3")" = "$4" ]; } # KIND NAME JSONPATH VALUE
lv_tags() { lvm lvs --noheadings -o lv_tags "$LVP_VG/$1" 2>/dev/null | tr -d ' '; }
lv_exists() { lvm lvs "$LVP_VG/$1" >/dev/null 2>&1; }
lv_gone() { ! lv_exists "$1"; }
lv_mib() { lvm lvs --noheadings --units m --nosuffix -o lv_size "$LVP_VG/$1" | tr -d ' ' | cut -d. -f1; }
lvs_tagged_for() { lvm lvs --noheadings -o lv_tags "$LVP_VG" 2>/dev/null | tr ',' '\n' | tr -d ' ' | grep -cx "flexvol.pv.$1" || true; }
lv_devnum() { printf '%d:%d' "0x$(stat -L -c %t "/dev/$LVP_VG/$1")" "0x$(stat -L -c %T "/dev/$LVP_VG/$1")"; }

# lvclaim NAME CLASS SIZE
lvclaim() {
	apply "pvc $1" <<EOF
{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"name":"$1","namespace":"default"},
 "spec":{"accessModes":["ReadWriteOnce"],"storageClassName":"$2","resources":{"requests":{"storage":"$3"}}}}
EOF
}
# lvclass NAME RECLAIM PARAMETERS_JSON
lvclass() {
	apply "class $1" <<EOF
{"apiVersion":"storage.k8s.io/v1","kind":"StorageClass","metadata":{"name":"$1"},
 "provisioner":"flexvol/lvm","volumeBindingMode":"WaitForFirstConsumer","reclaimPolicy":"$2",
 "allowVolumeExpansion":true,
 "allowedTopologies":[{"matchLabelExpressions":[{"key":"flexvol/lvm","values":["true"]}]}],
 "parameters":$3}
EOF
}
# lvm_voldir POD PV: the pod's volume directory as kubelet mounts it.
# lvm_inline_pod NAME NODE VOLUME_NAME LV: a pod author's inline flexVolume of the LV, its volume
# named as the author likes (the claim's PV name, to look like the PV).
lvm_inline_pod() {
	apply "pod $1" <<EOF
{"apiVersion":"v1","kind":"Pod","metadata":{"name":"$1","namespace":"default"},
 "spec":{"nodeSelector":{"kubernetes.io/hostname":"$2"},"automountServiceAccountToken":false,
  "terminationGracePeriodSeconds":0,
  "containers":[{$(kc_container "$1"),
   "volumeMounts":[{"name":"$3","mountPath":"/data"}]}],
  "volumes":[{"name":"$3","flexVolume":{"driver":"flexvol/lvm","fsType":"ext4","options":{"volumegroup":"$LVP_VG","volumeID":"$4"}}}]}}
EOF
}
lvm_voldir() { echo "$(kc_node_dir "$(jp pod "$1" '{.spec.nodeName}')")/root/pods/$(jp pod "$1" '{.metadata.uid}')/volumes/flexvol~lvm/$2"; }

lvmprov_setup() {
	[ -z "$LVP_VG" ] || return 0
	command -v lvm >/dev/null || fail "no lvm here: the lvm scenarios run in the guest (tests/vm/run)"
	LVP_VG="fvp$$"
	LVP_IMG="$(mktemp /tmp/flexvol-prov-vg.XXXXXX)"
	truncate -s 512M "$LVP_IMG"
	LVP_LOOP="$(losetup -f --show "$LVP_IMG")"
	trap 'kc_down "$CLUSTER_DIR" || true; lvmprov_cleanup' EXIT
	lvm vgcreate -y "$LVP_VG" "$LVP_LOOP" >/dev/null || fail "vgcreate $LVP_VG on $LVP_LOOP failed"
	lvm_grant node-a
	lvclass flexvol-lvm Delete "{\"volumegroup\":\"$LVP_VG\",\"mkfsOptions\":\"-L fvprov\"}"
	wait_until "node-a's provisioner to say it serves flexvol/lvm" 60 lvm_advised node-a serves
	# The operator labels the nodes that serve the class (its allowedTopologies).
	kc_kubectl label node node-a flexvol/lvm=true >/dev/null || fail "label node-a flexvol/lvm=true"
	! lvm_advised node-b serves || fail "node-b (no VG granted) says it serves flexvol/lvm"
	lvm_unlabelled node-b || fail "node-b (no VG granted) carries the label flexvol/lvm: $(lvm_label_of node-b)"
	pass "lvm setup: VG $LVP_VG on $LVP_LOOP, granted by node-a's config only; node-a serves it and was labelled flexvol/lvm by the operator, node-b not"
}

# Issue #24, 1: `flexvol status --capacity` (the record the node publishes for the scheduler
# extender, as the extender reads it) reports the VG as real lvm2 does: size and free as `vgs`
# says; with lvm.vgReserve 100Mi in node-a's config (a copy, for this call only) what a new thick
# volume may take is free - 100 MiB; node-b, whose config grants no VG, lists none. (The guest has
# no jq: the text form is compared, each size as format_human writes it.)
lvm_q() { # format_human of protocol::quantity: the largest binary unit reached, one decimal, truncated
	local b="$1" u s t
	for u in TiB:40 GiB:30 MiB:20 KiB:10; do
		s="${u#*:}"
		if [ "$b" -ge $((1 << s)) ]; then
			t=$(((b * 10) >> s))
			echo "$((t / 10)).$((t % 10)) ${u%%:*}"
			return
		fi
	done
	echo "$b B"
}
lvm_capacity_checked() {
	local cfg out vsize vfree want
	cfg="$(kc_node_dir node-a)/flexvol-config.json"
	read -r vsize vfree < <(lvm vgs --noheadings --units b --nosuffix -o vg_size,vg_free "$LVP_VG") || fail "vgs $LVP_VG"
	[ "$vfree" -gt $((100 << 20)) ] && [ "$vfree" -lt "$vsize" ] || fail "vgs $LVP_VG: size '$vsize' free '$vfree' (the 64 MiB LV should be in it)"
	sed 's/"lvm":{/"lvm":{"vgReserve":"100Mi",/' "$cfg" >"$cfg.cap" || fail "sed $cfg"
	grep -q '"vgReserve":"100Mi"' "$cfg.cap" || fail "no lvm section to add vgReserve to in $cfg: $(cat "$cfg")"
	out="$(FLEXVOL_CONFIG="$cfg.cap" "$KC_FLEXVOL" status --capacity node-a 2>&1)" || fail "flexvol status --capacity node-a failed: $out"
	rm -f "$cfg.cap"
	want="lvm $LVP_VG: $(lvm_q $((vfree - (100 << 20)))) for new thick volumes ($(lvm_q "$vfree") free - 100.0 MiB vgReserve, of $(lvm_q "$vsize"))"
	grep -qxF "$want" <<<"$out" || fail "flexvol status --capacity node-a does not say '$want' (vgs: size $vsize, free $vfree; vgReserve 100Mi): $out"
	out="$(FLEXVOL_CONFIG="$(kc_node_dir node-b)/flexvol-config.json" "$KC_FLEXVOL" status --capacity node-b 2>&1)" || true
	grep -qx "capacity of node node-b (record version [0-9]*)" <<<"$out" || fail "flexvol status --capacity node-b: $out"
	! grep -q "^lvm " <<<"$out" || fail "node-b, whose config grants no VG, lists one: $out"
	pass "lvm: flexvol status --capacity node-a says '$want' (as vgs measures $LVP_VG, with the 64 MiB LV in it, and vgReserve 100Mi applied); node-b lists no VG"
}

scenario_lvm() {
	lvmprov_setup
	local t0 secs pv d t fs_before fs_after lv_after
	t0="$(kl_now)"
	lvclaim c-lvm flexvol-lvm 64Mi
	pod p-lvm c-lvm node-b # prefers node-b, which has no VG (and no label)
	wait_until "pod p-lvm Running" 300 pod_running p-lvm
	secs="$(kl_since "$t0")"
	[ "$(jp pod p-lvm '{.spec.nodeName}')" = node-a ] || fail "p-lvm runs on $(jp pod p-lvm '{.spec.nodeName}')"
	pv="$(pv_of c-lvm)"
	jp_is pvc c-lvm '{.spec.volumeName}' "$pv" || fail "c-lvm bound to $(jp pvc c-lvm '{.spec.volumeName}'), not $pv"
	for t in flexvol.created "flexvol.pv.$pv" flexvol.formatted; do
		tr ',' '\n' <<<"$(lv_tags "$pv")" | grep -x "$t" >/dev/null || fail "LV $LVP_VG/$pv lacks the tag $t: '$(lv_tags "$pv")'"
	done
	[ "$(lv_mib "$pv")" = 64 ] || fail "LV $LVP_VG/$pv is $(lv_mib "$pv") MiB"
	jp_is pv "$pv" '{.spec.flexVolume.driver}' flexvol/lvm || fail "PV $pv driver $(jp pv "$pv" '{.spec.flexVolume.driver}')"
	[ "$(jp pv "$pv" '{.spec.flexVolume.options.volumegroup}')/$(jp pv "$pv" '{.spec.flexVolume.options.volumeID}')" = "$LVP_VG/$pv" ] ||
		fail "PV $pv options: $(jp pv "$pv" '{.spec.flexVolume.options}')"
	[ -z "$(jp pv "$pv" '{.spec.flexVolume.options.size}')" ] || fail "PV $pv has a size option: the driver could create an LV"
	jp_is pv "$pv" '{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}' node-a ||
		fail "PV $pv is not pinned to node-a: $(jp pv "$pv" '{.spec.nodeAffinity}')"
	jp_is pv "$pv" '{.metadata.annotations.flexvol/size-bytes}' $((64 << 20)) || fail "PV $pv size-bytes $(jp pv "$pv" '{.metadata.annotations.flexvol/size-bytes}')"
	jp_is pv "$pv" '{.metadata.annotations.flexvol/size-enforced}' true || fail "PV $pv size-enforced not true"
	d="$(lvm_voldir p-lvm "$pv")"
	[ "$(mountpoint -d "$d" 2>/dev/null)" = "$(lv_devnum "$pv")" ] || fail "$d is not a mount of /dev/$LVP_VG/$pv"
	[ "$(blkid -p -o value -s LABEL "/dev/$LVP_VG/$pv")" = fvprov ] || fail "the LV's filesystem lacks the class's label (mkfsOptions -L fvprov)"
	echo "written through p-lvm" >"$d/proof"
	has_event c-lvm "ProvisioningSucceeded: flexvol provisioned volume $pv at $LVP_VG/$pv" || fail "no ProvisioningSucceeded on c-lvm: $(events_of c-lvm | tr '\n' '|')"
	pass "lvm: PVC -> pod Running in $secs s on node-a (pod preferred node-b, which has no VG); LV $LVP_VG/$pv 64 MiB tagged flexvol.pv.$pv, formatted by the driver with the class's mkfsOptions; PV pinned to node-a; a write landed"
	lvm_capacity_checked
	echo "provisioner-e2e: TIME lvm pvc-to-running ${secs}s"

	fs_before="$(df -m --output=size "$d" | tail -n1 | tr -d ' ')"
	kc_kubectl patch pvc c-lvm --type merge -p '{"spec":{"resources":{"requests":{"storage":"128Mi"}}}}' >/dev/null ||
		fail "patch claim c-lvm to 128Mi"
	wait_until "PV $pv at 128Mi" 60 jp_is pv "$pv" '{.spec.capacity.storage}' 128Mi
	wait_until "PV $pv's flexvol/size-bytes at 128 MiB" 60 jp_is pv "$pv" '{.metadata.annotations.flexvol/size-bytes}' $((128 << 20))
	wait_until "claim c-lvm at 128Mi (kubelet's expandfs)" 240 jp_is pvc c-lvm '{.status.capacity.storage}' 128Mi
	lv_after="$(lv_mib "$pv")"
	fs_after="$(df -m --output=size "$d" | tail -n1 | tr -d ' ')"
	[ "$lv_after" = 128 ] || fail "LV is $lv_after MiB after the resize"
	[ "$fs_after" -gt $((fs_before + 50)) ] || fail "the mounted filesystem did not grow: $fs_before -> $fs_after MiB"
	[ "$(cat "$d/proof")" = "written through p-lvm" ] || fail "the data is gone after the resize"
	pass "lvm: claim 64Mi -> 128Mi: LV 128 MiB, df of the pod's volume $fs_before -> $fs_after MiB, claim status 128Mi; events: $(events_of c-lvm | grep -i resize | tr '\n' '|' | cut -c1-300)"

	# #20: an inline volume naming the claim's LV (and named like its PV) gets FailedMount; the
	# claim's pod above mounted it with the PV's capabilityToken.
	lvm_inline_pod p-lvm-steal node-a "$pv" "$pv"
	wait_until "FailedMount of p-lvm-steal" 120 has_event p-lvm-steal 'FailedMount: .*served only to the PV'
	! grep -q " $(kc_node_dir node-a)/root/pods/$(jp pod p-lvm-steal '{.metadata.uid}')/" /proc/self/mountinfo ||
		fail "p-lvm-steal got a mount"
	! pod_running p-lvm-steal || fail "p-lvm-steal is Running"
	pass "lvm: an inline volume of $LVP_VG/$pv named $pv -> FailedMount '$(first_event p-lvm-steal 'FailedMount: .*' 160)...'"
	delete_pod p-lvm-steal

	delete_pod p-lvm
	kc_kubectl delete pvc c-lvm --wait=false >/dev/null
	wait_until "PV $pv to be deleted" 90 gone pv "$pv"
	lv_gone "$pv" || fail "LV $LVP_VG/$pv still exists after its PV was deleted"
	pass "lvm: pod and claim deleted -> LV $LVP_VG/$pv and PV gone"
}

scenario_lvm_reschedule() {
	lvmprov_setup
	local pv sel
	# The operator labels node-b by mistake (its config grants no VG); with its provisioner stopped
	# the scheduler's pick of node-b stays visible.
	stop_provisioner node-b
	kc_kubectl label node node-b flexvol/lvm=true >/dev/null || fail "label node-b flexvol/lvm=true"
	lvclaim c-lvm-move flexvol-lvm 64Mi
	pod p-lvm-move c-lvm-move node-b
	wait_until "the scheduler to pick node-b for c-lvm-move" 60 \
		jp_is pvc c-lvm-move '{.metadata.annotations.volume\.kubernetes\.io/selected-node}' node-b
	start_provisioner node-b
	wait_until "node-b's provisioner to send c-lvm-move back" 60 \
		has_event c-lvm-move "ProvisioningFailed: node node-b cannot serve this claim: volume group $LVP_VG is not in node node-b's lvm.allowedVolumeGroups"
	wait_until "node-b's provisioner to advise removing its label" 30 lvm_advised node-b is
	grep -q "kubectl label node node-b flexvol/lvm-" "$KC_DIR/logs/provisioner-node-b.log" || fail "node-b's advice names no command"
	[ "$(lvm_label_of node-b)" = true ] || fail "node-b's label (the operator's) changed: '$(lvm_label_of node-b)'"
	# The operator follows the advice.
	kc_kubectl label node node-b flexvol/lvm- >/dev/null || fail "unlabel node-b"
	wait_until "pod p-lvm-move Running" 300 pod_running p-lvm-move
	[ "$(jp pod p-lvm-move '{.spec.nodeName}')" = node-a ] || fail "p-lvm-move on $(jp pod p-lvm-move '{.spec.nodeName}')"
	pv="$(pv_of c-lvm-move)"
	[ "$(lvs_tagged_for "$pv")" = 1 ] || fail "$(lvs_tagged_for "$pv") LVs tagged for $pv"
	sel="$(first_event c-lvm-move '.*cannot serve.*')"
	pass "lvm-reschedule: '$sel'; node-b's provisioner advised removing its label, the operator did; pod Running on node-a with LV $LVP_VG/$pv"
	delete_pod p-lvm-move
	kc_kubectl delete pvc c-lvm-move --wait=false >/dev/null
	wait_until "PV $pv to be deleted" 90 gone pv "$pv"
	lv_gone "$pv" || fail "LV $LVP_VG/$pv still exists"
}

scenario_lvm_kill() {
	lvmprov_setup
	local pid uid pv
	stop_provisioner node-a
	start_provisioner node-a FLEXVOL_TEST_KILL_AT=lvm-provision-after-lvcreate
	pid="$(kc_pid_of provisioner-node-a)"
	lvclaim c-lvm-kill flexvol-lvm 64Mi
	pod p-lvm-kill c-lvm-kill
	wait_killed node-a "$pid"
	uid="$(claim_uid c-lvm-kill)"
	pv="pvc-$uid"
	[ "$(lvs_tagged_for "$pv")" = 1 ] || fail "after the kill: $(lvs_tagged_for "$pv") LVs tagged for $pv"
	gone pv "$pv" || fail "PV $pv exists although the kill came before it"
	start_provisioner node-a
	wait_until "pod p-lvm-kill Running" 300 pod_running p-lvm-kill
	[ "$(lvs_tagged_for "$pv")" = 1 ] || fail "$(lvs_tagged_for "$pv") LVs tagged for $pv"
	[ "$(lvm lvs --noheadings -o lv_name "$LVP_VG" | grep -c .)" = 1 ] || fail "LVs in $LVP_VG: $(lvm lvs --noheadings -o lv_name "$LVP_VG" | tr -d ' ' | tr '\n' ' ')"
	[ "$(pvs_for_claim "$uid")" = 1 ] || fail "$(pvs_for_claim "$uid") PVs for claim c-lvm-kill"
	pass "lvm-kill: kill -9 between lvcreate and the PV, restart -> the tagged LV reused: one LV, one PV, pod Running"

	delete_pod p-lvm-kill
	stop_provisioner node-a
	start_provisioner node-a FLEXVOL_TEST_KILL_AT=lvm-provision-before-lvremove
	pid="$(kc_pid_of provisioner-node-a)"
	kc_kubectl delete pvc c-lvm-kill --wait=false >/dev/null
	wait_killed node-a "$pid"
	lv_exists "$pv" || fail "LV $pv gone although the kill came before lvremove"
	start_provisioner node-a FLEXVOL_TEST_KILL_AT=lvm-provision-after-lvremove
	pid="$(kc_pid_of provisioner-node-a)"
	wait_killed node-a "$pid"
	lv_gone "$pv" || fail "LV $pv still there after lvremove"
	still_there pv "$pv" || fail "PV $pv deleted although the kill came before it"
	start_provisioner node-a
	wait_until "PV $pv deleted after the restart" 60 gone pv "$pv"
	[ -z "$(lvm lvs --noheadings -o lv_name "$LVP_VG")" ] || fail "left in $LVP_VG: $(lvm lvs --noheadings -o lv_name "$LVP_VG" | tr -d ' ' | tr '\n' ' ')"
	pass "lvm-kill: kill -9 before and after lvremove of a delete, restarts -> LV and PV gone, nothing left in $LVP_VG"
}

scenario_lvm_retain() {
	lvmprov_setup
	local pv d
	lvclass flexvol-lvm-retain Retain "{\"volumegroup\":\"$LVP_VG\",\"fsType\":\"ext3\"}"
	lvclaim c-lvm-retain flexvol-lvm-retain 64Mi
	pod p-lvm-retain c-lvm-retain
	wait_until "pod p-lvm-retain Running" 300 pod_running p-lvm-retain
	pv="$(pv_of c-lvm-retain)"
	d="$(lvm_voldir p-lvm-retain "$pv")"
	[ "$(blkid -p -o value -s TYPE "/dev/$LVP_VG/$pv")" = ext3 ] || fail "the LV holds $(blkid -p -o value -s TYPE "/dev/$LVP_VG/$pv"), the class says fsType ext3"
	echo kept >"$d/data"
	delete_pod p-lvm-retain
	kc_kubectl delete pvc c-lvm-retain --wait=false >/dev/null
	wait_until "PV $pv Released" 60 jp_is pv "$pv" '{.status.phase}' Released
	sleep 8 # more than two resyncs of the provisioner
	still_there pv "$pv" || fail "Retain PV $pv was deleted"
	lv_exists "$pv" || fail "Retain LV $LVP_VG/$pv was removed"
	lvm lvchange -ay "$LVP_VG/$pv" >/dev/null
	[ "$(debugfs -R 'cat /data' "/dev/$LVP_VG/$pv" 2>/dev/null)" = kept ] || fail "the Retain LV lost its data"
	lvm lvchange -an "$LVP_VG/$pv" >/dev/null
	pass "lvm-retain: fsType ext3 from the class reached mkfs; claim deleted -> PV Released and kept, LV $LVP_VG/$pv and its data kept"
	kc_kubectl delete pv "$pv" >/dev/null
	lvm lvremove -y "$LVP_VG/$pv" >/dev/null
}
