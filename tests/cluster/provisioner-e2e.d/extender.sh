# tests/cluster/provisioner-e2e.d/extender.sh — capacity-aware placement (issue #24, 1): the real
# v1.20.2 kube-scheduler configured as drivers/deploy/kube-scheduler-config.yaml tells users,
# calling `flexvol scheduler-extender`; sourced by provisioner-e2e; runs on this machine:
#   tests/cluster/provisioner-e2e extender
#
#   extender    controller.yaml and scheduler-extender.yaml applied (their Deployment and DaemonSet
#               removed again: the fake runtime would not run them); `kubectl auth can-i --as`:
#               the node provisioner may only update ConfigMaps in flexvol-capacity, the controller
#               list/create/delete them there, the extender read claims, classes and the records
#               and write nothing; a create with the provisioner's token is Forbidden.
#               `flexvol controller --capacity-objects` (its token) makes one ConfigMap per Node;
#               both provisioners restarted with --publish-capacity; class flexvol-ext
#               (WaitForFirstConsumer) with a root per node (storageClassConfigs): node-a's a
#               64 MiB tmpfs (nearly full for the claim below), node-b's 512 MiB.
#               `flexvol scheduler-extender` (its token, on the port the config names) and
#               kube-scheduler restarted with --config = kube-scheduler-config.yaml, changed only in
#               clientConnection.kubeconfig and the port.
#               A ReadWriteMany 1 Ti claim with a hand-written selected-node=node-a and no pod
#               (issue #32, 5) -> node-a removes selected-node with a ProvisioningFailed event;
#               written again, it holds no room there:
#               A 10 Mi claim whose pod prefers node-a -> node-a (the preference works when it fits).
#               A 100 Mi claim whose pod prefers node-a -> Running on node-b on the FIRST try: one
#               Scheduled event, no FailedScheduling, no ProvisioningFailed, the claim's
#               selected-node only ever node-b (watched from the claim's creation), no
#               rescheduled provision on either node; the extender's log names node-a as filtered
#               (TIME extender first-try-placement). node-b's record republished after the
#               provisioning; 150 MiB written into the volume (as the pod would) and a 10 Mi claim
#               provisioned on node-b -> its record shows the room gone (TIME ...-after-provision);
#               `flexvol status --capacity node-b --json` agrees with the ConfigMap; a 400 Mi claim
#               then fits nowhere -> FailedScheduling naming flexvol's reason; the 100 Mi claim
#               deleted -> the record shows the room back (TIME ...-after-deletion). The extender
#               stopped -> a pod with a claim still schedules (ignorable). Cleanup: the scheduler,
#               provisioners and configs as before, tmpfs unmounted.

EXT_PORT=$((${KC_PORT_BASE:-17000} + 610))
EXT_CTL_USER=system:serviceaccount:kube-system:flexvol-controller
EXT_USER=system:serviceaccount:kube-system:flexvol-scheduler-extender
MI=$((1 << 20))

ext_config() { # add | remove: the class's roots in both nodes' configs
	local n cfg tmp
	for n in node-a node-b; do
		cfg="$(kc_node_dir "$n")/flexvol-config.json"
		tmp="$cfg.ext"
		if [ "$1" = add ]; then
			jq --arg a "$CLUSTER_DIR/roots/ext-a" --arg b "$CLUSTER_DIR/roots/ext-b" \
				'.storageClassConfigs["flexvol-ext"] = {nodePathMap: [{node: "node-a", paths: [$a]}, {node: "node-b", paths: [$b]}]}' \
				"$cfg" >"$tmp" || fail "jq $cfg"
		else
			jq 'del(.storageClassConfigs["flexvol-ext"]) | if .storageClassConfigs == {} then del(.storageClassConfigs) else . end' \
				"$cfg" >"$tmp" || fail "jq $cfg"
		fi
		cat "$tmp" >"$cfg" && rm -f "$tmp"
	done
}

ext_restart_provisioners() { # with PUBLISH_CAPACITY as it is now
	local n
	for n in node-a node-b; do stop_provisioner "$n"; done
	for n in node-a node-b; do start_provisioner "$n"; done
	for n in node-a node-b; do wait_until "$n's provisioner to serve" 60 serving "$n"; done
}

