# shellcheck shell=bash
# tests/kubelet/lib.sh — run a real, standalone kubelet (static pods, fake CRI
# runtime) against FlexVolume drivers. Sourced by tests/kubelet/e2e; usable by
# other harnesses (e.g. inside the test guest):
#
#   source tests/kubelet/lib.sh
#   trap kl_cleanup EXIT
#   kl_init                          # temp dirs, FLEXVOL_CONFIG, host fix-ups
#   <install drivers into "$KL_PLUGIN_DIR">
#   kl_start "$(tests/kubelet/setup)"  # fake runtime + kubelet
#   kl_write_pod pod1 "$uid" data flexvol/hostpath '{"path":"/x"}' ""
#   kl_wait_mounted "$(kl_pod_volume_dir "$uid" flexvol/hostpath data)" 90
#   kl_remove_pod pod1
#   kl_wait_unmounted "$dir" 60
#
# Everything lives under one temp dir ($KL_TMP); kl_cleanup kills what
# kl_start started, unmounts everything under $KL_TMP, undoes the host
# fix-ups and removes $KL_TMP (only when nothing is mounted there any more).
#
# Caller-settable before kl_init:
#   KL_TMP_PARENT  where the temp dir goes (default ${TMPDIR:-/tmp})
#   KL_NODE_NAME   kubelet --hostname-override (default flexvol-e2e)
#   KL_VERBOSITY   kubelet --v (default 2; >=1 needed for SetUp messages)
#   KL_KEEP        1: keep $KL_TMP (logs) after cleanup
#   KL_EXTRA_KUBELET_FLAGS  array of extra kubelet flags

KL_TMP=""
KL_KUBELET_LOG=""
KL_RUNTIME_LOG=""
KL_DRIVER_LOG=""
KL_KUBELET_PID=""
KL_RUNTIME_PID=""
KL_KUBELET_T0=""
KL_CPUINFO_BOUND=0
KL_CGROUP_MOUNTED=0
KL_SYSCTL_SAVED=()
KL_CREATED_HOST_DIRS=()
KL_POD_UIDS=()
# Host paths the kubelet 1.20 creates regardless of --root-dir (device-plugin
# socket dir is hard-coded; container log dirs). Removed again by kl_cleanup
# when they did not exist before.
KL_HOST_DIRS=(/var/lib/kubelet /var/log/pods /var/log/containers)
KL_LOCK_FILE="${KL_LOCK_FILE:-/run/flexvol-kubelet-e2e.lock}"
KL_LOG_TAIL_LINES="${KL_LOG_TAIL_LINES:-40}"

kl_log() { echo "kubelet-e2e: $*" >&2; }
kl_now() { date +%s.%N; }
kl_since() { awk -v a="$1" -v b="$(kl_now)" 'BEGIN { printf "%.1f", b - a }'; }

# Print the tails of the kubelet, runtime and driver logs to stderr.
kl_dump_logs() {
	local f
	for f in "$KL_KUBELET_LOG" "$KL_RUNTIME_LOG" "$KL_DRIVER_LOG"; do
		[ -n "$f" ] || continue
		echo "----- tail -n $KL_LOG_TAIL_LINES $f -----" >&2
		if [ -s "$f" ]; then
			tail -n "$KL_LOG_TAIL_LINES" "$f" >&2
		else
			echo "(empty or missing)" >&2
		fi
	done
	if [ -n "$KL_KUBELET_LOG" ] && [ -s "$KL_KUBELET_LOG" ]; then
		echo "----- kubelet log: first volume/driver errors -----" >&2
		grep -E 'driver-call\.go|Flexvolume|flexvolume|MountVolume\.SetUp failed|TearDown failed|no volume plugin matched' \
			"$KL_KUBELET_LOG" | cut -c1-400 | head -n 6 >&2 || true
	fi
	echo "----- mounts under $KL_TMP -----" >&2
	kl_mounts_under "$KL_TMP" >&2 || true
	echo "-----" >&2
}

kl_fail() {
	echo "kubelet-e2e: FAIL: $*" >&2
	# tests/run prints these lines in its summary, where a failure is not lost under the logs.
	[ -z "${FLEXVOL_FAILURES:-}" ] || echo "$(date +%T) kubelet-e2e: FAIL: $*" | cut -c1-600 >>"$FLEXVOL_FAILURES"
	kl_dump_logs
	exit 1
}

