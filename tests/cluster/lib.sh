# shellcheck shell=bash
# tests/cluster/lib.sh — a real Kubernetes 1.20.2 control plane (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler) and N kubelets with kubelet's fake CRI runtime, all on
# loopback, with flexvol installed on every node and in the controller-manager. Sourced by
# tests/cluster/{up,down,e2e}; usable by other harnesses:
#
#   source tests/cluster/lib.sh
#   kc_up DIR node-a node-b          # start everything, wait until the nodes are Ready
#   kc_kubectl get nodes             # kubectl as the admin (client certificate, system:masters)
#   kc_down DIR                      # stop everything, unmount, undo host fix-ups, remove DIR
#
# Everything lives under DIR, and DIR/state records what kc_up did (pids, host fix-ups), so
# kc_down also works from another process (tests/cluster/down). Security: TLS everywhere with a
# CA made at start (etcd too), client-certificate authentication, --authorization-mode=Node,RBAC
# and the NodeRestriction admission plugin. Each kubelet is system:node:<name>; the
# controller-manager is system:kube-controller-manager with --use-service-account-credentials
# (each controller as its own service account, as kubeadm sets it up); the scheduler is
# system:kube-scheduler.
#
# Caller-settable before kc_up:
#   KC_BIN            dir with the Kubernetes binaries (default: the output of tests/kubelet/setup)
#   KC_FLEXVOL        flexvol binary to install (default: the newest release build in target/)
#   KC_DRIVERS        drivers installed on every node and in the controller-manager
#                     (default hostpath,nfs,lvm)
#   KC_PORT_BASE      ports used: base+379/380 etcd, +443 apiserver, +250+i kubelet i
#                     (default 17000; all on 127.0.0.1)
#   KC_KUBELET_FLAGS  array of extra flags for every kubelet
#   KC_NODE_CONFIG    extra JSON members for each node's flexvol config (e.g. '"lvm":{...}')
#   KC_KEEP=1         kc_down keeps DIR (logs)
#   KC_RUNTIME        fake (default: kubelet's fake CRI runtime, flexvol-fakeruntime: pods run no
#                     process) | containerd (real containers: one containerd per node, CNI bridge,
#                     images built locally; see containers.sh; the API server then also listens on
#                     KCC_API_HOST so pods reach it)
#   KC_INSTALL_DRIVERS=0  install.sh does not install flexvol on the nodes (a DaemonSet will); the
#                     controller-manager still gets it
#   KC_NODE_CONFIG_FILE  the flexvol config kubelet hands the drivers, relative to the node's dir
#                     (default flexvol-config.json, written by kc_up)

KC_HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KC_REPO="$(cd "$KC_HERE/../.." && pwd)"
# kl_host_prepare, kl_mounts_under, kl_unmount_all_under, kl_is_mounted, kl_now, kl_since
# shellcheck source=../kubelet/lib.sh
source "$KC_HERE/../kubelet/lib.sh"
# shellcheck source=containers.sh
source "$KC_HERE/containers.sh"

KC_DIR=""
KC_NODES=()
KC_LOG_TAIL_LINES="${KC_LOG_TAIL_LINES:-30}"

kc_log() { echo "cluster: $*" >&2; }

kc_fail() {
	echo "cluster: FAIL: $*" >&2
	# tests/run prints these lines in its summary, where a failure is not lost under the logs.
	[ -z "${FLEXVOL_FAILURES:-}" ] || echo "$(date +%T) cluster: FAIL: $*" | cut -c1-600 >>"$FLEXVOL_FAILURES"
	kc_dump_logs
	exit 1
}

