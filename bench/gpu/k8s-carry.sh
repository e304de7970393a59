#!/usr/bin/env bash
# Run here (registries reachable), before bench/gpu/k8s-run.sh: stages what a one-node GPU
# cluster needs on a machine that fetches nothing and takes at most 64 MiB a call: hyperkube
# (control plane, kubelet, kube-proxy, kubectl), etcd, containerd 2.x with its runc, the CNI
# plugins, helm, the NVIDIA device plugin and nvidia-ctk, iptables, iproute2 and busybox
# (.deb), the wheels, the project image. They are dealt into parts .k8s/1, .k8s/2, ...
# (git-ignored) of at most 56 MiB, each carried by its own call while the machine stays warm.
# The project image is the chart's own (tools/build-image.sh, as `make cluster` runs it), as
# an OCI archive that `ctr images import` takes; the GPU worker's image is built there.
set -euo pipefail
cd "$(dirname "$0")/../.."
CACHE=/var/cache/snapshot-tools
bash tools/build-gpu-node-tools.sh >/dev/null
[[ -d .deb-node && -d .whl ]] || bash bench/gpu/prepare-carry.sh
rm -rf .k8s && mkdir -p .k8s/all && cd .k8s/all
xz -T0 -9 -c "$CACHE/gpu-node/hyperkube" > hyperkube.xz
xz -T0 -9 -c "$(command -v etcd)" > etcd.xz
tar -C /usr/lib/cni -cf - bridge host-local loopback portmap | xz -T0 -9 > cni.tar.xz
tar -C "$CACHE/gpu-node" -cf - nvidia-device-plugin nvidia-ctk | xz -T0 -9 > nvidia.tar.xz
cp ../../.deb-node/{iptables,libip4tc2,libip6tc2,libnetfilter-conntrack3,libnfnetlink0,busybox-static}_*.deb .
cp ../../.whl/*.whl .
# iptables' own library, and iproute2 for a machine image without them (k8s-run.sh uses the
# machine's own where it has them)
apt-get download -q libxtables12/trixie iproute2/trixie libbpf1/trixie libelf1t64/trixie \
  libmnl0/trixie libcap2/trixie libtirpc3t64/trixie libdb5.3t64/trixie libselinux1/trixie
tar -C "$CACHE/containerd2" -cf - usr/bin/containerd usr/bin/containerd-shim-runc-v2 usr/bin/ctr \
  usr/sbin/runc | xz -T0 -9 > containerd2.tar.xz
xz -T0 -9 -c "$CACHE/bin/helm" > helm.xz
# the project image, tagged as devnode tags it, as one archive in 16 MB pieces (the dealing
# below spreads them over the parts; k8s-run.sh joins them in name order)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
tag=$(cd ../.. && .venv/bin/python -c 'import sys; from pathlib import Path
from devnode.project_image import write_layout; print(write_layout("snapshot", Path(sys.argv[1])))' "$work/layout")
echo "$tag" > image-tag
tar -C "$work/layout" -chf - . | xz -T0 -6 | split -b 16M - image.tar.xz.
cd .. && ../.venv/bin/python - <<'DEAL'
# largest first into the first part with room: few parts, each under the call's limit
from pathlib import Path
limit, parts = 56 << 20, []
for f in sorted(Path("all").iterdir(), key=lambda f: -f.stat().st_size):
    part = next((p for p in parts if p[0] + f.stat().st_size <= limit), None)
    if part is None:
        parts.append(part := [0, Path(str(len(parts) + 1))])
        part[1].mkdir()
    part[0] += f.stat().st_size
    f.rename(part[1] / f.name)
Path("all").rmdir()
DEAL
du -sh ./*