# kl_init: temp dirs, driver config, host fix-ups. Sets KL_* paths and
# exports FLEXVOL_CONFIG. $KL_CONFIG_EXTRA, if set, is more config members
# (e.g. "lvm":{"allowedVolumeGroups":["vg0"]}).
kl_init() {
	local parent="${KL_TMP_PARENT:-${TMPDIR:-/tmp}}"
	# One kubelet at a time per host: they would share the hard-coded
	# /var/lib/kubelet/device-plugins/kubelet.sock.
	exec {KL_LOCK_FD}>"$KL_LOCK_FILE"
	if ! flock -n "$KL_LOCK_FD"; then
		kl_log "another kubelet e2e run holds $KL_LOCK_FILE; waiting (max 600 s)"
		flock -w 600 "$KL_LOCK_FD" || { kl_log "FAIL: timed out waiting for $KL_LOCK_FILE"; exit 1; }
	fi
	KL_TMP="$(mktemp -d "$parent/flexvol-kubelet.XXXXXX")"
	chmod 755 "$KL_TMP"
	KL_ROOT="$KL_TMP/root"
	KL_PLUGIN_DIR="$KL_TMP/plugins"
	KL_MANIFESTS="$KL_TMP/manifests"
	KL_LOGDIR="$KL_TMP/logs"
	KL_DATA="$KL_TMP/data"
	KL_SOCK="$KL_TMP/runtime.sock"
	KL_KUBELET_LOG="$KL_LOGDIR/kubelet.log"
	KL_RUNTIME_LOG="$KL_LOGDIR/fakeruntime.log"
	KL_DRIVER_LOG="$KL_LOGDIR/flexvol.log"
	KL_CONFIG="$KL_TMP/flexvol-config.json"
	KL_NODE_NAME="${KL_NODE_NAME:-flexvol-e2e}"
	mkdir -p "$KL_ROOT" "$KL_PLUGIN_DIR" "$KL_MANIFESTS" "$KL_LOGDIR" "$KL_DATA" \
		"$KL_TMP/state" "$KL_TMP/run"
	: >"$KL_DRIVER_LOG"
	cat >"$KL_CONFIG" <<EOF
{"stateDir":"$KL_TMP/state","runDir":"$KL_TMP/run","logFile":"$KL_DRIVER_LOG","hostpath":{"allowedRoots":["$KL_DATA"]}${KL_CONFIG_EXTRA:+,$KL_CONFIG_EXTRA}}
EOF
	export FLEXVOL_CONFIG="$KL_CONFIG"
	kl_host_prepare
}

# Host fix-ups the kubelet needs; all undone by kl_cleanup.
kl_host_prepare() {
	local k d
	for d in "${KL_HOST_DIRS[@]}"; do
		[ -e "$d" ] || KL_CREATED_HOST_DIRS+=("$d")
	done
	# The kubelet's container manager rewrites these sysctls (it is not run
	# with --protect-kernel-defaults): save them to restore them afterwards.
	for k in vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops \
		kernel/keys/root_maxkeys kernel/keys/root_maxbytes; do
		if [ -r "/proc/sys/$k" ]; then
			KL_SYSCTL_SAVED+=("$k=$(cat "/proc/sys/$k")")
		fi
	done
	# cadvisor refuses to start without a "cpu MHz" line (user-mode-linux).
	if ! grep -q '^cpu MHz' /proc/cpuinfo; then
		kl_log "no 'cpu MHz' in /proc/cpuinfo: bind-mounting a copy with one"
		awk '{ print } /^processor/ { print "cpu MHz\t\t: 1000.000" }' /proc/cpuinfo >"$KL_TMP/cpuinfo"
		mount --bind "$KL_TMP/cpuinfo" /proc/cpuinfo
		KL_CPUINFO_BOUND=1
	fi
	# The kubelet needs a cgroup hierarchy at /sys/fs/cgroup (v1 or v2).
	if ! mountpoint -q /sys/fs/cgroup; then
		kl_log "nothing mounted on /sys/fs/cgroup: mounting cgroup2"
		mkdir -p /sys/fs/cgroup
		mount -t cgroup2 none /sys/fs/cgroup
		KL_CGROUP_MOUNTED=1
	fi
}

