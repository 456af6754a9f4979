# tests/cluster/provisioner-e2e.d/nodeloss.sh — node loss (issue #24, 2): `flexvol controller`,
# sourced by provisioner-e2e; runs on this machine (no guest):
#   tests/cluster/provisioner-e2e nodeloss
#
#   nodeloss    drivers/deploy-overlays/node-loss/controller.yaml applied (the server accepts every object; the
#               Deployment is removed again: the scenario stops and restarts the controller at
#               chosen moments, which a host process makes exact; and its image names a registry) and
#               `flexvol controller` started on the host with its ServiceAccount's token, so its
#               ClusterRole is what it has; `kubectl auth can-i --as` says yes to each of its calls
#               and no to others, the provisioner's ServiceAccount may not delete claims, and a real
#               delete of the claim with the provisioner's token is Forbidden.
#               Class flexvol-nodeloss (hostPath, nodeLossGracePeriod NL_GRACE s, default 20) with a
#               root on both nodes (storageClassConfigs); a claim used by a pod pinned to node-b ->
#               Running there, PV pinned to node-b.
#               Node node-b deleted while its kubelet runs (issue #32, 6: `kubectl delete node`, a
#               cloud controller or autoscaler by mistake) -> flexvol/node-deleted-alive on the PV
#               and a NodeDeletedAlive event; NL_GRACE + 6 s after the delete nothing is lost (claim
#               Bound, same uid, PV and its directory there, no mark, no NodeLost) while the Node is
#               still missing (the kubelet does not register again by itself; prints whether its
#               Lease exists: the garbage collector removes it with the Node). The kubelet
#               restarted -> the Node registered again, the hold removed, node-b Ready.
#               node-b's kubelet and provisioner stopped -> node-b NotReady; NL_GRACE + 6 s later
#               nothing touched (PV unmarked, claim Bound, no event).
#               Node node-b deleted -> flexvol/node-missing-since on the PV and a NodeMissing event;
#               the controller restarted 10 s after the mark (the grace is not reset: the claim is
#               deleted NL_GRACE to NL_GRACE + 8 s after the Node, prints TIME nodeloss
#               node-deleted-to-claim-deleted); NodeLost events on claim and PV; claim and PV gone
#               (once kube-controller-manager's pod GC removed the pod of the deleted node: TIME
#               ...-to-claim-gone); the claim recreated under the same name with a new pod -> PV
#               on node-a, pod Running there (TIME ...-to-running).
#               Cleanup: node-b's kubelet and provisioner started again (the Node re-registers),
#               configs restored. Prints the controller's log.

NL_GRACE="${NL_GRACE:-20}"
CTL_USER=system:serviceaccount:kube-system:flexvol-controller

nl_config() { # add | remove: the class's roots in both nodes' configs (both the driver's and the provisioner's)
	local n cfg tmp
	for n in node-a node-b; do
		cfg="$(kc_node_dir "$n")/flexvol-config.json"
		tmp="$cfg.nl"
		if [ "$1" = add ]; then
			jq --arg a "$CLUSTER_DIR/roots/nl-a" --arg b "$CLUSTER_DIR/roots/nl-b" \
				'.storageClassConfigs["flexvol-nodeloss"] = {nodePathMap: [{node: "node-a", paths: [$a]}, {node: "node-b", paths: [$b]}]}' \
				"$cfg" >"$tmp" || fail "jq $cfg"
		else
			jq 'del(.storageClassConfigs["flexvol-nodeloss"]) | if .storageClassConfigs == {} then del(.storageClassConfigs) else . end' \
				"$cfg" >"$tmp" || fail "jq $cfg"
		fi
		cat "$tmp" >"$cfg" && rm -f "$tmp" # in place: owner and mode stay root's
	done
}

