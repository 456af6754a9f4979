# shellcheck shell=bash
# tests/lib/apt.sh: the one way flexvol's scripts install or download Debian packages.
#
# A fresh machine's package lists can be months old. apt then still "knows" a package, but at a
# version the mirror no longer carries, and the download answers 404. Every install, download or
# source fetch therefore goes through apt_retry, which refreshes the lists and tries once more when
# apt-get fails, and says so.
#
# Sourced by .ci/run, tests/vm/setup, tests/kubelet/setup (and anything else that needs packages).
# Messages go to stderr, prefixed with "[apt]"; apt-get's own output goes where the caller sends
# stdout.
#
# FLEXVOL_APT_OPTS (optional, space-separated) is passed to every apt-get/apt-cache call; the
# self-test (tests/lib/apt-selftest) uses it to point apt at a private, deliberately stale copy of
# the lists.

# shellcheck disable=SC2206 # word splitting of FLEXVOL_APT_OPTS is the point
APT_OPTS=(-o DPkg::Lock::Timeout=600 -o Acquire::Retries=3 ${FLEXVOL_APT_OPTS:-})

apt_say() { echo "[apt] $*" >&2; }

# apt_lists_date: the modification date of the newest package list (or "never").
apt_lists_date() {
	local dir newest
	dir=$(apt-config "${APT_OPTS[@]}" shell D Dir::State::Lists/d | sed -n "s/^D='\(.*\)'$/\1/p")
	newest=$(find "${dir:-/var/lib/apt/lists}" -maxdepth 1 -name '*Packages*' -printf '%TY-%Tm-%Td\n' 2>/dev/null | sort | tail -n1)
	echo "${newest:-never}"
}

apt_update() {
	DEBIAN_FRONTEND=noninteractive apt-get "${APT_OPTS[@]}" -q update
}


# apt_get ARGS...: apt-get with the options above.
apt_get() {
	DEBIAN_FRONTEND=noninteractive apt-get "${APT_OPTS[@]}" "$@"
}

# with_fresh_lists CMD...: run CMD; when it fails, apt-get update and run CMD once more. CMD may be
# a shell function that resolves package names or versions from the lists, so that the retry
# resolves them anew (a stale list names versions the mirror no longer has).
with_fresh_lists() {
	if "$@"; then
		return 0
	fi
	apt_say "$* failed with package lists from $(apt_lists_date); they may be stale:" \
		"running apt-get update and trying once more"
	apt_update || {
		apt_say "apt-get update failed"
		return 1
	}
	"$@" || {
		apt_say "$* failed again after apt-get update"
		return 1
	}
	apt_say "$* succeeded after apt-get update"
}

# apt_retry ARGS...: apt-get ARGS, retried once after apt-get update.
apt_retry() {
	with_fresh_lists apt_get "$@"
}

# apt_ensure_known PKG...: whether apt's lists know every PKG (binary packages); if not, refresh them once.
apt_ensure_known() {
	if ! apt-cache "${APT_OPTS[@]}" show "$@" >/dev/null 2>&1; then
		apt_say "apt-cache does not know $* (lists from $(apt_lists_date)): apt-get update"
		apt_update
	fi
}