kc_dump_logs() {
	[ -n "$KC_DIR" ] && [ -d "$KC_DIR/logs" ] || return 0
	local f
	for f in "$KC_DIR"/logs/*.log; do
		[ -s "$f" ] || continue
		echo "----- tail -n $KC_LOG_TAIL_LINES $f -----" >&2
		tail -n "$KC_LOG_TAIL_LINES" "$f" | cut -c1-400 >&2
	done
	echo "----- mounts under $KC_DIR -----" >&2
	kl_mounts_under "$KC_DIR" >&2 || true
	echo "-----" >&2
}

# kubectl as the cluster admin.
kc_kubectl() { "$KC_BIN/kubectl" --kubeconfig "$KC_DIR/admin.kubeconfig" --request-timeout=30s "$@"; }

# Event checks, over the calling script's `events_of NAME` ("reason: message" lines). Never
# `events_of X | grep -q`: grep exits at the first match, and under pipefail the SIGPIPE that
# kubectl (one write per jsonpath piece) may then get fails the check although the event is there.
# Read first, then match.
has_event() { local ev; ev="$(events_of "$1")" || true; grep -Eq -- "$2" <<<"$ev"; }
# first_event OBJECT REGEX [WIDTH]: the first match about OBJECT, cut to WIDTH characters, or
# nothing. Never fails: as an assignment under `set -e`, a failed pipeline would end the script
# without a word.
first_event() { local ev; ev="$(events_of "$1")" || true; grep -m1 -Eo -- "$2" <<<"$ev" | cut -c1-"${3:-220}" || true; }

kc_port() { # kc_port etcd|etcd-peer|apiserver|kubelet INDEX
	local b="${KC_PORT_BASE:-17000}"
	case "$1" in
	etcd) echo $((b + 379)) ;;
	etcd-peer) echo $((b + 380)) ;;
	apiserver) echo $((b + 443)) ;;
	kubelet) echo $((b + 250 + $2)) ;;
	esac
}

# kc_container NAME [SCRIPT]: the start of a pod's container "main" (name, image, command; the
# caller adds volumeMounts and the closing brace), for either runtime:
#   fake        an untagged image name of its own (the fake runtime needs one per pod) and
#               `sleep 3600`, which no process runs
#   containerd  the local busybox image (KCC_IMAGE_BUSYBOX, imagePullPolicy Never) running
#               `sh -c 'SCRIPT; sleep'` for real: SCRIPT (no double quote, no backslash: it goes
#               into JSON as is) runs first, then the container sleeps; SIGTERM ends it at once
#               (a trap), so deleting a pod takes no grace period
kc_container() {
	local name="$1" script="${2:-}"
	case "$script" in *'"'* | *\\*) kc_fail "kc_container $name: no double quote or backslash in a pod's script" ;; esac
	if [ "${KC_RUNTIME:-fake}" = containerd ]; then
		[ -n "$KCC_IMAGE_BUSYBOX" ] || kc_fail "kc_container: no busybox image (kc_up with KC_RUNTIME=containerd first)"
		printf '"name":"main","image":"%s","imagePullPolicy":"Never","command":["sh","-c","trap %s TERM; %ssleep 3600 & wait"]' \
			"$KCC_IMAGE_BUSYBOX" "'exit 0'" "${script:+$script; }"
	else
		printf '"name":"main","image":"img-%s-%s","command":["sleep","3600"]' "$name" "$RANDOM"
	fi
}
# kc_real_containers: true when pods run processes (KC_RUNTIME=containerd).
kc_real_containers() { [ "${KC_RUNTIME:-fake}" = containerd ]; }

# kc_node_dir NODE: that node's directory (root, plugins, flexvol config, state, log).
kc_node_dir() { echo "$KC_DIR/nodes/$1"; }
kc_node_flexvol_log() { echo "$KC_DIR/nodes/$1/flexvol.log"; }
kc_controller_flexvol_log() { echo "$KC_DIR/controller/flexvol.log"; }

# Load DIR/state (kc_up's record) into this shell.
kc_load() {
	KC_DIR="$1"
	[ -f "$KC_DIR/state" ] || {
		kc_log "no cluster state in $KC_DIR"
		return 1
	}
	# shellcheck source=/dev/null
	source "$KC_DIR/state"
}

kc_write_kubeconfig() { # FILE NAME (uses pki/NAME.{crt,key})
	cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: flexvol
  cluster: {server: "https://127.0.0.1:$(kc_port apiserver)", certificate-authority: "$KC_DIR/pki/ca.crt"}
users:
- name: $2
  user: {client-certificate: "$KC_DIR/pki/$2.crt", client-key: "$KC_DIR/pki/$2.key"}
contexts:
- name: flexvol
  context: {cluster: flexvol, user: $2}
current-context: flexvol
EOF
}

# kc_spawn NAME LOGFILE CMD...: start CMD detached (own session, not our child, so kc_down
# works from any process) and record its pid in DIR/pids as "NAME PID". Only etcd inherits the
# machine-wide kubelet lock (KC_LOCKFD).
kc_spawn() {
	local name="$1" logf="$2" pid
	shift 2
	pid="$(
		if [ -n "${KC_LOCKFD:-}" ] && [ "$name" != etcd ]; then exec {KC_LOCKFD}>&-; fi
		setsid "$@" </dev/null >"$logf" 2>&1 &
		echo $!
	)"
	echo "$name $pid" >>"$KC_DIR/pids"
	# Until the forked shell has exec'd CMD, /proc/PID/cmdline is the shell's, which does not
	# name DIR, and kc_pid_ours would call the process gone: wait for the exec (or its death).
	local i
	for ((i = 0; i < 100; i++)); do
		kc_pid_ours "$pid" && break
		[ -e "/proc/$pid" ] || break
		sleep 0.05
	done
	kc_log "$name: pid $pid"
}

kc_pid_of() { awk -v n="$1" '$1 == n { p = $2 } END { print p }' "$KC_DIR/pids"; }

# True when PID is alive (not a zombie) and its command line names our DIR (so a recycled pid is
# never signalled).
kc_pid_ours() {
	local pid="$1" st
	[ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
	st="$(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null)"
	[ "$st" != Z ] || return 1
	local cmd
	cmd="$({ tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null)" || return 1
	[[ "$cmd" == *"$KC_DIR"* ]]
}

# True when no thread of PID runs any more. kc_pid_ours is false as soon as the main thread is a
# zombie, but the other threads of a multi-threaded daemon can still be exiting then, holding its
# sockets: a restart on the same port would find it in use (seen under load: "Address already in
# use" from a provisioner restarted at once).
kc_pid_gone() {
	local t st
	for t in /proc/"$1"/task/*/stat; do
		[ -r "$t" ] || continue
		st="$({ sed 's/.*) //' "$t" | cut -d' ' -f1; } 2>/dev/null)" || continue
		case "$st" in Z | X | "") ;; *) return 1 ;; esac
	done
	return 0
}