ext_record() { kc_kubectl -n flexvol-capacity get configmap "$1" -o 'jsonpath={.data.capacity\.json}' 2>/dev/null; }
ext_avail() { # NODE ROOT: available - promised of that root in NODE's published record (empty: none)
	ext_record "$1" | jq -r --arg p "$2" '.hostpath[]? | select(.path == $p and (.error == null)) | .available - .promised' 2>/dev/null
}
ext_published_at() { ext_record "$1" | jq -r '.publishedAt // empty' 2>/dev/null; }
ext_has_record() { [ -n "$(ext_avail "$1" "$2")" ]; }
ext_avail_at_most() { local v; v="$(ext_avail "$1" "$2")" && [ -n "$v" ] && [ "$v" -le "$3" ]; }
ext_avail_at_least() { local v; v="$(ext_avail "$1" "$2")" && [ -n "$v" ] && [ "$v" -ge "$3" ]; }
ext_published_since() { local v; v="$(ext_published_at "$1")" && [ -n "$v" ] && [ "$v" -ge "$2" ]; }
# node-a's and node-b's objects exist, labelled as the controller's (the namespace also holds
# kube-root-ca.crt, which 1.20 publishes into every namespace).
ext_objects() {
	[ "$(kc_kubectl -n flexvol-capacity get configmap -l app.kubernetes.io/managed-by=flexvol-controller -o name 2>/dev/null | sort | tr '\n' ' ')" = "configmap/node-a configmap/node-b " ]
}
ext_ready() { curl -fsS --max-time 2 "http://127.0.0.1:$EXT_PORT/readyz" >/dev/null 2>&1; }

# ext_claim NAME SIZE; ext_pod NAME CLAIM PREFERRED_NODE (the provisioner-e2e `pod` helper)
ext_claim() {
	apply "pvc $1" <<EOF
{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"name":"$1","namespace":"default"},
 "spec":{"accessModes":["ReadWriteOnce"],"storageClassName":"flexvol-ext","resources":{"requests":{"storage":"$2"}}}}
EOF
}

ext_rbac() {
	local v n=0 out
	# The node provisioner (rbac.yaml): update of the records, nothing else there or elsewhere.
	[ "$(can_i_as "$SA_USER" update configmaps -n flexvol-capacity)" = yes ] || fail "rbac.yaml refuses the node's update of its capacity record"
	for v in "get configmaps -n flexvol-capacity" "list configmaps -n flexvol-capacity" \
		"watch configmaps -n flexvol-capacity" "create configmaps -n flexvol-capacity" \
		"delete configmaps -n flexvol-capacity" "patch configmaps -n flexvol-capacity" \
		"update configmaps -n kube-system" "update configmaps -n default" "delete namespaces"; do
		# shellcheck disable=SC2086 # the words of one entry
		[ "$(can_i_as "$SA_USER" $v)" = no ] || fail "rbac.yaml lets the node provisioner '$v'"
		n=$((n + 1))
	done
	# The controller (controller.yaml): makes and removes the objects, never writes their contents.
	for v in list create delete; do
		[ "$(can_i_as "$EXT_CTL_USER" "$v" configmaps -n flexvol-capacity)" = yes ] || fail "controller.yaml refuses '$v configmaps' in flexvol-capacity"
		n=$((n + 1))
	done
	for v in "update configmaps -n flexvol-capacity" "patch configmaps -n flexvol-capacity" "create configmaps -n kube-system"; do
		# shellcheck disable=SC2086
		[ "$(can_i_as "$EXT_CTL_USER" $v)" = no ] || fail "controller.yaml allows '$v'"
		n=$((n + 1))
	done
	# The extender (scheduler-extender.yaml): reads, writes nothing.
	for v in "list persistentvolumeclaims -A" "watch persistentvolumeclaims -A" \
		"list storageclasses.storage.k8s.io" "watch storageclasses.storage.k8s.io" \
		"list configmaps -n flexvol-capacity" "watch configmaps -n flexvol-capacity"; do
		# shellcheck disable=SC2086
		[ "$(can_i_as "$EXT_USER" $v)" = yes ] || fail "scheduler-extender.yaml refuses '$v', which the extender calls"
		n=$((n + 1))
	done
	for v in "update configmaps -n flexvol-capacity" "create configmaps -n flexvol-capacity" \
		"delete configmaps -n flexvol-capacity" "patch persistentvolumeclaims -n default" \
		"delete persistentvolumeclaims -n default" "create persistentvolumes" "get pods -n default" \
		"create pods --subresource=binding -n default" "patch nodes" "list secrets -A" \
		"list configmaps -n kube-system"; do
		# shellcheck disable=SC2086
		[ "$(can_i_as "$EXT_USER" $v)" = no ] || fail "scheduler-extender.yaml allows '$v'"
		n=$((n + 1))
	done
	# A real request with the node's token: creating an object there is Forbidden.
	if out="$(as_sa -n flexvol-capacity create configmap forged --from-literal=capacity.json='{}' 2>&1)"; then
		fail "the provisioner's token created a ConfigMap in flexvol-capacity: $out"
	fi
	grep -q Forbidden <<<"$out" || fail "creating a ConfigMap with the provisioner's token failed otherwise than Forbidden: $out"
	pass "extender: $((n + 1)) can-i answers for the node, controller and extender ServiceAccounts as designed; the node's create is Forbidden"
}

