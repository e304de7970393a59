#!/usr/bin/env bash
# Builds what a GPU machine with no registry access needs for a one-node Kubernetes cluster
# (bench/gpu/k8s-carry.sh stages them): hyperkube (the control plane, the kubelet, kube-proxy
# and kubectl in one binary, from tools/kube's pins), the NVIDIA device plugin and nvidia-ctk
# (its CDI hooks), from their Go modules, into a cache outside the repository. A second run
# finds them and does nothing. Test tooling only.
set -euo pipefail
export PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || { echo "the Go toolchain is needed (test tools only)" >&2; exit 1; }
here="$(cd "$(dirname "$0")/kube" && pwd)"
OUT=${SNAPSHOT_GPU_TOOLS:-/var/cache/snapshot-tools/gpu-node}
DEVICE_PLUGIN_VERSION=v0.18.0
TOOLKIT_VERSION=v1.20.2
mkdir -p "$OUT"
KUBE_VERSION=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2}' "$here/go.mod")
if [[ -x "$OUT/hyperkube" ]] && [[ $("$OUT/hyperkube" kubelet --version 2>/dev/null) == *"$KUBE_VERSION"* ]]; then
  echo "hyperkube $KUBE_VERSION already in $OUT"
else
  v=k8s.io/component-base/version
  ldflags="-s -w -X $v.gitVersion=$KUBE_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$(echo "$KUBE_VERSION" | cut -d. -f2) -X $v.gitTreeState=clean"
  (cd "$here" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" \
    -o "$OUT/hyperkube.tmp" ./hyperkube)
  mv "$OUT/hyperkube.tmp" "$OUT/hyperkube"
fi
# both load the driver's NVML with dlopen (cgo); no GPU is needed to build them
build() {  # name module version
  if [[ -x "$OUT/$1" ]] && [[ -f "$OUT/$1.version" ]] && [[ $(cat "$OUT/$1.version") == "$3" ]]; then
    echo "$1 $3 already in $OUT"; return
  fi
  GOBIN="$OUT" CGO_ENABLED=1 GOFLAGS=-mod=mod go install -trimpath -ldflags "-s -w" "$2@$3"
  echo "$3" > "$OUT/$1.version"
}
build nvidia-device-plugin github.com/NVIDIA/k8s-device-plugin/cmd/nvidia-device-plugin "$DEVICE_PLUGIN_VERSION"
build nvidia-ctk github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk "$TOOLKIT_VERSION"
ls -la "$OUT"
