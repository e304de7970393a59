#!/usr/bin/env bash
# Builds crictl and critest (CRI conformance) from the cri-tools Go module into a cache outside
# the repository; a second run finds them and does nothing.
set -euo pipefail
export PATH="$PATH:/usr/local/go/bin:$HOME/go/bin"
command -v go >/dev/null || { echo "the Go toolchain is needed to build crictl/critest (test tools only)" >&2; exit 1; }
CRI_TOOLS_VERSION=${CRI_TOOLS_VERSION:-v1.37.0}
BIN=${SNAPSHOT_TOOLS_BIN:-/var/cache/snapshot-tools/bin}
mkdir -p "$BIN"
if [[ -x "$BIN/crictl" && -x "$BIN/critest" ]] && "$BIN/crictl" --version | grep -q "${CRI_TOOLS_VERSION#v}"; then
  echo "crictl and critest ${CRI_TOOLS_VERSION} already in $BIN"; exit 0
fi
export GOBIN="$BIN" CGO_ENABLED=0 GOFLAGS=-mod=mod
ldflags="-X sigs.k8s.io/cri-tools/pkg/version.Version=${CRI_TOOLS_VERSION}"
go install -ldflags "$ldflags" "sigs.k8s.io/cri-tools/cmd/crictl@${CRI_TOOLS_VERSION}"
# critest is a compiled Go test binary (cmd/critest holds only _test.go files).
go mod download "sigs.k8s.io/cri-tools@${CRI_TOOLS_VERSION}"
src="$(go env GOMODCACHE)/sigs.k8s.io/cri-tools@${CRI_TOOLS_VERSION}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$src/." "$work/" && chmod -R u+w "$work" && rm -rf "$work/vendor"
(cd "$work" && go test -c -mod=mod -ldflags "$ldflags" -o "$BIN/critest" ./cmd/critest)
"$BIN/crictl" --version
