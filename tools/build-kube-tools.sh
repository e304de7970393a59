#!/usr/bin/env bash
# Builds kube-apiserver, kubelet, kube-scheduler, kube-controller-manager and kubectl (and helm)
# from the k8s.io/kubernetes Go module pinned in tools/kube/go.mod into a cache outside the
# repository (test tooling only: the control-plane tests run kube-apiserver with etcd on
# loopback, as controller-runtime's envtest does; devnode's cluster runs the rest). A second
# run finds them and does nothing.
set -euo pipefail
export PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || { echo "the Go toolchain is needed to build kube-apiserver (test tools only)" >&2; exit 1; }
here="$(cd "$(dirname "$0")/kube" && pwd)"
KUBE_VERSION=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2}' "$here/go.mod")
[[ -n "$KUBE_VERSION" ]] || { echo "no k8s.io/kubernetes requirement in $here/go.mod" >&2; exit 1; }
BIN=${SNAPSHOT_TOOLS_BIN:-/var/cache/snapshot-tools/bin}
mkdir -p "$BIN"
minor=$(echo "$KUBE_VERSION" | cut -d. -f2)
v=k8s.io/component-base/version
ldflags="-s -w -X $v.gitVersion=${KUBE_VERSION} -X $v.gitMajor=1 -X $v.gitMinor=${minor} -X $v.gitTreeState=clean"
# kube-apiserver for the control-plane tests; the kubelet, scheduler, controller-manager,
# kube-proxy and kubectl for devnode's one-node cluster; kubeadm for the kind node image (the
# same release, from the same module pins)
for cmd in kube-apiserver kubelet kube-scheduler kube-controller-manager kube-proxy kubectl kubeadm; do
  ask=(--version); [[ $cmd == kubectl ]] && ask=(version --client)
  [[ $cmd == kubeadm ]] && ask=(version -o short)
  # read the whole answer first: grep -q stops reading at its match, and under pipefail the
  # writer's SIGPIPE (kubectl prints two lines) would count as "not built" and rebuild it
  if [[ -x "$BIN/$cmd" ]] && [[ $("$BIN/$cmd" "${ask[@]}" 2>/dev/null) == *"${KUBE_VERSION}"* ]]; then
    echo "$cmd ${KUBE_VERSION} already in $BIN"; continue
  fi
  echo "building $cmd ${KUBE_VERSION} (minutes on a small machine)"
  (cd "$here" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" \
    -o "$BIN/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd")
  mv "$BIN/$cmd.tmp" "$BIN/$cmd"
done
"$BIN/kube-apiserver" --version

# helm, to lint and render the chart in tests (charts/snapshot).
HELM_VERSION=${HELM_VERSION:-v3.22.0}
if [[ -x "$BIN/helm" ]] && "$BIN/helm" version --short | grep -q "^${HELM_VERSION}"; then
  echo "helm ${HELM_VERSION} already in $BIN"
else
  echo "building helm ${HELM_VERSION}"
  GOBIN="$BIN" CGO_ENABLED=0 GOFLAGS=-mod=mod go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}" \
    "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"
  "$BIN/helm" version --short
fi