ext_cleanup_pod_claim() { # POD CLAIM
	lookup pod "$1" && delete_pod "$1"
	if lookup pvc "$2"; then
		kc_kubectl delete pvc "$2" --wait=false >/dev/null || fail "delete pvc $2"
		wait_until "claim $2 to go" 60 gone pvc "$2"
	fi
}

scenario_extender() {
	local t0 t_pod t_all secs pod_node sel events pv dir b0 b1 b2 created status_avail line watch_pid out n
	t_all="$(kl_now)"
	# Roots: node-a's nearly full for a 100 Mi claim, node-b's with room.
	mkdir -p "$CLUSTER_DIR/roots/ext-a" "$CLUSTER_DIR/roots/ext-b"
	mount -t tmpfs -o size=64m,mode=0755 flexvol-ext-a "$CLUSTER_DIR/roots/ext-a" || fail "mount tmpfs ext-a"
	mount -t tmpfs -o size=512m,mode=0755 flexvol-ext-b "$CLUSTER_DIR/roots/ext-b" || fail "mount tmpfs ext-b"
	ext_config add
	apply "class flexvol-ext" <<EOF
{"apiVersion":"storage.k8s.io/v1","kind":"StorageClass","metadata":{"name":"flexvol-ext"},
 "provisioner":"flexvol/hostpath","volumeBindingMode":"WaitForFirstConsumer","reclaimPolicy":"Delete"}
EOF
	# The manifests: rbac.yaml (applied by setup: the namespace and the node's Role), controller.yaml,
	# the capacity overlay's controller-capacity.yaml (the controller's Role in flexvol-capacity)
	# and scheduler-extender.yaml; the workloads removed (the fake runtime runs no process).
	kc_kubectl apply -f "$REPO/drivers/deploy/rbac.yaml" >/dev/null || fail "apply rbac.yaml"
	out="$(kc_kubectl apply -f "$REPO/drivers/deploy-overlays/node-loss/controller.yaml" 2>&1)" || fail "apply controller.yaml: $out"
	out="$(kc_kubectl apply -f "$REPO/drivers/deploy-overlays/capacity/controller-capacity.yaml" 2>&1)" || fail "apply controller-capacity.yaml: $out"
	out="$(kc_kubectl apply -f "$REPO/drivers/deploy-overlays/capacity/scheduler-extender.yaml" 2>&1)" || fail "apply scheduler-extender.yaml: $out"
	kc_kubectl -n kube-system delete deployment flexvol-controller --wait=false >/dev/null || fail "delete the controller's Deployment"
	kc_kubectl -n kube-system delete daemonset flexvol-scheduler-extender --wait=false >/dev/null || fail "delete the extender's DaemonSet"
	ext_rbac
	sa_kubeconfig flexvol-controller "$KC_DIR/ext-controller.kubeconfig"
	sa_kubeconfig flexvol-scheduler-extender "$KC_DIR/ext-extender.kubeconfig"

	# The capacity objects, then the records.
	t0="$(kl_now)"
	kc_spawn ext-controller "$KC_DIR/logs/ext-controller.log" "$KC_FLEXVOL" controller \
		--kubeconfig "$KC_DIR/ext-controller.kubeconfig" --resync-seconds 2 --capacity-objects \
		--metrics-address "127.0.0.1:$((${KC_PORT_BASE:-17000} + 604))"
	wait_until "the controller to make one capacity ConfigMap per Node" 30 ext_objects
	PUBLISH_CAPACITY=1
	ext_restart_provisioners
	wait_until "node-a's record of root ext-a" 30 ext_has_record node-a "$CLUSTER_DIR/roots/ext-a"
	wait_until "node-b's record of root ext-b" 30 ext_has_record node-b "$CLUSTER_DIR/roots/ext-b"
	[ "$(kc_kubectl -n flexvol-capacity get configmap node-b -o 'jsonpath={.metadata.labels.app\.kubernetes\.io/managed-by}')" = flexvol-controller ] ||
		fail "node-b's update dropped the controller's label"
	b0="$(ext_avail node-b "$CLUSTER_DIR/roots/ext-b")"
	[ "$(ext_avail node-a "$CLUSTER_DIR/roots/ext-a")" -lt $((100 * MI)) ] || fail "node-a's root has room for 100 Mi: $(ext_record node-a)"
	pass "extender: capacity objects made by the controller, records published by both nodes in $(kl_since "$t0") s (node-a ext-a: $(($(ext_avail node-a "$CLUSTER_DIR/roots/ext-a") / MI)) MiB, node-b ext-b: $((b0 / MI)) MiB)"

	# The extender and kube-scheduler as users configure it.
	kc_spawn scheduler-extender "$KC_DIR/logs/scheduler-extender.log" "$KC_FLEXVOL" scheduler-extender \
		--listen "127.0.0.1:$EXT_PORT" --kubeconfig "$KC_DIR/ext-extender.kubeconfig"
	wait_until "the extender to be ready (/readyz)" 30 ext_ready
	sed -e "s#^  kubeconfig: /etc/kubernetes/scheduler.conf #  kubeconfig: $KC_DIR/scheduler.kubeconfig #" \
		-e "s#^- urlPrefix: \"http://127.0.0.1:8099\"#- urlPrefix: \"http://127.0.0.1:$EXT_PORT\"#" \
		"$REPO/drivers/deploy/kube-scheduler-config.yaml" >"$KC_DIR/scheduler-config.yaml"
	# Only those two values differ from what users are given.
	[ "$(diff "$REPO/drivers/deploy/kube-scheduler-config.yaml" "$KC_DIR/scheduler-config.yaml" | grep -c '^>')" = 2 ] ||
		fail "the test's scheduler config differs from drivers/deploy/kube-scheduler-config.yaml in other than the kubeconfig and port: $(diff "$REPO/drivers/deploy/kube-scheduler-config.yaml" "$KC_DIR/scheduler-config.yaml")"
	kc_restart_scheduler "$KC_DIR/scheduler-config.yaml"
	pass "extender: serving on 127.0.0.1:$EXT_PORT; kube-scheduler restarted with --config (drivers/deploy/kube-scheduler-config.yaml)"

	# Issue #32, 5: a claim with a hand-written selected-node, 1 Ti and ReadWriteMany (which the
	# provisioner refuses for good), no pod: node-a's provisioner sends it back with an event, and
	# written again it does not keep the next pod off node-a (the extender does not count it; the
	# unit tests prove that deterministically, this that the real patch and event happen).
	apply "pvc ext-bogus" <<EOF
{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"name":"ext-bogus","namespace":"default",
  "annotations":{"volume.kubernetes.io/selected-node":"node-a"}},
 "spec":{"accessModes":["ReadWriteMany"],"storageClassName":"flexvol-ext","resources":{"requests":{"storage":"1Ti"}}}}
