# shellcheck shell=bash
# tests/cluster/containers.sh — real containers for the test cluster: one containerd per node,
# CNI networking, locally built images. Sourced by lib.sh; kc_up uses it when KC_RUNTIME=containerd
# (the default stays kubelet's fake CRI runtime, flexvol-fakeruntime).
#
# Per node NODE (nd = DIR/nodes/NODE), nothing shared between the nodes' runtimes (kubelet stops
# every pod sandbox its runtime has that it does not know, so two kubelets on one containerd
# would kill each other's pods):
#   containerd   --config nd/containerd/config.toml: root, state, gRPC/ttrpc sockets and runc's
#                state under nd/containerd; the CRI plugin with the overlayfs snapshotter, cgroupfs,
#                sandbox_image = the locally built pause image; namespace k8s.io
#   runtime      io.containerd.runc.v2 with BinaryName = DIR/bin/runc-oom-wrapper (below)
#   network      CNI bridge fvbr<i> (10.88.<10+i>.0/24, gateway .1 made by kc_up so that every
#                node's pods can reach the API server at KCC_API_HOST from the start) + host-local
#                IPAM (its allocations under nd/cni); no masquerade, no iptables rule, no port map
#   images       imported with `ctr -n k8s.io images import` from docker-archive tarballs written
#                by image.py (no registry, no engine): KCC_IMAGE_PAUSE, KCC_IMAGE_BUSYBOX (Debian's
#                busybox-static), KCC_IMAGE_FLEXVOL (drivers/deploy/Containerfile.prebuilt over the
#                release binary KC_FLEXVOL); cached under $FLEXVOL_CACHE/images by input hash
#
# THIS MACHINE'S WORKAROUND (not a property of nodes): the test machines lack CAP_SYS_RESOURCE, so
# no process may lower its oom_score_adj. kubelet gives the pod sandbox -998 (and Guaranteed pods
# -997); runc then fails with "can't get final child's PID from pipe: EOF" (its --debug log says
# "failed to update /proc/self/oom_score_adj: Permission denied"). runc-oom-wrapper, the runtime's
# BinaryName, raises a negative process.oomScoreAdj in the bundle's config.json to 0 before it
# execs /usr/sbin/runc. Real nodes run containerd as full root and need none of this.
#
# kc_down (kcc_node_down) removes everything: it kills and deletes every container through runc's
# state under nd/containerd/runc (so even after containerd died), stops containerd and its shims,
# unmounts and removes the pods' network namespaces (from runc's state), deletes the bridge.

KCC_CACHE="${FLEXVOL_CACHE:-/var/tmp/flexvol-cache}/images"
KCC_API_HOST=10.88.10.1 # node-a's bridge gateway: an address of this machine every pod reaches (in the API server's certificate)
KCC_BRIDGES=()
KCC_CGROUP_DIRS=() # the cgroup parents (<controller>/k8s.io) containerd made: kc_down removes them
KCC_IMAGE_PAUSE="" KCC_IMAGE_BUSYBOX="" KCC_IMAGE_FLEXVOL=""
KCC_IMAGE_TARS=()

kcc_log() { echo "containers: $*" >&2; }

# kcc_packages: containerd, runc and the CNI plugins from Debian when missing. No service may
# start (containerd's unit would run a containerd on /run/containerd): Debian's policy-rc.d
# interface says no for the install, unless the host has a policy of its own (as .ci/run).
kcc_packages() {
	if kcc_in_guest; then
		kcc_guest_packages
		return 0
	fi
	local need=()
	command -v containerd >/dev/null || need+=(containerd)
	command -v ctr >/dev/null || need+=(containerd)
	[ -x /usr/sbin/runc ] || need+=(runc)
	[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/loopback ] ||
		need+=(containernetworking-plugins)
	[ "${#need[@]}" = 0 ] && return 0
	kcc_log "installing ${need[*]} (Debian packages; no service started)"
	# shellcheck source=../lib/apt.sh
	source "$KC_REPO/tests/lib/apt.sh"
	apt_ensure_known "${need[@]}"
	local own_policy=""
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		printf '#!/bin/sh\n# tests/cluster/containers.sh: no service starts during its package install\nexit 101\n' >/usr/sbin/policy-rc.d
		chmod 0755 /usr/sbin/policy-rc.d
		own_policy=1
	fi
	local rc=0
	apt_retry -qq install -y --no-install-recommends "${need[@]}" >&2 || rc=$?
	[ -z "$own_policy" ] || rm -f /usr/sbin/policy-rc.d
	[ "$rc" = 0 ] || kc_fail "cannot install ${need[*]} (apt-get install failed: see above)"
}

