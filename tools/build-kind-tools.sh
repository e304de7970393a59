#!/usr/bin/env bash
# kind, and the etcd of its node image, built from their Go modules into the tools cache
# outside the repository (test tooling only: devnode/kind_node.py builds the node image from
# them, with no registry). kind's version here is the one whose node-image files are used;
# etcd's is the one kubeadm's image list names (tools/kind/etcd/go.mod). A second run finds
# them and does nothing.
set -euo pipefail
export PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || { echo "the Go toolchain is needed to build kind (test tools only)" >&2; exit 1; }
here="$(cd "$(dirname "$0")/kind" && pwd)"
BIN=${SNAPSHOT_TOOLS_BIN:-/var/cache/snapshot-tools/bin}
KIND_VERSION=${KIND_VERSION:-v0.33.0}
mkdir -p "$BIN"
if [[ -x "$BIN/kind" ]] && [[ $("$BIN/kind" version) == "kind ${KIND_VERSION} "* ]]; then
  echo "kind ${KIND_VERSION} already in $BIN"
else
  echo "building kind ${KIND_VERSION}"
  GOBIN="$BIN" CGO_ENABLED=0 GOFLAGS=-mod=mod go install -trimpath -ldflags "-s -w" \
    "sigs.k8s.io/kind@${KIND_VERSION}"
fi
ETCD_VERSION=$(awk '{for (i = 1; i < NF; i++) if ($i == "go.etcd.io/etcd/server/v3") print $(i + 1)}' "$here/etcd/go.mod")
if [[ -x "$BIN/kind-etcd" ]] && [[ $("$BIN/kind-etcd" --version) == *"Version: ${ETCD_VERSION#v}"* ]]; then
  echo "etcd ${ETCD_VERSION} already in $BIN/kind-etcd"
else
  echo "building etcd ${ETCD_VERSION} for the kind node image"
  (cd "$here/etcd" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" \
    -o "$BIN/kind-etcd.tmp" .)
  mv "$BIN/kind-etcd.tmp" "$BIN/kind-etcd"
fi
