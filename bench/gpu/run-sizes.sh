#!/usr/bin/env bash
# On the GPU machine (device run, carrying .deb, .whl and .deb-node from prepare-carry.sh): for
# each size, the shim path (shim_proof.py: containerd + the shim) and then the snapshotctl and
# raw paths (proof.py: snapshotctl restore, and criu restore + CUDA restore called directly),
# in one machine session, so the three compare. Each size's two JSON results go to $OUT as
# soon as they are made, its logs as one archive (a device run returns only a few files).
#
#   bash bench/gpu/run-sizes.sh 0.35b 1.3b      # then 6.65b in a second call (10 min each)
#   SHIM_ONLY=1 bash bench/gpu/run-sizes.sh 6.65b   # the shim path alone
set -uo pipefail
eval "$(bash bench/gpu/setup-device.sh | tail -1)"
mkdir -p /opt/node
for f in .deb-node/*.deb; do dpkg -x "$f" /opt/node; done
cp /opt/node/bin/busybox /bin/busybox 2>/dev/null || cp /opt/node/usr/bin/busybox /bin/busybox
export PATH="/opt/node/usr/bin:/opt/node/usr/sbin:$PATH"
export LD_LIBRARY_PATH="/opt/node/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1
port=18700
for size in "$@"; do
  case "$size" in
    0.35b) model=(--layers 24 --width 1024 --heads 16) ;;
    1.3b) model=(--layers 24 --width 2048 --heads 16) ;;
    6.65b) model=(--layers 32 --width 4096 --heads 32) ;;
    *) echo "unknown size $size" >&2; exit 2 ;;
  esac
  work="/tmp/run-sizes/$size"
  mkdir -p "$work"
  port=$((port + 2))
  timeout -s INT 280 python3 bench/gpu/shim_proof.py --out "$work" --port "$port" \
    "${model[@]}" --name "gpu-shim-proof-$size" 2>&1 | tee "$work/shim_proof.log" | tail -8
  cp "$work/gpu-shim-proof-$size.json" "$OUT/"
  grep -h "step \|phase " "$work"/*shim*.log 2>/dev/null | tail -12
  [[ -n "${SHIM_ONLY:-}" ]] && { tar -czf "$OUT/logs-$size.tgz" -C "$work" .; continue; }
  timeout -s INT 280 python3 bench/gpu/proof.py --out "$work" --port "$((port + 1))" \
    "${model[@]}" --kv-gb 16 --leave-running --name "gpu-bench-$size" 2>&1 \
    | tee "$work/proof.log" | tail -8
  cp "$work/gpu-bench-$size.json" "$OUT/"
  tar -czf "$OUT/logs-$size.tgz" -C "$work" --exclude='*.json' .
done
