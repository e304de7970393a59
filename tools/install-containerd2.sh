#!/usr/bin/env bash
# containerd 2.x (and the runc it is built with) beside the system's containerd 1.7: Debian
# unstable's packages, unpacked into a cache outside the repository, so that devnode can run
# either (Kubernetes after 1.35 needs containerd 2.x). A second run finds them and does
# nothing. Needs the unstable source that scripts/setup-system.sh adds (low pin priority:
# nothing on the system is upgraded from it). Unstable moves, so whichever 2.x it has is
# taken (tested here with 2.1.9 and runc 1.3.6).
set -euo pipefail
ROOT=${SNAPSHOT_CONTAINERD2:-/var/cache/snapshot-tools/containerd2}
is_v2() { [[ -x "$1/usr/bin/containerd" ]] && "$1/usr/bin/containerd" --version | grep -Eq ' v?2\.[0-9]+'; }
if is_v2 "$ROOT"; then
  echo "containerd $("$ROOT/usr/bin/containerd" --version | awk '{print $3}') already in $ROOT"; exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"  # apt's download user must be able to write there
fetch() { (cd "$work" && apt-get download -q containerd/sid runc/sid) >"$work/apt.log" 2>&1; }
# stale package lists (the source was added, but never fetched on this machine): once more
fetch || { apt-get update -q >/dev/null && fetch; } || { cat "$work/apt.log" >&2; exit 1; }
rm -rf "$ROOT.new" && mkdir -p "$ROOT.new"
for f in "$work"/*.deb; do dpkg -x "$f" "$ROOT.new"; done
is_v2 "$ROOT.new" || { echo "unstable's containerd is not 2.x" >&2; exit 1; }
rm -rf "$ROOT" && mv "$ROOT.new" "$ROOT"
"$ROOT/usr/bin/containerd" --version