EOF
	wait_until "claim ext-bogus to be sent back by node-a" 30 has_event ext-bogus "ProvisioningFailed: .*ReadWriteMany.*selected-node annotation was removed"
	[ -z "$(jp pvc ext-bogus '{.metadata.annotations.volume\.kubernetes\.io/selected-node}')" ] ||
		fail "claim ext-bogus kept its selected-node after node-a refused it: $(events_of ext-bogus)"
	kc_kubectl annotate --overwrite pvc ext-bogus volume.kubernetes.io/selected-node=node-a >/dev/null ||
		fail "annotate ext-bogus"
	pass "extender: a ReadWriteMany 1 Ti claim with a hand-written selected-node is sent back by node-a: '$(first_event ext-bogus 'ProvisioningFailed: .*' 200)'"

	# The preference works when the claim fits: a 10 Mi claim -> node-a (ext-bogus, headed there
	# again meanwhile, holds no room).
	ext_claim ext-fits 10Mi
	pod ext-fits ext-fits node-a
	wait_until "pod ext-fits to run" 60 pod_running ext-fits
	[ "$(jp pod ext-fits '{.spec.nodeName}')" = node-a ] || fail "pod ext-fits (10 Mi, prefers node-a) runs on $(jp pod ext-fits '{.spec.nodeName}')"
	line="$(grep -o "filter pod default/ext-fits (1 flexvol claim(s)): .*" "$KC_DIR/logs/scheduler-extender.log" | head -1)"
	grep -q 'passed \[.*node-a' <<<"$line" && grep -q 'passed \[.*node-b' <<<"$line" && grep -q 'filtered \[\]' <<<"$line" ||
		fail "the extender's log has no filter call for ext-fits passing both nodes (kube-scheduler did not call it?): '$line' $(tail -5 "$KC_DIR/logs/scheduler-extender.log")"
	pass "extender: a 10 Mi claim whose pod prefers node-a -> node-a (kube-scheduler called the extender; both nodes passed)"

	# The issue's case: 100 Mi, preferring node-a (64 MiB root) -> node-b, first try.
	ext_claim ext-big 100Mi
	# Every value selected-node ever takes on the claim, from its creation.
	"$KC_BIN/kubectl" --kubeconfig "$KC_DIR/admin.kubeconfig" get pvc ext-big -w \
		-o 'jsonpath={.metadata.annotations.volume\.kubernetes\.io/selected-node}{"|"}' >"$KC_DIR/ext-selected" 2>&1 &
	watch_pid=$!
	t_pod="$(kl_now)"
	pod ext-big ext-big node-a
	wait_until "pod ext-big to run" 60 pod_running ext-big
	secs="$(kl_since "$t_pod")"
	sleep 1
	kill "$watch_pid" 2>/dev/null || true
	wait "$watch_pid" 2>/dev/null || true
	pod_node="$(jp pod ext-big '{.spec.nodeName}')"
	[ "$pod_node" = node-b ] || fail "pod ext-big (100 Mi, prefers node-a whose root has 64 MiB) runs on $pod_node"
	sel="$(tr '|' '\n' <"$KC_DIR/ext-selected" | awk 'NF' | sort -u | tr '\n' ' ')"
	[ "$sel" = "node-b " ] || fail "claim ext-big's selected-node took the values [$sel] (expected only node-b): $(cat "$KC_DIR/ext-selected")"
	events="$(events_of ext-big)"
	! grep -q '^ProvisioningFailed' <<<"$events" || fail "claim ext-big has ProvisioningFailed: $events"
	! grep -q '^FailedScheduling' <<<"$events" || fail "pod ext-big had FailedScheduling: $events"
	[ "$(grep -c '^Scheduled' <<<"$events")" = 1 ] || fail "pod ext-big was not scheduled exactly once: $events"
	for n in node-a node-b; do
		# Present from start at 0 (absent in builds before the series were pre-registered).
		case "$(metric "$n" 'flexvol_provisioner_operations_total{action="provision",kind="hostpath",outcome="rescheduled"}')" in
		'' | 0) ;;
		*) fail "$n's provisioner sent a claim back (rescheduled)" ;;
		esac
	done
	grep -q "filter pod default/ext-big (1 flexvol claim(s)): passed \[node-b\]; filtered \[node-a: " "$KC_DIR/logs/scheduler-extender.log" ||
		fail "the extender's log does not show node-a filtered for ext-big: $(grep ext-big "$KC_DIR/logs/scheduler-extender.log" | tail -3)"
	pv="$(pv_of ext-big)"
	dir="$(find "$CLUSTER_DIR/roots/ext-b" -mindepth 1 -maxdepth 1 -name "${pv}_*" | head -1)"
	[ -n "$dir" ] || fail "no directory of $pv under node-b's root"
	# The extender's /metrics counted kube-scheduler's calls and the node it filtered.
	out="$(curl -fsS --max-time 5 "http://127.0.0.1:$EXT_PORT/metrics")" || fail "cannot scrape the extender's /metrics"
	n="$(awk '$1 == "flexvol_scheduler_extender_filtered_nodes_total" { print $2 }' <<<"$out")"
	[ "${n:-0}" -ge 1 ] || fail "the extender's /metrics counts no filtered node: $(grep flexvol_scheduler_extender <<<"$out" | head -8)"
	n="$(awk '$1 == "flexvol_scheduler_extender_calls_total{verb=\"filter\",outcome=\"success\"}" { print $2 }' <<<"$out")"
	[ "${n:-0}" -ge 2 ] || fail "the extender's /metrics counts fewer than 2 decided filter calls: $(grep flexvol_scheduler_extender <<<"$out" | head -8)"
	n="$(awk '$1 == "flexvol_scheduler_extender_calls_total{verb=\"prioritize\",outcome=\"success\"}" { print $2 }' <<<"$out")"
	[ "${n:-0}" -ge 1 ] || fail "the extender's /metrics counts no prioritize call: $(grep flexvol_scheduler_extender <<<"$out" | head -8)"
	echo "provisioner-e2e: TIME extender first-try-placement $secs s (pod created -> Running on node-b)"
	pass "extender: a 100 Mi claim whose pod prefers node-a (64 MiB) -> node-b on the first try in $secs s: one Scheduled event, no FailedScheduling or ProvisioningFailed, selected-node only ever node-b; extender: '$(grep -o "filter pod default/ext-big.*" "$KC_DIR/logs/scheduler-extender.log" | head -1 | cut -c1-220)'"

	# Capacity after provisioning: node-b republished after the PV; 150 MiB of data in the volume
	# (written here: the fake runtime runs no process) and another claim provisioned there -> the
	# record shows the room gone.
	created="$(date -d "$(jp pv "$pv" '{.metadata.creationTimestamp}')" +%s)" || fail "no creation time of PV $pv"
	wait_until "node-b's record to be republished after the provisioning" 10 ext_published_since node-b "$created"
	dd if=/dev/zero of="$dir/data" bs=1M count=150 status=none || fail "write 150 MiB into $dir"
	t0="$(kl_now)"
	ext_claim ext-second 10Mi
	pod ext-second ext-second node-b
	wait_until "pod ext-second to run" 60 pod_running ext-second
	[ "$(jp pod ext-second '{.spec.nodeName}')" = node-b ] || fail "pod ext-second runs on $(jp pod ext-second '{.spec.nodeName}')"
	wait_until "node-b's record to show 150 MiB less" 15 ext_avail_at_most node-b "$CLUSTER_DIR/roots/ext-b" $((b0 - 150 * MI))
	b1="$(ext_avail node-b "$CLUSTER_DIR/roots/ext-b")"
	echo "provisioner-e2e: TIME extender capacity-after-provision $(kl_since "$t0") s"
	# What `flexvol status --capacity` says on node-b is what it published (nothing changed since).
	status_avail="$(FLEXVOL_CONFIG="$(kc_node_dir node-b)/flexvol-config.json" "$KC_FLEXVOL" status --capacity node-b --json |
		jq -r --arg p "$CLUSTER_DIR/roots/ext-b" '.record.hostpath[] | select(.path == $p) | .available - .promised')" ||
		fail "flexvol status --capacity node-b --json failed"
	[ "$status_avail" -le $((b1 + MI)) ] && [ "$status_avail" -ge $((b1 - MI)) ] ||
		fail "flexvol status --capacity says $status_avail bytes for ext-b, the ConfigMap $b1"
	pass "extender: after provisioning, node-b's record went from $((b0 / MI)) to $((b1 / MI)) MiB (150 MiB written into the volume); flexvol status --capacity agrees ($((status_avail / MI)) MiB)"

	# The extender decides from it: 400 Mi fits neither node now.
	ext_claim ext-none 400Mi
	pod ext-none ext-none node-b
	wait_until "pod ext-none to get FailedScheduling naming flexvol" 30 has_event ext-none "FailedScheduling: .*flexvol: claim default/ext-none"
	[ -z "$(jp pod ext-none '{.spec.nodeName}')" ] || fail "pod ext-none was scheduled to $(jp pod ext-none '{.spec.nodeName}')"
	pass "extender: a 400 Mi claim fits no node now -> Pending: '$(first_event ext-none 'FailedScheduling: .*' 240)'"
	ext_cleanup_pod_claim ext-none ext-none

	# Capacity after deletion: the 100 Mi claim (and its 150 MiB) deleted -> the room is back.
	t0="$(kl_now)"
	ext_cleanup_pod_claim ext-big ext-big
	wait_until "PV $pv to be deleted" 60 gone pv "$pv"
	wait_until "node-b's record to show the room back" 15 ext_avail_at_least node-b "$CLUSTER_DIR/roots/ext-b" $((b1 + 140 * MI))
	b2="$(ext_avail node-b "$CLUSTER_DIR/roots/ext-b")"
	echo "provisioner-e2e: TIME extender capacity-after-deletion $(kl_since "$t0") s"
	pass "extender: after deletion, node-b's record went from $((b1 / MI)) to $((b2 / MI)) MiB"

	# Ignorable, and the control: with the extender gone, the same 100 Mi claim preferring node-a
	# is scheduled (ignorable: true) and goes where the preference says, node-a (today's
	# behaviour, and what the first-try placement above would have been without the extender).
	t0="$(kl_now)"
	kc_stop_name scheduler-extender 5
	awk -v s="$(kl_since "$t0")" 'BEGIN { exit !(s < 3) }' || fail "the extender took $(kl_since "$t0") s to stop on SIGTERM"
	ext_claim ext-after 100Mi
	pod ext-after ext-after node-a
	wait_until "pod ext-after to run with the extender stopped" 60 pod_running ext-after
	[ "$(jp pod ext-after '{.spec.nodeName}')" = node-a ] ||
		fail "with the extender stopped, pod ext-after (100 Mi, prefers node-a) runs on $(jp pod ext-after '{.spec.nodeName}'): the control does not show what the extender changed"
	pass "extender: stopped -> the same 100 Mi claim preferring node-a is scheduled (ignorable: true), to node-a: without the extender the pod goes to the node without room"

	# Cleanup: as before this scenario.
	kc_kubectl delete pvc ext-bogus --wait=false >/dev/null || fail "delete pvc ext-bogus"
	ext_cleanup_pod_claim ext-after ext-after
	ext_cleanup_pod_claim ext-second ext-second
	ext_cleanup_pod_claim ext-fits ext-fits
	kc_kubectl delete storageclass flexvol-ext >/dev/null || fail "delete class flexvol-ext"
	kc_restart_scheduler
	kc_stop_name ext-controller 5
	PUBLISH_CAPACITY=0
	ext_config remove
	ext_restart_provisioners
	n="$(find "$CLUSTER_DIR/roots/ext-a" "$CLUSTER_DIR/roots/ext-b" -mindepth 1 -maxdepth 1 -name 'pvc-*' | wc -l)"
	[ "$n" = 0 ] || fail "volume directories left in the roots: $(ls -A "$CLUSTER_DIR/roots/ext-a" "$CLUSTER_DIR/roots/ext-b")"
	umount "$CLUSTER_DIR/roots/ext-a" "$CLUSTER_DIR/roots/ext-b" || fail "umount the tmpfs roots"
	if grep -E 'RBAC|Forbidden|forbidden' "$KC_DIR/logs/scheduler-extender.log" "$KC_DIR/logs/ext-controller.log"; then
		fail "the extender or the controller hit a missing RBAC rule (above)"
	fi
	pass "extender: cleaned up; scenario in $(kl_since "$t_all") s"
}
