#!/usr/bin/env bash
# What `make setup`'s system step does to a fresh Debian 12 (or 13: give trixie): builds a root
# filesystem with mmdebstrap (variant important, plus python3, make and git, as a cloud image
# has), runs scripts/setup-system.sh inside it with apt-get in simulation mode (-s), and
# prints apt's summary ("N upgraded, M newly installed, K to remove") and the upgraded
# packages. Nothing on this machine changes; about a minute.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
suite=${1:-bookworm}   # or trixie
work=$(mktemp -d)
trap 'umount "$work/rootfs/proc" 2>/dev/null || true; rm -rf "$work"' EXIT
opts=(--aptopt='Acquire::Check-Valid-Until "false"' --aptopt='Acquire::Check-Date "false"')
mmdebstrap -q --variant=important --include=python3,python3-venv,make,git,ca-certificates \
  "${opts[@]}" "$suite" "$work/rootfs" "deb http://deb.debian.org/debian $suite main" \
  "deb http://deb.debian.org/debian $suite-updates main" >&2
sed -e 's/apt-get install -y -q/apt-get install -s -q/' -e 's/^criu_ok || {.*/exit 0/' \
  "$root/scripts/setup-system.sh" > "$work/rootfs/tmp/setup-sim.sh"
echo 'Acquire::Check-Valid-Until "false"; Acquire::Check-Date "false";' \
  > "$work/rootfs/etc/apt/apt.conf.d/99snapshot-frozen-mirror"
mount --bind /proc "$work/rootfs/proc"
chroot "$work/rootfs" bash /tmp/setup-sim.sh > "$work/sim.log" 2>&1
grep -E '^[0-9]+ upgraded' "$work/sim.log"
echo "upgraded: $(awk '/^Inst/ && $3 ~ /^\[/ {print $2}' "$work/sim.log" | paste -sd' ')"