# kl_kubelet_flags ARRAY ROOT_DIR CERT_DIR SECCOMP_DIR PLUGIN_DIR RUNTIME_SOCK
# Appends to the array named ARRAY the flags every kubelet of both kubelet tiers runs with (this
# file's standalone kubelet and each node of tests/cluster): its own directories, the fake CRI
# runtime at RUNTIME_SOCK, no read-only or healthz port, and none of the host's swap, cgroups,
# iptables, image GC or eviction touched. The one list: each tier adds only its own flags (node
# name, verbosity, API server, ports, static pods). kubelet reads flags in any order.
kl_kubelet_flags() {
	local -n kl_flags_out="$1"
	kl_flags_out+=(
		--root-dir="$2"
		--cert-dir="$3"
		--seccomp-profile-root="$4"
		--volume-plugin-dir="$5"
		--container-runtime=remote
		--container-runtime-endpoint="unix://$6"
		--image-service-endpoint="unix://$6"
		--runtime-request-timeout=30s
		--sync-frequency=10s
		--read-only-port=0
		--healthz-port=0
		--fail-swap-on=false
		--cgroups-per-qos=false
		--enforce-node-allocatable=
		--cgroup-driver=cgroupfs
		--make-iptables-util-chains=false
		--hairpin-mode=none
		--image-gc-high-threshold=100
		--image-gc-low-threshold=99
		--eviction-hard=
		--eviction-soft=
	)
}

# kl_start CACHE_DIR: start the fake CRI runtime and the kubelet from
# CACHE_DIR/bin (the directory printed by tests/kubelet/setup).
kl_start() {
	local bin="$1/bin" i
	{ [ -x "$bin/kubelet" ] && [ -x "$bin/flexvol-fakeruntime" ]; } || kl_fail "no kubelet/fake runtime in $bin (run tests/kubelet/setup)"
	"$bin/flexvol-fakeruntime" "unix://$KL_SOCK" >"$KL_RUNTIME_LOG" 2>&1 {KL_LOCK_FD}>&- &
	KL_RUNTIME_PID=$!
	for ((i = 0; i < 100; i++)); do
		[ -S "$KL_SOCK" ] && break
		kill -0 "$KL_RUNTIME_PID" 2>/dev/null || kl_fail "fake runtime exited"
		sleep 0.1
	done
	[ -S "$KL_SOCK" ] || kl_fail "fake runtime did not create $KL_SOCK within 10 s"

	local flags=(
		--v="${KL_VERBOSITY:-2}"
		--hostname-override="$KL_NODE_NAME"
		--pod-manifest-path="$KL_MANIFESTS"
		--file-check-frequency=1s
		--enable-controller-attach-detach=false
		--enable-server=false
	)
	kl_kubelet_flags flags "$KL_ROOT" "$KL_TMP/pki" "$KL_TMP/seccomp" "$KL_PLUGIN_DIR" "$KL_SOCK"
	if [ -n "${KL_EXTRA_KUBELET_FLAGS+x}" ]; then
		flags+=("${KL_EXTRA_KUBELET_FLAGS[@]}")
	fi
	printf '%s\n' "$bin/kubelet" "${flags[@]}" >"$KL_LOGDIR/kubelet.cmdline"
	# shellcheck disable=SC2034 # read by callers (start -> mount timing)
	KL_KUBELET_T0="$(kl_now)"
	FLEXVOL_CONFIG="$KL_CONFIG" "$bin/kubelet" "${flags[@]}" >"$KL_KUBELET_LOG" 2>&1 {KL_LOCK_FD}>&- &
	KL_KUBELET_PID=$!
	kl_log "kubelet pid $KL_KUBELET_PID (root $KL_ROOT, plugins $KL_PLUGIN_DIR), fake runtime pid $KL_RUNTIME_PID"
}

kl_assert_running() {
	if [ -n "$KL_KUBELET_PID" ] && ! kill -0 "$KL_KUBELET_PID" 2>/dev/null; then
		local rc=0
		wait "$KL_KUBELET_PID" || rc=$?
		KL_KUBELET_PID=""
		kl_fail "kubelet exited (status $rc)"
	fi
	if [ -n "$KL_RUNTIME_PID" ] && ! kill -0 "$KL_RUNTIME_PID" 2>/dev/null; then
		KL_RUNTIME_PID=""
		kl_fail "fake runtime exited"
	fi
}