# kc_stop_name NAME [GRACE]: SIGTERM, wait, SIGKILL, wait until no thread of it runs (at most 10 s
# more); removes NAME from DIR/pids.
kc_stop_name() {
	local name="$1" grace="${2:-10}" pid i
	pid="$(kc_pid_of "$name")"
	if kc_pid_ours "$pid"; then
		kill -TERM "$pid" 2>/dev/null || true
		for ((i = 0; i < grace * 10; i++)); do
			kc_pid_ours "$pid" || break
			sleep 0.1
		done
		if kc_pid_ours "$pid"; then
			kc_log "$name (pid $pid) ignored SIGTERM for $grace s: SIGKILL"
			kill -KILL "$pid" 2>/dev/null || true
			sleep 0.2
		fi
		for ((i = 0; i < 100; i++)); do
			kc_pid_gone "$pid" && break
			sleep 0.1
		done
	fi
	awk -v n="$name" '$1 != n' "$KC_DIR/pids" >"$KC_DIR/pids.new" && mv -f "$KC_DIR/pids.new" "$KC_DIR/pids"
}

kc_assert_running() {
	local name pid
	while read -r name pid; do
		kc_pid_ours "$pid" || kc_fail "$name (pid $pid) is not running (log: $KC_DIR/logs/$name.log)"
	done <"$KC_DIR/pids"
}