NL_STARTS=0
start_controller() { # each start logs to a file of its own: controller-1.log, controller-2.log, ...
	NL_STARTS=$((NL_STARTS + 1))
	kc_spawn controller "$KC_DIR/logs/controller-$NL_STARTS.log" "$KC_FLEXVOL" controller \
		--kubeconfig "$KC_DIR/controller.kubeconfig" --resync-seconds 2 \
		--metrics-address "127.0.0.1:$((${KC_PORT_BASE:-17000} + 603))"
}

nl_controller_setup() {
	local out v n=0
	out="$(kc_kubectl apply -f "$REPO/drivers/deploy-overlays/node-loss/controller.yaml" 2>&1)" || fail "apply controller.yaml: $out"
	kc_kubectl -n kube-system delete deployment flexvol-controller --wait=false >/dev/null || fail "delete the Deployment"
	sa_kubeconfig flexvol-controller "$KC_DIR/controller.kubeconfig"
	# Its calls (src/controller/nodeloss/mod.rs) and nothing near them.
	for v in "list nodes" "get nodes" "list persistentvolumes" "get persistentvolumes" \
		"patch persistentvolumes" "delete persistentvolumes" "get persistentvolumeclaims -n default" \
		"delete persistentvolumeclaims -n default" "get storageclasses.storage.k8s.io" "create events -n default" \
		"get leases.coordination.k8s.io -n kube-node-lease" "list leases.coordination.k8s.io -n kube-node-lease"; do
		# shellcheck disable=SC2086 # the words of one entry
		[ "$(can_i_as "$CTL_USER" $v)" = yes ] || fail "controller.yaml refuses '$v', which the controller calls"
		n=$((n + 1))
	done
	for v in "patch nodes" "delete nodes" "update nodes" "create persistentvolumes" "update persistentvolumes" \
		"create persistentvolumeclaims -n default" "patch persistentvolumeclaims -n default" \
		"list persistentvolumeclaims -A" "deletecollection persistentvolumeclaims -n default" \
		"get pods -n default" "delete pods -n default" "get secrets -n kube-system" \
		"create serviceaccounts --subresource=token -n kube-system" "patch storageclasses.storage.k8s.io" \
		"get leases.coordination.k8s.io -n kube-system" "list leases.coordination.k8s.io -A" \
		"update leases.coordination.k8s.io -n kube-node-lease" "delete leases.coordination.k8s.io -n kube-node-lease" \
		"impersonate users"; do
		# shellcheck disable=SC2086
		[ "$(can_i_as "$CTL_USER" $v)" = no ] || fail "controller.yaml allows '$v'"
		n=$((n + 1))
	done
	# The node credential may not delete claims: that is why this is a separate component.
	[ "$(can_i_as "$SA_USER" delete persistentvolumeclaims -n default)" = no ] ||
		fail "the provisioner's ServiceAccount may delete claims"
	start_controller
	wait_until "the controller to start its passes" 30 grep -q "node loss: watching" "$KC_DIR/logs/controller-1.log"
	pass "nodeloss: controller.yaml applied; $n can-i answers as the controller's ServiceAccount as expected; the provisioner's may not delete claims; controller running with its own token"
}

pv_ann() { jp pv "$1" "{.metadata.annotations.flexvol/node-missing-since}"; }
claim_deleting() { [ -n "$(jp pvc "$1" '{.metadata.deletionTimestamp}')" ] || gone pvc "$1"; }
marked() { [ -n "$(pv_ann "$1")" ]; }
held() { [ -n "$(jp pv "$1" "{.metadata.annotations.flexvol/node-deleted-alive}")" ]; }
not_held() { ! held "$1"; }
node_exists() { lookup node "$1"; }
not_ready() { ! kc_node_ready "$1"; }

