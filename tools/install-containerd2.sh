#!/usr/bin/env bash
# containerd 2.x (and the runc it is built with) beside the system's containerd 1.7: Debian
# unstable's packages, unpacked into a cache outside the repository, so that devnode can run
# either (Kubernetes after 1.35 needs containerd 2.x). A second run finds them and does
# nothing. Needs the unstable source that scripts/setup-system.sh adds (low pin priority:
# nothing on the system is upgraded from it).
set -euo pipefail
VERSION=${CONTAINERD2_VERSION:-2.1.9+ds1-5}
RUNC_VERSION=${RUNC2_VERSION:-1.3.6+ds1-1}
ROOT=${SNAPSHOT_CONTAINERD2:-/var/cache/snapshot-tools/containerd2}
if [[ -x "$ROOT/usr/bin/containerd" ]] && "$ROOT/usr/bin/containerd" --version | grep -q " ${VERSION%%+*}"; then
  echo "containerd ${VERSION%%+*} already in $ROOT"; exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"  # apt's download user must be able to write there
(cd "$work" && apt-get download -q "containerd=$VERSION" "runc=$RUNC_VERSION" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
rm -rf "$ROOT.new" && mkdir -p "$ROOT.new"
for f in "$work"/*.deb; do dpkg -x "$f" "$ROOT.new"; done
rm -rf "$ROOT" && mv "$ROOT.new" "$ROOT"
"$ROOT/usr/bin/containerd" --version