# kc_wait_for DESCRIPTION TIMEOUT CMD...: poll CMD every 0.5 s until it succeeds.
kc_wait_for() {
	local what="$1" timeout="$2" t0
	shift 2
	t0="$(kl_now)"
	until "$@" >/dev/null 2>&1; do
		kc_assert_running
		if awk -v a="$t0" -v b="$(kl_now)" -v t="$timeout" 'BEGIN { exit !(b - a > t) }'; then
			kc_fail "timed out after $timeout s waiting for $what"
		fi
		sleep 0.5
	done
}

# kc_restart_kubelet NODE TAG: starts NODE's kubelet again, with the flags and port it was
# started with (its index in KC_NODES), once the caller has stopped it (kc_stop_name
# kubelet-NODE); the old kubelet's log is kept as logs/kubelet-NODE.TAG, so that
# kc_kubelet_reregistered reads the new one's only.
kc_restart_kubelet() {
	local node="$1" tag="$2" i=0 n
	for n in "${KC_NODES[@]}"; do
		[ "$n" = "$node" ] && break
		i=$((i + 1))
	done
	[ "$i" -lt "${#KC_NODES[@]}" ] || kc_fail "kc_restart_kubelet: $node is not a node of this cluster (${KC_NODES[*]})"
	mv -f "$KC_DIR/logs/kubelet-$node.log" "$KC_DIR/logs/kubelet-$node.$tag"
	kc_start_kubelet "$node" "$i"
}

# kc_kubelet_reregistered NODE: the kubelet started by kc_restart_kubelet found its Node object
# (a predicate for kc_wait_for).
kc_kubelet_reregistered() {
	grep -q "Node $1 was previously registered" "$KC_DIR/logs/kubelet-$1.log"
}

kc_start_kubelet() { # NODE INDEX
	local node="$1" i="$2" nd
	nd="$(kc_node_dir "$node")"
	local flags=(
		--v=2
		--kubeconfig="$KC_DIR/$node.kubeconfig"
		--hostname-override="$node"
		--address=127.0.0.1
		--port="$(kc_port kubelet "$i")"
		--node-status-update-frequency=4s
		--volume-stats-agg-period=0
	)
	# The flags every kubelet of the test tiers shares (tests/kubelet/lib.sh, sourced above).
	kl_kubelet_flags flags "$nd/root" "$nd/pki" "$nd/seccomp" "$nd/plugins" "$(kc_runtime_sock "$node")"
	if [ -n "${KC_KUBELET_FLAGS+x}" ]; then
		flags+=("${KC_KUBELET_FLAGS[@]}")
	fi
	# The kubelet passes its environment to the drivers: FLEXVOL_CONFIG names this node's config.
	kc_spawn "kubelet-$node" "$KC_DIR/logs/kubelet-$node.log" \
		env FLEXVOL_CONFIG="$nd/${KC_NODE_CONFIG_FILE:-flexvol-config.json}" "$KC_BIN/kubelet" "${flags[@]}"
}

# kc_runtime_sock NODE: the CRI socket NODE's kubelet talks to.
kc_runtime_sock() {
	if [ "${KC_RUNTIME:-fake}" = containerd ]; then
		kcc_sock "$1"
	else
		echo "$(kc_node_dir "$1")/runtime.sock"
	fi
}

kc_start_runtime() { # NODE
	local nd
	nd="$(kc_node_dir "$1")"
	rm -f "$nd/runtime.sock"
	kc_spawn "runtime-$1" "$KC_DIR/logs/runtime-$1.log" "$KC_BIN/flexvol-fakeruntime" "unix://$nd/runtime.sock"
	kc_wait_for "the fake runtime of $1 ($nd/runtime.sock)" 20 test -S "$nd/runtime.sock"
}

