#!/usr/bin/env bash
# Builds the node bundle here (this machine's interpreter, libraries, loader and CRIU, as the
# image's install-node copies them) for a GPU run: .bundle/snapshot-bundle.tar.xz, unpacked
# on the GPU machine at / (/opt/snapshot/<version>/, /opt/snapshot/current). With it,
# run-sizes.sh's BUNDLE=1 runs the shim from the bundle instead of the GPU machine's Python,
# on a host whose glibc (Ubuntu 24.04's 2.39) is older than the bundle's.
#
#   bash bench/gpu/bundle-carry.sh      # then: run carrying [".bundle"] (45 MB), the .deb,
#                                       # .whl and .deb-node of an earlier call still there
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .bundle
mkdir -p .bundle/host
.venv/bin/python -c 'import sys; from pathlib import Path; from devnode.node_site import site_packages; site_packages(Path(sys.argv[1]))' .bundle/site
.venv/bin/python -m agent.cli install-node --host-root .bundle/host --packages .bundle/site \
  --skip-host-check --no-signing-required >/dev/null
# no bytecode (run-sizes.sh compiles it there with the bundle's own interpreter): 45 MB
tar --exclude=__pycache__ -C .bundle/host -cf - opt | xz -T0 -6 > .bundle/snapshot-bundle.tar.xz
rm -rf .bundle/host .bundle/site
ls -la .bundle/snapshot-bundle.tar.xz
