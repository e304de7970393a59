#!/usr/bin/env bash
# On the GPU machine: issue 43's story (bench/gpu/k8s_story.py) from bench/gpu/k8s-carry.sh's
# parts, which arrive one call each (carry [".k8s/1"], then [".k8s/2"], ...) while the
# machine stays warm; each call keeps what it brought in /var/tmp/k8s-stage.
#
#   bash bench/gpu/k8s-run.sh stage               # a part's call: keep it, print the facts
#   bash bench/gpu/k8s-run.sh story tiny 1.3b     # the last part's call, or any after it
#   STORY_TIMEOUT=420 bash bench/gpu/k8s-run.sh story 1.3b   # stops it sooner (default 500 s;
#                                                 # keep it under the call's timeout_s)
#
# The story's JSON and the cluster's log go to $OUT/story.
set -euo pipefail
cd "$(dirname "$0")/../.."
S=/var/tmp/k8s-stage
C=/var/cache/snapshot-tools
mkdir -p "$S"
for d in .k8s/*/; do cp "$d"* "$S/" 2>/dev/null || true; done  # a newer part wins
if [[ ${1:-} == stage ]]; then
  ls "$S" | tr '\n' ' '; echo; du -sh "$S"
  # what the story relies on here, in one look
  grep -E '^(PRETTY_NAME)' /etc/os-release || true
  ldd --version | sed -n 1p; uname -r; nproc; df -h / /var/tmp | tail -2
  stat -fc 'cgroup fs: %T' /sys/fs/cgroup
  for t in ip iptables mount pkill xz tar nvidia-smi; do printf '%s: %s\n' "$t" "$(command -v $t || echo missing)"; done
  ldconfig -p | grep -E 'libcuda.so.1|libnvidia-ml.so.1' || echo "libcuda not in the loader cache"
  python3 -c 'import sys, yaml, httpx; print(sys.executable, sys.prefix, sys.version.split()[0])'
  awk '{print $5, $9}' /proc/self/mountinfo | grep -E '^/usr|^/opt|^/var' || true
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  exit 0
fi
[[ ${1:-} == story ]] && shift
mkdir -p "$C/bin" "$C/gpu-node" "$C/containerd2" /usr/lib/cni
xz -dc "$S/hyperkube.xz" > "$C/gpu-node/hyperkube"
for t in kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubectl; do
  ln -sfn "$C/gpu-node/hyperkube" "$C/bin/$t"
done
xz -dc "$S/helm.xz" > "$C/bin/helm"
xz -dc "$S/etcd.xz" > /usr/local/bin/etcd
chmod +x "$C/gpu-node/hyperkube" "$C/bin/helm" /usr/local/bin/etcd
tar -C "$C/containerd2" -xJf "$S/containerd2.tar.xz"
tar -C /usr/lib/cni -xJf "$S/cni.tar.xz"
tar -C "$C/gpu-node" -xJf "$S/nvidia.tar.xz"
if ! command -v busybox >/dev/null; then
  dpkg -x "$S"/busybox-static_*.deb /opt/k8s-busybox && cp /opt/k8s-busybox/usr/bin/busybox /bin/busybox
fi
# kube-proxy's Services and CRIU's network lock
command -v iptables >/dev/null || bash bench/gpu/iptables-aside.sh "$S" /opt/k8s-iptables /usr/local/sbin
if ! command -v ip >/dev/null; then  # devnode makes its bridges and reads links with it
  p=/opt/k8s-iproute
  for f in "$S"/{iproute2,libbpf1,libelf1t64,libmnl0,libcap2,libtirpc3t64,libxtables12,libdb5.3t64,libselinux1}_*.deb; do
    dpkg -x "$f" "$p"
  done
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s/usr/bin/ip "$@"\n' "$p/usr/lib/x86_64-linux-gnu" "$p" > /usr/local/sbin/ip
  chmod +x /usr/local/sbin/ip && ip -V
fi
# grep reads the whole list: under pipefail, a -q that stops early would fail the pipeline
if ! ldconfig -p | grep 'libcuda.so.1 ' >/dev/null; then
  # a GPU node's driver libraries are in its loader cache (the shim and the agent find
  # libcuda there); this machine keeps them in a folder of their own
  lib=$(find /usr/local/nvidia /usr/lib /usr/lib64 -name libcuda.so.1 -print -quit 2>/dev/null)
  dirname "$lib" > /etc/ld.so.conf.d/000-snapshot-nvidia.conf && ldconfig
  echo "loader cache: $(dirname "$lib") added"
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$S"/*.whl
# containerd's and the shims' logs outlive the node (devnode/containerd.py), for the archive
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 SNAPSHOT_KEEP_LOGS=/var/tmp/k8s-keep
# once per image: a later call on the same machine may have carried a newer one
if ! cmp -s "$S/image-tag" /var/tmp/snapshot-image.tag; then
  cat "$S"/image.tar.xz.* | xz -dc > /var/tmp/snapshot-image.tar
  cp "$S/image-tag" /var/tmp/snapshot-image.tag
fi
mkdir -p "$OUT/story"
set +e
# interrupted (SIGINT) before the call's own limit, the story still writes its JSON and logs
timeout -s INT "${STORY_TIMEOUT:-500}" python3 bench/gpu/k8s_story.py --out "$OUT/story" \
  --image-archive /var/tmp/snapshot-image.tar --image-tag "$(cat "$S/image-tag")" "$@" 2>&1 \
  | tee "$OUT/story/story.log" | tail -80
rc=${PIPESTATUS[0]}
tar -czf "$OUT/story/node-logs.tgz" -C /var/tmp/k8s-keep . 2>/dev/null
exit "$rc"