kc_node_ready() {
	[ "$(kc_kubectl get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

# kc_install_drivers PLUGIN_DIR: flexvol's install.sh, as an operator would run it.
kc_install_drivers() {
	"$KC_REPO/install.sh" --plugin-dir "$1" --binary "$KC_FLEXVOL" --vendor flexvol \
		--drivers "${KC_DRIVERS:-hostpath,nfs,lvm}" >>"$KC_DIR/logs/install.log" 2>&1 ||
		kc_fail "install.sh --plugin-dir $1 failed: $(tail -n 5 "$KC_DIR/logs/install.log")"
}

# kc_flexvol_config DIR: a flexvol node config with its state, lock dir and call log under DIR.
kc_flexvol_config() {
	local d="$1" extra="${KC_NODE_CONFIG:-}"
	mkdir -p "$d/state" "$d/run"
	: >>"$d/flexvol.log"
	printf '{"stateDir":"%s/state","runDir":"%s/run","logFile":"%s/flexvol.log"%s}\n' \
		"$d" "$d" "$d" "${extra:+,$extra}" >"$d/flexvol-config.json"
}

# kc_resolve_flexvol: KC_FLEXVOL defaults to the newest release build in target/.
kc_resolve_flexvol() {
	if [ -z "${KC_FLEXVOL:-}" ]; then
		KC_FLEXVOL="$(ls -t "$KC_REPO/target/x86_64-unknown-linux-gnu/release/flexvol" "$KC_REPO/target/release/flexvol" 2>/dev/null | head -n1 || true)"
	fi
	[ -n "$KC_FLEXVOL" ] && [ -x "$KC_FLEXVOL" ] || kc_fail "no flexvol binary (cargo build --release, or set KC_FLEXVOL)"
}

# kc_up DIR NODE...: start the cluster; returns when every node is Ready.
kc_up() {
	[ "$#" -ge 2 ] || kc_fail "kc_up needs a directory and at least one node name"
	[ "$(id -u)" = 0 ] || kc_fail "must run as root (kubelets, mounts)"
	case "${KC_RUNTIME:=fake}" in
	fake) kc_init_dir "$1" kubelet kube-scheduler flexvol-fakeruntime ;;
	containerd)
		kcc_packages
		kc_init_dir "$1" kubelet kube-scheduler
		;;
	*) kc_fail "KC_RUNTIME must be fake or containerd, not $KC_RUNTIME" ;;
	esac
	shift
	KC_NODES=("$@")
	local t0 node i
	t0="$(kl_now)"

	# One cluster (or standalone kubelet e2e) per machine: kubelet 1.20 hard-codes
	# /var/lib/kubelet/device-plugins/kubelet.sock. etcd inherits the lock's file descriptor
	# and so holds the lock for the cluster's lifetime.
	exec {KC_LOCKFD}>"$KL_LOCK_FILE"
	if ! flock -n "$KC_LOCKFD"; then
		kc_log "another kubelet run holds $KL_LOCK_FILE; waiting (max 600 s)"
		flock -w 600 "$KC_LOCKFD" || kc_fail "timed out waiting for $KL_LOCK_FILE"
	fi

	# Host fix-ups (cpuinfo, cgroup2, sysctls kubelet rewrites), recorded for kc_down.
	KL_TMP="$KC_DIR"
	kl_host_prepare
	kc_write_state
	if [ "$KC_RUNTIME" = containerd ]; then
		local t1
		t1="$(kl_now)"
		kcc_images
		kcc_wrapper
		kc_log "images ready in $(kl_since "$t1") s: $KCC_IMAGE_PAUSE $KCC_IMAGE_BUSYBOX $KCC_IMAGE_FLEXVOL"
	fi
	kc_start_control_plane 1

	i=0
	for node in "${KC_NODES[@]}"; do
		local nd
		nd="$(kc_node_dir "$node")"
		mkdir -p "$nd/root" "$nd/plugins" "$nd/pki"
		kc_flexvol_config "$nd"
		[ "${KC_INSTALL_DRIVERS:-1}" = 0 ] || kc_install_drivers "$nd/plugins"
		if [ "$KC_RUNTIME" = containerd ]; then
			kcc_start_node "$node" "$i"
		else
			kc_start_runtime "$node"
		fi
		kc_start_kubelet "$node" "$i"
		i=$((i + 1))
	done
	for node in "${KC_NODES[@]}"; do
		kc_wait_for "node $node to be Ready" 300 kc_node_ready "$node"
	done
	# Pods need their namespace's default service account (the ServiceAccount admission plugin).
	kc_wait_for "the default service account" 180 kc_kubectl -n default get serviceaccount default
	KC_UP_SECONDS="$(kl_since "$t0")"
	kc_log "cluster up in $KC_UP_SECONDS s: nodes ${KC_NODES[*]}; KUBECONFIG=$KC_DIR/admin.kubeconfig"
}