# In the test guest (tests/vm: user-mode-linux or QEMU, `fv_runner=` on its kernel command line)?
kcc_in_guest() { grep -q 'fv_runner=' /proc/cmdline 2>/dev/null; }

# The guest has no network and no apt, and its image (tests/vm/setup) has no containerd: the host
# downloads the packages once into the shared cache (kcc_prepare_guest, `deploy-e2e
# --prepare-guest`), and each boot copies their binaries into the guest's /usr (an overlay with a
# tmpfs upper dir: nothing survives the boot, and the cached image and its hash stay as they are).
# openssl (for kcc_api_cert) comes the same way: the guest has libssl3, not the openssl binary.
KCC_GUEST_PKGS=(containerd runc containernetworking-plugins openssl)
KCC_GUEST_DIR="${FLEXVOL_CACHE:-/var/tmp/flexvol-cache}/guest-containers"
KCC_GUEST_FILES=(usr/bin/containerd usr/bin/containerd-shim-runc-v2 usr/bin/ctr usr/sbin/runc
	usr/lib/cni/bridge usr/lib/cni/host-local usr/lib/cni/loopback usr/bin/openssl etc/ssl/openssl.cnf)

# kcc_prepare_guest (on the host): the packages' binaries under KCC_GUEST_DIR/root (from the same
# apt mirror and versions as the host's), and the busybox-static package for the images.
kcc_prepare_guest() {
	local f ok=1
	for f in "${KCC_GUEST_FILES[@]}"; do [ -f "$KCC_GUEST_DIR/root/$f" ] || ok=""; done
	if [ -z "$ok" ]; then
		kcc_log "downloading ${KCC_GUEST_PKGS[*]} for the guest into $KCC_GUEST_DIR"
		rm -rf "$KCC_GUEST_DIR/debs" "$KCC_GUEST_DIR/root.tmp"
		mkdir -p "$KCC_GUEST_DIR/debs" "$KCC_GUEST_DIR/root.tmp"
		chmod 0755 "$KCC_GUEST_DIR/debs"
		(cd "$KCC_GUEST_DIR/debs" && timeout 300 bash -c 'source "$1"; shift; apt_ensure_known "$@" && apt_retry -q download "$@"' \
			_ "$KC_REPO/tests/lib/apt.sh" "${KCC_GUEST_PKGS[@]}") >&2 ||
			kc_fail "apt-get download ${KCC_GUEST_PKGS[*]} failed"
		for f in "$KCC_GUEST_DIR"/debs/*.deb; do
			dpkg-deb -x "$f" "$KCC_GUEST_DIR/debs/x" || kc_fail "dpkg-deb -x $f failed"
		done
		for f in "${KCC_GUEST_FILES[@]}"; do # only what the cluster runs (~70 of the 150 MB)
			[ -f "$KCC_GUEST_DIR/debs/x/$f" ] || kc_fail "the packages ${KCC_GUEST_PKGS[*]} have no $f"
			mkdir -p "$KCC_GUEST_DIR/root.tmp/$(dirname "$f")"
			cp "$KCC_GUEST_DIR/debs/x/$f" "$KCC_GUEST_DIR/root.tmp/$f"
		done
		rm -rf "$KCC_GUEST_DIR/root"
		mv "$KCC_GUEST_DIR/root.tmp" "$KCC_GUEST_DIR/root"
		rm -rf "$KCC_GUEST_DIR/debs"
	fi
	kcc_busybox_deb >/dev/null
}

# kcc_guest_packages (in the guest): copy the prepared binaries into /usr.
kcc_guest_packages() {
	local f
	for f in "${KCC_GUEST_FILES[@]}"; do
		[ -f "$KCC_GUEST_DIR/root/$f" ] ||
			kc_fail "no $KCC_GUEST_DIR/root/$f: run \`tests/cluster/deploy-e2e --prepare-guest\` on the host before booting the guest"
		mkdir -p "/$(dirname "$f")"
		cp "$KCC_GUEST_DIR/root/$f" "/$f" || kc_fail "cannot copy $f into the guest's /usr"
	done
	[ -e /usr/lib/ssl/openssl.cnf ] || { mkdir -p /usr/lib/ssl && ln -s /etc/ssl/openssl.cnf /usr/lib/ssl/openssl.cnf; }
	modprobe -a overlay veth bridge 2>/dev/null || kc_fail "modprobe overlay veth bridge failed in the guest"
}

# kcc_busybox_deb: Debian's busybox-static package in the cache (downloaded once, not installed).
kcc_busybox_deb() {
	local deb
	deb="$(ls "$KCC_CACHE"/busybox-static_*.deb 2>/dev/null | head -n1 || true)"
	if [ -z "$deb" ]; then
		kcc_in_guest && kc_fail "no busybox-static package in $KCC_CACHE: run \`tests/cluster/deploy-e2e --prepare-guest\` on the host first"
		mkdir -p "$KCC_CACHE"
		# shellcheck source=../lib/apt.sh
		source "$KC_REPO/tests/lib/apt.sh"
		(cd "$KCC_CACHE" && chmod 0755 . && timeout 300 bash -c 'source "$1"; apt_retry download busybox-static' _ "$KC_REPO/tests/lib/apt.sh") >&2 ||
			kc_fail "apt-get download busybox-static failed"
		deb="$(ls "$KCC_CACHE"/busybox-static_*.deb | head -n1)"
		rm -rf "$KCC_CACHE/busybox-static"
	fi
	echo "$deb"
}

# kcc_image NAME TAG IMAGE.PY-ARGS...: the docker-archive of NAME:TAG, from the cache when the
# same inputs (the args and the content of every --file/--containerfile/COPY source) made it before.
kcc_image() {
	local name="$1" tag="$2" out key
	shift 2
	key="$({
		sha256sum "$KC_HERE/image.py"
		printf '%s\n' "$name:$tag" "$@"
		local a
		for a in "$@"; do # the content of every file named (--containerfile F, --file SRC:DEST)
			if [ -f "$a" ]; then sha256sum "$a"; elif [ -f "${a%%:*}" ]; then sha256sum "${a%%:*}"; fi
		done
	} | sha256sum | cut -c1-16)"
	out="$KCC_CACHE/${name//\//_}-$key.tar"
	if [ ! -s "$out" ]; then
		mkdir -p "$KCC_CACHE"
		timeout 120 python3 "$KC_HERE/image.py" --tag "$name:$tag" --out "$out" "$@" >/dev/null ||
			kc_fail "image.py could not build $name:$tag"
	fi
	KCC_IMAGE_TARS+=("$out")
}

# kcc_images: build (or find in the cache) the pause, busybox and flexvol images.
kcc_images() {
	mkdir -p "$KCC_CACHE"
	# busybox from Debian's busybox-static (downloaded once, not installed).
	local deb bb="$KCC_CACHE/busybox-static/bin/busybox"
	deb="$(kcc_busybox_deb)"
	if [ ! -x "$bb" ]; then # unpacked aside and renamed: the host and the guest may both get here
		local tmp="$KCC_CACHE/busybox-static.$$"
		rm -rf "$tmp"
		dpkg-deb -x "$deb" "$tmp" || kc_fail "dpkg-deb -x $deb failed"
		[ -x "$bb" ] || mv -T "$tmp" "$KCC_CACHE/busybox-static" 2>/dev/null || [ -x "$bb" ] ||
			kc_fail "cannot move the unpacked busybox-static to $KCC_CACHE/busybox-static (remove it if it is a leftover)"
		rm -rf "$tmp"
	fi
	local links=() applet
	for applet in $("$bb" --list); do
		[ "$applet" = busybox ] || links+=(--symlink "/bin/$applet:busybox")
	done
	# The pause image: PID 1 of every pod sandbox, sleeping (containerd stops it with SIGKILL).
	KCC_IMAGE_PAUSE=flexvol-test/pause:1
	kcc_image flexvol-test/pause 1 --file "$bb:/bin/busybox" \
		--entrypoint '["/bin/busybox","sleep","2147483647"]'
	# shellcheck disable=SC2034 # the scenarios' workload image
	KCC_IMAGE_BUSYBOX=flexvol-test/busybox:1
	kcc_image flexvol-test/busybox 1 --file "$bb:/bin/busybox" "${links[@]}" --cmd '["sh"]'
	# flexvol: drivers/deploy/Containerfile.prebuilt over KC_FLEXVOL, as a user builds it.
	local ctx="$KC_DIR/image-context" tag
	mkdir -p "$ctx/target/x86_64-unknown-linux-gnu/release"
	cp "$KC_FLEXVOL" "$ctx/target/x86_64-unknown-linux-gnu/release/flexvol"
	tag="$(sha256sum "$KC_FLEXVOL" | cut -c1-12)"
	# shellcheck disable=SC2034 # the image the scenarios deploy
	KCC_IMAGE_FLEXVOL="flexvol-test/flexvol:$tag"
	kcc_image flexvol-test/flexvol "$tag" --containerfile "$KC_REPO/drivers/deploy/Containerfile.prebuilt" \
		--context "$ctx" # (the tag is the binary's hash: the cache key covers it)
}

# kcc_api_cert: re-issue the API server's serving certificate (same key, same CA) with
# KCC_API_HOST added to its addresses, so that pods reach the API server by that IP and check it
# (flexvol-pki gives 127.0.0.1 and the kubernetes.default.svc names only; pods have no DNS, and the
# provisioner resolves names in the host's mount namespace when it works there). openssl comes with
# ca-certificates.
kcc_api_cert() {
	local pki="$KC_DIR/pki"
	printf 'subjectAltName=DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:127.0.0.1,IP:::1,IP:%s\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' \
		"$KCC_API_HOST" >"$pki/apiserver.ext"
	timeout 30 openssl req -new -key "$pki/apiserver.key" -subj /CN=kube-apiserver -out "$pki/apiserver.csr" 2>>"$KC_DIR/logs/openssl.log" &&
		timeout 30 openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
			-days 7 -extfile "$pki/apiserver.ext" -out "$pki/apiserver.crt.new" 2>>"$KC_DIR/logs/openssl.log" &&
		mv -f "$pki/apiserver.crt.new" "$pki/apiserver.crt" ||
		kc_fail "cannot re-issue the API server certificate with $KCC_API_HOST: $(tail -n 3 "$KC_DIR/logs/openssl.log")"
}

# kcc_wrapper: DIR/bin/runc-oom-wrapper (see the top of this file).
kcc_wrapper() {
	mkdir -p "$KC_DIR/bin"
	cat >"$KC_DIR/bin/runc-oom-wrapper" <<'EOF'
#!/bin/sh
# Test-machine workaround (tests/cluster/containers.sh): no CAP_SYS_RESOURCE here, so a negative
# oom_score_adj cannot be set; raise it to 0 in the bundle's config.json, then run the real runc.
bundle=""
prev=""
for a in "$@"; do
	case "$prev" in --bundle | -b) bundle="$a" ;; esac
	case "$a" in --bundle=*) bundle="${a#--bundle=}" ;; esac
	prev="$a"
done
if [ -n "$bundle" ] && [ -f "$bundle/config.json" ]; then
	sed -i -E 's/"oomScoreAdj":-[0-9]+/"oomScoreAdj":0/g' "$bundle/config.json" || exit 1
fi
exec /usr/sbin/runc "$@"
EOF
	chmod 0755 "$KC_DIR/bin/runc-oom-wrapper"
}

kcc_sock() { echo "$(kc_node_dir "$1")/containerd/containerd.sock"; }
kcc_ctr() { # kcc_ctr NODE ARGS...: ctr on NODE's containerd, namespace k8s.io, with a deadline
	local node="$1"
	shift
	timeout 120 ctr --address "$(kcc_sock "$node")" --namespace k8s.io "$@"
}

# kcc_start_node NODE INDEX: the node's bridge, CNI config, containerd, images.
kcc_start_node() {
	local node="$1" i="$2" nd c br
	nd="$(kc_node_dir "$node")"
	c="$nd/containerd"
	br="fvbr$i"
	mkdir -p "$c/root" "$c/state" "$c/runc" "$nd/cni/net.d" "$nd/cni/ipam"
	# The bridge first, with its gateway address: the API server is reached through it.
	if ! ip link show "$br" >/dev/null 2>&1; then
		ip link add "$br" type bridge || kc_fail "ip link add $br type bridge failed"
	fi
	KCC_BRIDGES+=("$br")
	# Containers without a cgroup parent from kubelet (--cgroups-per-qos=false) go under
	# <controller>/k8s.io/<id>: note the parents that do not exist yet, to remove them at the end.
	local cg cgs=(/sys/fs/cgroup/*/)
	# cgroup v2 (the guest): one hierarchy, the parent is /sys/fs/cgroup/k8s.io.
	[ "$(stat -f -c %T /sys/fs/cgroup)" != cgroup2fs ] || cgs=(/sys/fs/cgroup/)
	for cg in "${cgs[@]}"; do
		[ -d "${cg}k8s.io" ] || [[ " ${KCC_CGROUP_DIRS[*]} " == *" ${cg}k8s.io "* ]] || KCC_CGROUP_DIRS+=("${cg}k8s.io")
	done
	kc_write_state
	ip addr replace "10.88.$((10 + i)).1/24" dev "$br" || kc_fail "cannot address bridge $br"
	ip link set "$br" up || kc_fail "cannot bring up bridge $br"
	cat >"$nd/cni/net.d/10-flexvol.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "flexvol-$node",
  "plugins": [
    {"type": "bridge", "bridge": "$br", "isGateway": true, "ipMasq": false, "hairpinMode": false,
     "ipam": {"type": "host-local", "dataDir": "$nd/cni/ipam",
              "ranges": [[{"subnet": "10.88.$((10 + i)).0/24", "gateway": "10.88.$((10 + i)).1"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}}
  ]
}
EOF
	cat >"$c/config.toml" <<EOF
version = 2
root = "$c/root"
state = "$c/state"
oom_score = 0
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "$c/containerd.sock"
[ttrpc]
  address = "$c/containerd.sock.ttrpc"
[debug]
  level = "info"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "docker.io/$KCC_IMAGE_PAUSE"
  enable_selinux = false
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$KC_DIR/bin/runc-oom-wrapper"
        Root = "$c/runc"
        SystemdCgroup = false$(kcc_in_guest && printf '\n        NoPivotRoot = true')
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$nd/cni/net.d"
    max_conf_num = 1
EOF
	rm -f "$c/containerd.sock"
	kc_spawn "containerd-$node" "$KC_DIR/logs/containerd-$node.log" containerd --config "$c/config.toml"
	kc_wait_for "containerd of $node ($c/containerd.sock)" 30 kcc_ctr "$node" version
	local t
	for t in "${KCC_IMAGE_TARS[@]}"; do
		kcc_ctr "$node" images import "$t" >>"$KC_DIR/logs/containerd-$node-import.log" 2>&1 ||
			kc_fail "ctr images import $t into $node's containerd failed: $(tail -n 3 "$KC_DIR/logs/containerd-$node-import.log")"
	done
}

# kcc_netns_of_node NODE: the network namespaces of NODE's containers, from runc's state.
kcc_netns_of_node() {
	local st
	for st in "$(kc_node_dir "$1")"/containerd/runc/k8s.io/*/state.json; do
		[ -f "$st" ] || continue
		python3 -c 'import json,sys
s=json.load(open(sys.argv[1]))
for n in s.get("config",{}).get("namespaces") or []:
    if n.get("type")=="NEWNET" and n.get("path"): print(n["path"])' "$st" 2>/dev/null || true
	done | sort -u
}

# kcc_pids_naming STRING: live processes whose command line contains STRING (not this shell, not
# the lookup itself).
kcc_pids_naming() {
	python3 - "$1" "$$" <<'PY'
import os, sys
want, me = sys.argv[1].encode(), {str(os.getpid()), str(os.getppid()), sys.argv[2]}
for p in os.listdir("/proc"):
    if not p.isdigit() or p in me:
        continue
    try:
        with open(f"/proc/{p}/cmdline", "rb") as f:
            cmd = f.read()
        with open(f"/proc/{p}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        continue
    if want in cmd and state != "Z":
        print(p)
PY
}

# kcc_node_down NODE: kill and delete its containers, stop containerd and its shims, remove the
# pods' network namespaces. Never fails (kc_down goes on); says what it could not remove.
kcc_node_down() {
	local node="$1" nd c id netns pid
	nd="$(kc_node_dir "$node")"
	c="$nd/containerd"
	[ -d "$c" ] || return 0
	netns="$(kcc_netns_of_node "$node")"
	if [ -d "$c/runc/k8s.io" ]; then
		for id in "$c"/runc/k8s.io/*/; do
			id="$(basename "$id")"
			timeout 30 /usr/sbin/runc --root "$c/runc/k8s.io" kill "$id" KILL 2>/dev/null || true
		done
		sleep 0.5
		for id in "$c"/runc/k8s.io/*/; do
			id="$(basename "$id")"
			[ "$id" != "*" ] || continue
			timeout 30 /usr/sbin/runc --root "$c/runc/k8s.io" delete --force "$id" 2>/dev/null ||
				kcc_log "runc delete --force $id ($node) failed"
		done
	fi
	kc_stop_name "containerd-$node" 10
	# The shims outlive containerd by design: every process that names this node's socket.
	for pid in $(kcc_pids_naming "$c/containerd.sock"); do
		kill -KILL "$pid" 2>/dev/null || true
	done
	local ns
	for ns in $netns; do
		case "$ns" in /var/run/netns/cni-* | /run/netns/cni-*) ;; *) continue ;; esac
		[ -e "$ns" ] || continue
		umount "$ns" 2>/dev/null || umount -l "$ns" 2>/dev/null || true
		rm -f "$ns" || kcc_log "could not remove $ns"
	done
}

# kcc_down_bridges: delete the bridges kc_up made (recorded in the state as KCC_BRIDGES), and
# the cgroup parents containerd made (rmdir: only when empty).
kcc_down_bridges() {
	local br cg
	for cg in "${KCC_CGROUP_DIRS[@]}"; do
		[ ! -d "$cg" ] || rmdir "$cg" 2>/dev/null || kcc_log "could not remove $cg (not empty?)"
	done
	for br in "${KCC_BRIDGES[@]}"; do
		if ip link show "$br" >/dev/null 2>&1; then
			ip link del "$br" || kcc_log "could not delete bridge $br"
		fi
	done
}

# kcc_leftovers: what a containerd cluster left on this machine (empty when clean): processes
# naming DIR, network namespaces of our containers, our bridges, mounts under DIR.
kcc_leftovers() {
	local dir="$1" pid br
	for pid in $(kcc_pids_naming "$dir"); do
		echo "process $pid: $(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null | cut -c1-160)"
	done
	for br in "${KCC_BRIDGES[@]}"; do
		ip link show "$br" >/dev/null 2>&1 && echo "bridge $br"
	done
	for br in "${KCC_CGROUP_DIRS[@]}"; do
		[ -d "$br" ] && echo "cgroup $br"
	done
	grep -F " $dir" /proc/self/mountinfo | awk '{ print "mount " $5 }'
	return 0
}
