#!/usr/bin/env bash
# On the GPU machine (device run, carrying .deb, .whl and .deb-node from prepare-carry.sh): for
# each size, the shim path (shim_proof.py: containerd + the shim) and then the snapshotctl and
# raw paths (proof.py: snapshotctl restore, and criu restore + CUDA restore called directly),
# in one machine session, so the three compare. Each size's two JSON results go to $OUT as
# soon as they are made, its logs as one archive (a device run returns only a few files).
#
#   bash bench/gpu/run-sizes.sh 0.35b 1.3b      # then 6.65b in a second call (10 min each)
#   SHIM_ONLY=1 bash bench/gpu/run-sizes.sh 6.65b   # the shim path alone
#   SHIM_FLAGS="--replicas 1,2,4 --thp-trial" SHIM_TIMEOUT=420 \
#     PROOF_FLAGS="--sparse-trial --thp-trial" bash bench/gpu/run-sizes.sh 1.3b
#       # also N replicas at once on one GPU, and a restore with huge pages 'always'; the raw
#       # path with and without zero pages in the image
#   SHIM_ONLY=1 SHIM_FLAGS="--quiesce vllm" bash bench/gpu/run-sizes.sh 1.3b
#       # the worker quiesced and woken through vLLM's sleep-mode API (the vllm engine
#       # profile: no handshake, no adapter); the restore report times the wake
#   SHIM_ONLY=1 SHIM_TIMEOUT=560 bash bench/gpu/run-sizes.sh 18b
#       # the curve's largest point (18.1 B parameters), alone in a call
#   BUNDLE=1 TAG=bundle SHIM_ONLY=1 bash bench/gpu/run-sizes.sh 1.3b
#       # the shim from the node bundle (.bundle, from bundle-carry.sh), not this machine's Python
#   SHIM_ONLY=1 MODES="gpu pinned pageable" SHIM_FLAGS="--restores 1 --in-pod 2" \
#     bash bench/gpu/run-sizes.sh 1.3b
#       # each size once per sleep mode of the worker (bench/gpu/sleep.py): the weights in one
#       # virtual-memory range, kept on the GPU, in pinned or in pageable host memory asleep
#       # (gpu-shim-proof-1.3b-pinned.json, ...); MODES="pageable-1 pageable-4": the pageable
#       # mode with 1 or 4 threads pinning its pieces (restore_runtime.offload's pinners)
#   TAG=vllm-2 SHIM_ONLY=1 SHIM_FLAGS="--quiesce vllm --engines 2" bash bench/gpu/run-sizes.sh 1.3b
#       # TAG names the results (gpu-shim-proof-1.3b-vllm-2.json), so runs of one size can
#       # share a call; LOGS (default $OUT) is where the log archives go
set -uo pipefail
eval "$(bash bench/gpu/setup-device.sh | tail -1)"
mkdir -p /opt/node
for f in .deb-node/*.deb; do dpkg -x "$f" /opt/node; done
if ! command -v iptables-restore >/dev/null; then
  # CRIU's network lock, for containers with a network namespace of their own; beside CRIU,
  # whose packages bring libxtables (not in CRIU's sbin: its criu must not be found there
  # without its wrapper)
  bash bench/gpu/iptables-aside.sh .deb-node /opt/snapshot-criu /opt/iptables-bin
  export PATH="/opt/iptables-bin:$PATH"
fi
cp /opt/node/bin/busybox /bin/busybox 2>/dev/null || cp /opt/node/usr/bin/busybox /bin/busybox
export PATH="/opt/node/usr/bin:/opt/node/usr/sbin:$PATH"
export LD_LIBRARY_PATH="/opt/node/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1
if [[ -n "${BUNDLE:-}" ]]; then
  # the node bundle from bundle-carry.sh: the shim runs from it, with its own loader, libraries
  # and CRIU, on this host's kernel only
  tar -C / -xJf .bundle/snapshot-bundle.tar.xz
  v=/opt/snapshot/current
  LC_ALL=C "$v/lib/ld-linux-x86-64.so.2" --library-path "$v/lib" \
    "$v"/python/bin/python3.* -I -m compileall -q -j 0 "$v/python/lib" "$v/site-packages" >/dev/null
  export SNAPSHOT_BUNDLE=$v/bin/shim
  echo "shim from the node bundle $(readlink $v), on glibc $(ldd --version | head -1 | awk '{print $NF}')"
fi
port=18700
read -ra modes <<<"${MODES:-}"
[[ ${#modes[@]} -gt 0 ]] || modes=("")  # one run, the worker's default allocator
for size in "$@"; do
  case "$size" in
    0.35b) model=(--layers 24 --width 1024 --heads 16) ;;
    1.3b) model=(--layers 24 --width 2048 --heads 16) ;;
    6.65b) model=(--layers 32 --width 4096 --heads 32) ;;
    # about the largest whose artifact (36 GB of weights; the KV cache is freed at the
    # quiesce) fits the GPU machine's 64 GiB of disk beside everything else
    18b) model=(--layers 40 --width 6144 --heads 48) ;;
    *) echo "unknown size $size" >&2; exit 2 ;;
  esac
  for mode in "${modes[@]}"; do
    tag="$size${mode:+-$mode}${TAG:+-$TAG}"
    work="/tmp/run-sizes/$tag"
    mkdir -p "$work"
    port=$((port + 2))
    timeout -s INT "${SHIM_TIMEOUT:-280}" python3 bench/gpu/shim_proof.py --out "$work" \
      --port "$port" "${model[@]}" --name "gpu-shim-proof-$tag" ${SHIM_FLAGS:-} \
      ${mode:+--sleep "$mode"} 2>&1 | tee "$work/shim_proof.log" | tail -8
    cp "$work/gpu-shim-proof-$tag.json" "$OUT/"
    grep -h "step \|phase \|thread-seconds" "$work"/*shim*.log 2>/dev/null | tail -12
    grep -h "sleep_s=\|wake_s=" "$work"/*.log 2>/dev/null | tail -6
    [[ -n "${SHIM_ONLY:-}" ]] && { tar -czf "${LOGS:-$OUT}/logs-$tag.tgz" -C "$work" .; continue; }
    timeout -s INT 280 python3 bench/gpu/proof.py --out "$work" --port "$((port + 1))" \
      "${model[@]}" --kv-gb 16 ${PROOF_FLAGS:---leave-running} --name "gpu-bench-$tag" 2>&1 \
      | tee "$work/proof.log" | tail -8
    cp "$work/gpu-bench-$tag.json" "$OUT/"
    tar -czf "${LOGS:-$OUT}/logs-$tag.tgz" -C "$work" --exclude='*.json' .
  done
done