# kc_up_control_plane DIR: etcd, kube-apiserver and kube-controller-manager only: no scheduler, no
# kubelets, so neither the kubelet lock nor host fix-ups (use a KC_PORT_BASE other than CI's
# 17000). Node objects, if wanted, are the caller's to create. kc_down stops it.
kc_up_control_plane() {
	[ "$#" = 1 ] || kc_fail "kc_up_control_plane needs a directory"
	kc_init_dir "$1"
	KC_NODES=()
	local t0
	t0="$(kl_now)"
	KL_SYSCTL_SAVED=() KL_CPUINFO_BOUND=0 KL_CGROUP_MOUNTED=0 KL_CREATED_HOST_DIRS=()
	KC_RUNTIME=none
	kc_write_state
	kc_start_control_plane 0
	kc_wait_for "the default service account" 180 kc_kubectl -n default get serviceaccount default
	KC_UP_SECONDS="$(kl_since "$t0")"
	kc_log "control plane up in $KC_UP_SECONDS s (no kubelets); KUBECONFIG=$KC_DIR/admin.kubeconfig"
}

# kc_init_dir DIR [BINARY...]: KC_DIR, KC_BIN (the cache, built on demand by tests/kubelet/setup),
# KC_FLEXVOL and the directory layout; fails unless the control plane's binaries and the named
# ones are in KC_BIN.
kc_init_dir() {
	KC_DIR="$1"
	shift
	if [ -z "${KC_BIN:-}" ]; then
		KC_BIN="$("$KC_REPO/tests/kubelet/setup" | tail -n1)/bin"
	fi
	local b
	for b in etcd kube-apiserver kube-controller-manager kubectl flexvol-pki "$@"; do
		[ -x "$KC_BIN/$b" ] || kc_fail "no $b in $KC_BIN (run tests/kubelet/setup)"
	done
	kc_resolve_flexvol
	[ ! -e "$KC_DIR/state" ] || kc_fail "$KC_DIR already holds a cluster (tests/cluster/down $KC_DIR)"
	mkdir -p "$KC_DIR"/{logs,etcd,controller/plugins}
	chmod 755 "$KC_DIR"
	: >"$KC_DIR/pids"
}

# kc_write_state: DIR/state, what kc_load (and so kc_down) reads back.
kc_write_state() {
	{
		declare -p KC_BIN KC_FLEXVOL KC_NODES KC_RUNTIME KCC_BRIDGES KCC_CGROUP_DIRS
		declare -p KL_SYSCTL_SAVED KL_CPUINFO_BOUND KL_CGROUP_MOUNTED KL_CREATED_HOST_DIRS
		echo "KC_PORT_BASE=${KC_PORT_BASE:-17000}"
	} | sed 's/^declare /declare -g /' >"$KC_DIR/state" # (-g: kc_load sources it in a function)
}