scenario_nodeloss() {
	local pv uid t0 t_del t_mark t_act t_gone t_held out dirs lease log_lines
	mkdir -p "$CLUSTER_DIR/roots/nl-a" "$CLUSTER_DIR/roots/nl-b"
	nl_config add
	apply "class flexvol-nodeloss" <<EOF
{"apiVersion":"storage.k8s.io/v1","kind":"StorageClass","metadata":{"name":"flexvol-nodeloss"},
 "provisioner":"flexvol/hostpath","volumeBindingMode":"WaitForFirstConsumer","reclaimPolicy":"Delete",
 "parameters":{"nodeLossGracePeriod":"${NL_GRACE}s"}}
EOF
	nl_controller_setup

	# A claim used by a pod on node-b.
	claim nl-data flexvol-nodeloss
	apply "pod nl-pod" <<EOF
{"apiVersion":"v1","kind":"Pod","metadata":{"name":"nl-pod","namespace":"default"},
 "spec":{"nodeSelector":{"kubernetes.io/hostname":"node-b"},"automountServiceAccountToken":false,
  "terminationGracePeriodSeconds":0,
  "containers":[{$(kc_container "nl"),
   "volumeMounts":[{"name":"data","mountPath":"/data"}]}],
  "volumes":[{"name":"data","persistentVolumeClaim":{"claimName":"nl-data"}}]}}
EOF
	wait_until "pod nl-pod to run on node-b" 120 pod_running nl-pod
	pv="$(pv_of nl-data)"
	uid="$(claim_uid nl-data)"
	[ "$(jp pv "$pv" '{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}')" = node-b ] ||
		fail "PV $pv is not pinned to node-b"
	dirs="$(find "$CLUSTER_DIR/roots/nl-b" -mindepth 1 -maxdepth 1 -name "${pv}_*" | wc -l)"
	[ "$dirs" = 1 ] || fail "no directory of $pv under node-b's root"
	# With the node provisioner's token, deleting this very claim is Forbidden.
	if out="$(as_sa delete pvc nl-data -n default --wait=false 2>&1)"; then fail "the provisioner's token deleted claim nl-data: $out"; fi
	grep -q Forbidden <<<"$out" || fail "deleting claim nl-data with the provisioner's token failed otherwise than Forbidden: $out"
	[ -z "$(jp pvc nl-data '{.metadata.deletionTimestamp}')" ] || fail "claim nl-data is being deleted after the provisioner's attempt"
	pass "nodeloss: claim nl-data bound to $pv on node-b, pod Running there; the provisioner's token is Forbidden to delete it"

	# Node node-b deleted while its kubelet runs: the controller saw that kubelet renew its Lease
	# while the Node existed (a pass every 2 s), so the PV is held and nothing is deleted, however
	# long the Node stays missing.
	t_del="$(kl_now)"
	kc_kubectl delete node node-b >/dev/null || fail "delete node node-b (its kubelet running)"
	wait_until "PV $pv to be held (flexvol/node-deleted-alive)" 15 held "$pv"
	t_held="$(kl_since "$t_del")"
	wait_until "a NodeDeletedAlive event on nl-data" 15 has_event nl-data '^NodeDeletedAlive: node node-b has no Node object, but its kubelet was renewing its Lease'
	sleep "$(awk -v h="$(kl_since "$t_del")" -v g="$NL_GRACE" 'BEGIN { s = g + 6 - h; print (s > 0 ? s : 0) }')"
	! node_exists node-b || fail "Node node-b is back by itself while its kubelet runs: this step proves nothing (kubelet 1.20 registers only at its start)"
	still_there pv "$pv" || fail "PV $pv is gone: Node node-b deleted while its kubelet runs"
	[ "$(claim_uid nl-data)" = "$uid" ] || fail "claim nl-data changed: Node node-b deleted while its kubelet runs"
	[ "$(jp pvc nl-data '{.status.phase}')" = Bound ] || fail "claim nl-data not Bound: Node node-b deleted while its kubelet runs"
	[ -z "$(jp pvc nl-data '{.metadata.deletionTimestamp}')" ] || fail "claim nl-data deleted: Node node-b deleted while its kubelet runs"
	[ -z "$(pv_ann "$pv")" ] || fail "PV $pv marked flexvol/node-missing-since although held: $(pv_ann "$pv")"
	held "$pv" || fail "PV $pv no longer held while Node node-b is missing"
	! has_event nl-data 'NodeMissing|NodeLost' || fail "NodeMissing/NodeLost on nl-data while node-b's kubelet runs: $(events_of nl-data)"
	[ "$(find "$CLUSTER_DIR/roots/nl-b" -mindepth 1 -maxdepth 1 -name "${pv}_*" | wc -l)" = 1 ] || fail "the directory of $pv under node-b's root is gone"
	if kc_kubectl -n kube-node-lease get lease node-b -o name >/dev/null 2>&1; then lease=present; else lease="absent (or unreadable)"; fi
	echo "provisioner-e2e: nodeloss: $(kl_since "$t_del") s after Node node-b was deleted with its kubelet running: held at $t_held s, Lease kube-node-lease/node-b $lease"
	pass "nodeloss: Node node-b deleted with its kubelet running -> held at $t_held s (NodeDeletedAlive), and more than the grace (${NL_GRACE} s) later claim Bound, PV and its data there, no NodeMissing/NodeLost"
	# The operator's way back: restart the kubelet, which registers the Node again; the hold goes.
	kc_stop_name kubelet-node-b 10
	kc_start_kubelet node-b 1
	wait_until "node-b to register again" 60 node_exists node-b
	wait_until "the hold on PV $pv to be removed" 15 not_held "$pv"
	wait_until "node-b to be Ready again" 120 kc_node_ready node-b
	pass "nodeloss: node-b's kubelet restarted -> Node registered again, hold removed"

	# node-b down but its Node still there: nothing is touched, however long.
	log_lines="$(wc -l <"$KC_DIR/logs/controller-1.log")"
	stop_provisioner node-b
	kc_stop_name kubelet-node-b 10
	t0="$(kl_now)"
	wait_until "node-b to be NotReady" 120 not_ready node-b
	echo "provisioner-e2e: nodeloss: node-b NotReady $(kl_since "$t0") s after its kubelet stopped"
	sleep $((NL_GRACE + 6))
	still_there pv "$pv" || fail "PV $pv is gone while node-b is only NotReady"
	[ "$(claim_uid nl-data)" = "$uid" ] || fail "claim nl-data changed while node-b is only NotReady"
	[ "$(jp pvc nl-data '{.status.phase}')" = Bound ] || fail "claim nl-data not Bound while node-b is only NotReady"
	[ -z "$(jp pvc nl-data '{.metadata.deletionTimestamp}')" ] || fail "claim nl-data deleted while node-b is only NotReady"
	[ -z "$(pv_ann "$pv")" ] || fail "PV $pv marked while node-b is only NotReady: $(pv_ann "$pv")"
	! has_event nl-data 'NodeMissing|NodeLost' || fail "events on nl-data while node-b is only NotReady: $(events_of nl-data)"
	out="$(tail -n +"$((log_lines + 1))" "$KC_DIR/logs/controller-1.log" | grep node-b || true)"
	[ -z "$out" ] || fail "the controller acted on node-b while it is only NotReady: $out"
	pass "nodeloss: node-b NotReady for more than the grace (${NL_GRACE} s): PV unmarked, claim Bound, no event"

	# The Node object deleted: marked, then after the grace the claim and PV are deleted.
	t_del="$(kl_now)"
	kc_kubectl delete node node-b >/dev/null || fail "delete node node-b"
	wait_until "PV $pv to be marked flexvol/node-missing-since" 15 marked "$pv"
	t_mark="$(kl_since "$t_del")"
	wait_until "a NodeMissing event on nl-data" 15 has_event nl-data '^NodeMissing: node node-b has no Node object'
	# A restart of the controller inside the grace neither resets nor skips it.
	sleep "$(awk -v m="$t_mark" 'BEGIN { s = 10 - m; print (s > 0 ? s : 0) }')"
	kc_stop_name controller 5
	start_controller
	wait_until "claim nl-data to be deleted" $((NL_GRACE + 20)) claim_deleting nl-data
	t_act="$(kl_since "$t_del")"
	awk -v a="$t_act" -v g="$NL_GRACE" 'BEGIN { exit !(a >= g - 1 && a <= g + 8) }' ||
		fail "claim nl-data deleted $t_act s after Node node-b, not within [${NL_GRACE}-1, ${NL_GRACE}+8] s (a restart 10 s after the mark must neither reset nor skip the grace)"
	echo "provisioner-e2e: TIME nodeloss node-deleted-to-claim-deleted $t_act s (grace ${NL_GRACE} s, marked at $t_mark s, controller restarted at 10 s)"
	grep -q 'has no Node object (since' "$KC_DIR/logs/controller-1.log" || fail "the first controller did not log the mark"
	! grep -q 'has no Node object (since' "$KC_DIR/logs/controller-2.log" || fail "the restarted controller marked the PV again: $(grep 'since' "$KC_DIR/logs/controller-2.log")"
	grep -q 'has had no Node object since' "$KC_DIR/logs/controller-2.log" || fail "the restarted controller did not log the deletion"
	wait_until "a NodeLost event on nl-data" 10 has_event nl-data '^NodeLost: node node-b has had no Node object since'
	wait_until "a NodeLost event on $pv" 10 has_event "$pv" '^NodeLost: .*the PV '"$pv"' is deleted'
	wait_until "claim nl-data to be gone (pod GC removes the pod of the deleted node first)" 150 gone pvc nl-data
	t_gone="$(kl_since "$t_del")"
	wait_until "PV $pv to be gone" 30 gone pv "$pv"
	echo "provisioner-e2e: TIME nodeloss node-deleted-to-claim-gone $t_gone s, PV gone $(kl_since "$t_del") s"
	pass "nodeloss: Node node-b deleted -> marked at $t_mark s, claim deleted at $t_act s, events '$(first_event nl-data '^NodeLost: .*' 160)...', claim and PV gone"

	# The owner recreates the claim (a StatefulSet would): it lands on node-a.
	t0="$(kl_now)"
	claim nl-data flexvol-nodeloss
	pod nl-pod2 nl-data node-b
	wait_until "pod nl-pod2 to run" 120 pod_running nl-pod2
	[ "$(jp pod nl-pod2 '{.spec.nodeName}')" = node-a ] || fail "nl-pod2 is not on node-a"
	pv="$(pv_of nl-data)"
	[ "$(jp pv "$pv" '{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}')" = node-a ] ||
		fail "the recreated claim's PV $pv is not pinned to node-a"
	echo "provisioner-e2e: TIME nodeloss recreated-claim-to-running $(kl_since "$t0") s"
	pass "nodeloss: claim nl-data recreated -> $pv on node-a, pod Running there"
	out="$(grep -Ei 'forbidden|controller.yaml|internal error' "$KC_DIR"/logs/controller-*.log || true)"
	[ -z "$out" ] || fail "the controller hit a refusal or a bug: $out"
	echo "provisioner-e2e: nodeloss: the controller's log:"
	grep -E ' (INFO|WARN|ERROR) ' "$KC_DIR"/logs/controller-*.log | sed "s#^$KC_DIR/logs/##" | cut -c1-420 | sed 's/^/    /'

	# Cleanup: node-b back, the workload and the class gone, configs restored.
	delete_pod nl-pod2
	kc_kubectl delete pvc nl-data --wait=false >/dev/null || fail "delete pvc nl-data"
	wait_until "PV $pv to be deleted" 60 gone pv "$pv"
	kc_stop_name controller 5
	kc_start_kubelet node-b 1
	wait_until "node-b to register and be Ready again" 120 kc_node_ready node-b
	start_provisioner node-b
	wait_until "node-b's provisioner to serve" 60 serving node-b
	rm -rf "${CLUSTER_DIR:?}/roots/nl-a" "${CLUSTER_DIR:?}/roots/nl-b" # the lost node's data: this test's own
	kc_kubectl delete storageclass flexvol-nodeloss >/dev/null || fail "delete class flexvol-nodeloss"
	nl_config remove
	pass "nodeloss: cleaned up; node-b registered again"
}
