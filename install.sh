#!/usr/bin/env bash
# Install flexvol into kubelet's FlexVolume plugin directory, one copy per driver name:
#   <plugin-dir>/<vendor>~<driver>/<driver>   (default vendor "flexvol")
#
# usage: ./install.sh [--plugin-dir DIR] [--vendor NAME] [--drivers hostpath,nfs,lvm]
#                     [--binary FILE] [--uninstall [--purge] [--dry-run]]   (docs/uninstall.md)
#
# Without --binary it builds the static release binary first (cargo). The copy itself is done by
# `flexvol install`: dot-file in the driver directory, fsync, chmod 0755, rename (atomic, so kubelet
# never executes a half-written file), then each installed driver's `init` is run as a check.
# Without --plugin-dir it uses a running kubelet's --volume-plugin-dir, else kubelet's default
# /usr/libexec/kubernetes/kubelet-plugins/volume/exec. Idempotent: re-running changes nothing.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
binary=""
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary=${2:?--binary needs a file}; shift 2 ;;
    --binary=*) binary=${1#--binary=}; shift ;;
    --plugin-dir|--vendor|--drivers) args+=("$1" "${2:?$1 needs a value}"); shift 2 ;;
    --plugin-dir=*|--vendor=*|--drivers=*|--uninstall|--purge|--dry-run) args+=("$1"); shift ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown argument: $1 (see --help)"; exit 2 ;;
  esac
done

if [ -z "$binary" ]; then
  command -v cargo >/dev/null || { echo "install.sh: cargo not found; install Rust or pass --binary FILE"; exit 1; }
  echo "building the release binary..."
  (cd "$here" && cargo build --release --locked --quiet)
  binary="$here/target/x86_64-unknown-linux-gnu/release/flexvol"
fi
[ -x "$binary" ] || { echo "install.sh: $binary is not an executable file"; exit 1; }

exec "$binary" install --binary "$binary" "${args[@]}"