# kc_start_control_plane WITH_SCHEDULER: the PKI (a client certificate per KC_NODES entry), etcd
# (which alone inherits KC_LOCKFD, when set; closed here afterwards), kube-apiserver (until
# ready), kube-controller-manager with flexvol in its plugin dir, kube-scheduler when
# WITH_SCHEDULER is 1.
kc_start_control_plane() {
	local with_scheduler="$1" node
	# PKI: a CA, serving certificates, one client certificate per identity.
	local clients=(admin=flexvol-admin/system:masters kcm=system:kube-controller-manager
		scheduler=system:kube-scheduler etcd-client=kube-apiserver-etcd-client)
	for node in "${KC_NODES[@]}"; do
		clients+=("$node=system:node:$node/system:nodes")
	done
	"$KC_BIN/flexvol-pki" "$KC_DIR/pki" "${clients[@]}" || kc_fail "flexvol-pki failed"
	if [ "${KC_RUNTIME:-fake}" = containerd ]; then kcc_api_cert; fi
	kc_write_kubeconfig "$KC_DIR/admin.kubeconfig" admin
	kc_write_kubeconfig "$KC_DIR/kcm.kubeconfig" kcm
	kc_write_kubeconfig "$KC_DIR/scheduler.kubeconfig" scheduler
	for node in "${KC_NODES[@]}"; do
		kc_write_kubeconfig "$KC_DIR/$node.kubeconfig" "$node"
	done
	cat >"$KC_DIR/env" <<EOF
# source this file to use the test cluster: kubectl is the one built with it
export KUBECONFIG="$KC_DIR/admin.kubeconfig"
export PATH="$KC_BIN:\$PATH"
EOF

	# etcd, TLS for clients (mutual) and peers, on loopback.
	local pki="$KC_DIR/pki" etcd_url bind=127.0.0.1
	# Pods (real containers) reach the API server through their node's bridge at KCC_API_HOST, an
	# address of this machine (no kube-proxy here): then it listens on every address, as usual.
	if [ "${KC_RUNTIME:-fake}" = containerd ]; then bind=0.0.0.0; fi
	etcd_url="https://127.0.0.1:$(kc_port etcd)"
	kc_spawn etcd "$KC_DIR/logs/etcd.log" "$KC_BIN/etcd" --name flexvol --data-dir "$KC_DIR/etcd" \
		--listen-client-urls "$etcd_url" --advertise-client-urls "$etcd_url" \
		--listen-peer-urls "http://127.0.0.1:$(kc_port etcd-peer)" \
		--initial-advertise-peer-urls "http://127.0.0.1:$(kc_port etcd-peer)" \
		--initial-cluster "flexvol=http://127.0.0.1:$(kc_port etcd-peer)" \
		--cert-file "$pki/apiserver.crt" --key-file "$pki/apiserver.key" \
		--client-cert-auth --trusted-ca-file "$pki/ca.crt" \
		--log-level warn --logger zap
	if [ -n "${KC_LOCKFD:-}" ]; then exec {KC_LOCKFD}>&-; fi
	KC_LOCKFD=""

	kc_spawn kube-apiserver "$KC_DIR/logs/kube-apiserver.log" "$KC_BIN/kube-apiserver" \
		--etcd-servers="$etcd_url" --etcd-cafile="$pki/ca.crt" \
		--etcd-certfile="$pki/etcd-client.crt" --etcd-keyfile="$pki/etcd-client.key" \
		--bind-address="$bind" --advertise-address=127.0.0.1 \
		--secure-port="$(kc_port apiserver)" --insecure-port=0 \
		--tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
		--client-ca-file="$pki/ca.crt" --anonymous-auth=false \
		--authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
		--service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
		--service-account-issuer=https://kubernetes.default.svc \
		--service-cluster-ip-range=10.254.0.0/24 --allow-privileged=true \
		--cert-dir="$KC_DIR/apiserver-certs" --profiling=false --v=1
	kc_wait_for "the API server to be ready (/readyz)" 600 kc_kubectl get --raw /readyz

	kc_spawn kube-controller-manager "$KC_DIR/logs/kube-controller-manager.log" \
		env FLEXVOL_CONFIG="$KC_DIR/controller/flexvol-config.json" "$KC_BIN/kube-controller-manager" \
		--kubeconfig="$KC_DIR/kcm.kubeconfig" --use-service-account-credentials=true \
		--service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
		--flex-volume-plugin-dir="$KC_DIR/controller/plugins" \
		--leader-elect=false --port=0 --secure-port=0 --profiling=false \
		--controllers='*,-bootstrapsigner,-tokencleaner' --v=2
	if [ "$with_scheduler" = 1 ]; then kc_start_scheduler "$KC_DIR/logs/kube-scheduler.log"; fi
	kc_flexvol_config "$KC_DIR/controller"
	kc_install_drivers "$KC_DIR/controller/plugins"
}