# kl_write_pod NAME UID VOLNAME DRIVER OPTIONS_JSON FSTYPE [READONLY]
# Writes a static pod manifest (JSON) with one inline flexVolume. OPTIONS_JSON
# must be a JSON object of strings; it is embedded verbatim. The file is
# written under a dot-name and renamed, so the kubelet never reads half of it.
kl_write_pod() {
	local name="$1" uid="$2" vol="$3" driver="$4" options="$5" fstype="$6" ro="${7:-false}"
	local fs_json=""
	[ -n "$fstype" ] && fs_json="\"fsType\": \"$fstype\","
	cat >"$KL_MANIFESTS/.$name.json" <<EOF
{
  "apiVersion": "v1",
  "kind": "Pod",
  "metadata": {"name": "$name", "namespace": "default", "uid": "$uid"},
  "spec": {
    "containers": [{
      "name": "main",
      "image": "busybox",
      "command": ["sleep", "3600"],
      "volumeMounts": [{"name": "$vol", "mountPath": "/data"}]
    }],
    "volumes": [{
      "name": "$vol",
      "flexVolume": {"driver": "$driver", $fs_json "readOnly": $ro, "options": $options}
    }]
  }
}
EOF
	mv -f "$KL_MANIFESTS/.$name.json" "$KL_MANIFESTS/$name.json"
	KL_POD_UIDS+=("$uid")
}

kl_remove_pod() { rm -f "$KL_MANIFESTS/$1.json"; }

# kl_pod_volume_dir UID DRIVER VOLNAME -> <root>/pods/<uid>/volumes/<vendor>~<driver>/<vol>
kl_pod_volume_dir() { echo "$KL_ROOT/pods/$1/volumes/${2//\//\~}/$3"; }

kl_new_uid() { cat /proc/sys/kernel/random/uuid; }

# Mountinfo lines whose mount point is exactly $1.
kl_mountinfo_for() { awk -v p="$1" '$5 == p' /proc/self/mountinfo; }
kl_is_mounted() { [ -n "$(kl_mountinfo_for "$1")" ]; }
# Mount points strictly under directory $1 (deepest/latest last).
kl_mounts_under() { awk -v p="$1/" 'index($5, p) == 1 { print $5 }' /proc/self/mountinfo; }

# kl_wait_mounted DIR TIMEOUT [VOLNAME]: wait until DIR is a mount point.
# Fails early when the kubelet reports SetUp success for VOLNAME but nothing
# is mounted (a driver that lies), when a driver's init keeps failing for 10 s,
# or when the kubelet dies.
kl_wait_mounted() {
	local dir="$1" timeout="$2" vol="${3:-}" t0 lied_at="" init_err_at=""
	t0="$(kl_now)"
	while ! kl_is_mounted "$dir"; do
		kl_assert_running
		if [ -n "$vol" ] && [ -z "$lied_at" ] &&
			grep -q "MountVolume.SetUp succeeded for volume \\\\\?\"$vol\\\\\?\"" "$KL_KUBELET_LOG" 2>/dev/null; then
			lied_at="$(kl_now)"
		fi
		if [ -z "$init_err_at" ] && grep -q "Error creating Flexvolume plugin from directory" "$KL_KUBELET_LOG" 2>/dev/null; then
			init_err_at="$(kl_now)"
		fi
		if [ -n "$init_err_at" ] && awk -v a="$init_err_at" -v b="$(kl_now)" 'BEGIN { exit !(b - a > 10) }'; then
			kl_fail "$dir not mounted, and the kubelet could not load a driver for 10 s: $(grep -m1 -o 'Error creating Flexvolume plugin from directory.*' "$KL_KUBELET_LOG" | cut -c1-300)"
		fi
		if [ -n "$lied_at" ] && awk -v a="$lied_at" -v b="$(kl_now)" 'BEGIN { exit !(b - a > 3) }'; then
			kl_fail "kubelet reports MountVolume.SetUp succeeded for volume \"$vol\" but $dir is not a mount point (driver said Success without mounting)"
		fi
		if awk -v a="$t0" -v b="$(kl_now)" -v t="$timeout" 'BEGIN { exit !(b - a > t) }'; then
			kl_fail "$dir not mounted within $timeout s"
		fi
		sleep 0.2
	done
}

# kl_wait_unmounted DIR TIMEOUT: wait until DIR is no mount point and gone
# (kubelet removes the pod volume dir after a successful TearDown).
kl_wait_unmounted() {
	local dir="$1" timeout="$2" t0
	t0="$(kl_now)"
	while kl_is_mounted "$dir" || [ -e "$dir" ]; do
		kl_assert_running
		if awk -v a="$t0" -v b="$(kl_now)" -v t="$timeout" 'BEGIN { exit !(b - a > t) }'; then
			if kl_is_mounted "$dir"; then
				kl_fail "$dir still mounted $timeout s after the manifest was removed"
			fi
			kl_fail "$dir unmounted but not removed by the kubelet within $timeout s (TearDown failed?)"
		fi
		sleep 0.2
	done
}

# kl_wait_no_mounts_under DIR TIMEOUT: wait until nothing is mounted strictly
# under DIR (attachable drivers: the global device mount goes after the pod's).
kl_wait_no_mounts_under() {
	local dir="$1" timeout="$2" t0
	t0="$(kl_now)"
	while [ -n "$(kl_mounts_under "$dir")" ]; do
		kl_assert_running
		if awk -v a="$t0" -v b="$(kl_now)" -v t="$timeout" 'BEGIN { exit !(b - a > t) }'; then
			kl_fail "still mounted under $dir after $timeout s: $(kl_mounts_under "$dir" | tr '\n' ' ')"
		fi
		sleep 0.2
	done
}

# Stop a process we started: SIGTERM, wait up to $2 s, then SIGKILL.
kl_stop_pid() {
	local pid="$1" grace="${2:-10}" i
	[ -n "$pid" ] || return 0
	kill -TERM "$pid" 2>/dev/null || return 0
	for ((i = 0; i < grace * 10; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null; then
		kl_log "pid $pid ignored SIGTERM for $grace s: SIGKILL"
		kill -KILL "$pid" 2>/dev/null || true
	fi
	wait "$pid" 2>/dev/null || true
}

kl_stop() {
	kl_stop_pid "$KL_KUBELET_PID" 10
	KL_KUBELET_PID=""
	kl_stop_pid "$KL_RUNTIME_PID" 5
	KL_RUNTIME_PID=""
}

# Unmount everything under $1 (and $1 itself), innermost first; bounded.
kl_unmount_all_under() {
	local top="$1" round mp left
	for ((round = 0; round < 20; round++)); do
		left="$( (kl_mountinfo_for "$top" | awk '{ print $5 }'; kl_mounts_under "$top") | awk '{ print length($0) "\t" $0 }' | sort -rn -s -k1,1 | cut -f2-)"
		[ -n "$left" ] || return 0
		while IFS= read -r mp; do
			umount "$mp" 2>/dev/null || umount -l "$mp" 2>/dev/null || true
		done <<<"$left"
	done
	kl_log "WARNING: still mounted under $top: $(kl_mounts_under "$top" | tr '\n' ' ')"
	return 1
}

kl_cleanup() {
	local rc=$? kv
	set +e
	kl_stop
	if [ -n "$KL_TMP" ] && [ -d "$KL_TMP" ]; then
		kl_unmount_all_under "$KL_ROOT"
		kl_unmount_all_under "$KL_TMP"
	fi
	if [ "$KL_CPUINFO_BOUND" = 1 ]; then
		umount /proc/cpuinfo && KL_CPUINFO_BOUND=0
	fi
	if [ "$KL_CGROUP_MOUNTED" = 1 ]; then
		umount /sys/fs/cgroup && KL_CGROUP_MOUNTED=0
	fi
	for kv in "${KL_SYSCTL_SAVED[@]}"; do
		if [ "$(cat "/proc/sys/${kv%%=*}")" != "${kv#*=}" ]; then
			echo "${kv#*=}" >"/proc/sys/${kv%%=*}" 2>/dev/null || kl_log "could not restore sysctl ${kv%%=*}"
		fi
	done
	KL_SYSCTL_SAVED=()
	local d u
	for u in "${KL_POD_UIDS[@]}"; do
		for d in /var/log/pods/*_"$u"; do
			[ -d "$d" ] && rm -rf --one-file-system "$d"
		done
	done
	for d in "${KL_CREATED_HOST_DIRS[@]}"; do
		[ -d "$d" ] && rm -rf --one-file-system "$d"
	done
	KL_CREATED_HOST_DIRS=()
	if [ -n "$KL_TMP" ] && [ -d "$KL_TMP" ]; then
		if [ -n "$(kl_mounts_under "$KL_TMP")" ] || kl_is_mounted "$KL_TMP"; then
			kl_log "NOT removing $KL_TMP: something is still mounted there"
		elif [ "${KL_KEEP:-0}" = 1 ]; then
			kl_log "kept $KL_TMP"
		else
			rm -rf --one-file-system "$KL_TMP"
		fi
	fi
	return "$rc"
}