# kc_start_scheduler LOG [CONFIG]: kube-scheduler as user system:kube-scheduler. Without CONFIG,
# flags only (no leader election); with CONFIG, as `kube-scheduler --config=CONFIG`: a
# KubeSchedulerConfiguration, which names its kubeconfig (clientConnection.kubeconfig) and leader
# election itself; 1.20 ignores the other deprecated flags then, except --port (0: no insecure
# port). kc_restart_scheduler [CONFIG]: the running one stopped first, each start with a log of
# its own (kube-scheduler-N.log).
kc_start_scheduler() {
	if [ -n "${2:-}" ]; then
		kc_spawn kube-scheduler "$1" "$KC_BIN/kube-scheduler" --config="$2" --port=0 --secure-port=0 --v=2
	else
		kc_spawn kube-scheduler "$1" "$KC_BIN/kube-scheduler" \
			--kubeconfig="$KC_DIR/scheduler.kubeconfig" --leader-elect=false --port=0 --secure-port=0 \
			--profiling=false --v=1
	fi
}
kc_restart_scheduler() {
	local n=2
	kc_stop_name kube-scheduler 10
	while [ -e "$KC_DIR/logs/kube-scheduler-$n.log" ]; do n=$((n + 1)); done
	kc_start_scheduler "$KC_DIR/logs/kube-scheduler-$n.log" "${1:-}"
}

# kc_down [DIR]: stop everything kc_up started, unmount everything under DIR, undo the host
# fix-ups, remove DIR (unless KC_KEEP=1 or something is still mounted there).
kc_down() {
	local dir="${1:-$KC_DIR}" name pid
	[ -n "$dir" ] || return 0
	kc_load "$dir" || return 0
	# Kubelets first (they call the drivers), then the controllers, etcd last.
	for name in $(awk '$1 ~ /^kubelet-/ { print $1 }' "$KC_DIR/pids"); do kc_stop_name "$name" 10; done
	if [ "${KC_RUNTIME:-fake}" = containerd ]; then
		for node in "${KC_NODES[@]}"; do kcc_node_down "$node"; done
		kcc_down_bridges
	fi
	# kube-apiserver gets 2 s: its graceful shutdown waits on the watches still open (it used to take
	# the whole 10 s, then SIGKILL, at every teardown), and this cluster's data is thrown away anyway.
	for name in kube-controller-manager kube-scheduler kube-apiserver etcd; do
		kc_stop_name "$name" "$([ "$name" = kube-apiserver ] && echo 2 || echo 10)"
	done
	while read -r name pid; do kc_stop_name "$name" 5; done < <(cat "$KC_DIR/pids")
	for node in "${KC_NODES[@]}"; do
		kl_unmount_all_under "$(kc_node_dir "$node")/root" || true
	done
	kl_unmount_all_under "$KC_DIR" || true
	if [ "$KL_CPUINFO_BOUND" = 1 ]; then umount /proc/cpuinfo || true; fi
	if [ "$KL_CGROUP_MOUNTED" = 1 ]; then umount /sys/fs/cgroup || true; fi
	local kv d
	for kv in "${KL_SYSCTL_SAVED[@]}"; do
		if [ "$(cat "/proc/sys/${kv%%=*}")" != "${kv#*=}" ]; then
			echo "${kv#*=}" >"/proc/sys/${kv%%=*}" 2>/dev/null || kc_log "could not restore sysctl ${kv%%=*}"
		fi
	done
	for d in "${KL_CREATED_HOST_DIRS[@]}"; do
		[ -d "$d" ] && rm -rf --one-file-system "$d"
	done
	rm -f "$KC_DIR/state"
	if [ -n "$(kl_mounts_under "$KC_DIR")" ] || kl_is_mounted "$KC_DIR"; then
		kc_log "NOT removing $KC_DIR: something is still mounted there"
		return 1
	elif [ "${KC_KEEP:-0}" = 1 ]; then
		kc_log "kept $KC_DIR"
	else
		rm -rf --one-file-system "$KC_DIR"
	fi
}
