#!/usr/bin/env bash
# Run here (with registry access), before a GPU run: downloads what the GPU machine cannot
# fetch into .deb/ and .whl/ (both git-ignored), which the device run carries. There,
# bench/gpu/setup-device.sh unpacks them. CRIU 4.2.1 comes from Debian unstable, its libraries
# from Debian 13; the wheels are the engine's dependencies for the device's Python 3.12.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .deb .whl
(cd .deb && apt-get download -q criu/sid libcompel1/sid libnet9/sid libnl-3-200/sid \
  python3-pycriu/sid libbsd0/trixie libffi8/trixie libgmp10/trixie libgnutls30t64/trixie \
  libhogweed6t64/trixie libidn2-0/trixie libjansson4/trixie libmd0/trixie libmnl0/trixie \
  libnettle8t64/trixie libnftables1/trixie libnftnl11/trixie libp11-kit0/trixie \
  libtasn1-6/trixie libunistring5/trixie libuuid1/trixie libxtables12/trixie \
  libprotobuf-c1/trixie)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_34_x86_64 -d .whl \
  pydantic==2.14.4 pydantic-core annotated-types typing-inspection typing_extensions==4.16.0 \
  cryptography==50.0.2 cffi pycparser pyroute2==0.9.7 protobuf==7.36.2 blake3==1.0.8
# For bench/gpu/shim_proof.py (the shim under containerd): containerd, runc and busybox-static
# from Debian 13, unpacked onto the bare GPU machine; iptables for CRIU's network lock when a
# container has a network namespace of its own (the --replicas rounds). No CNI.
mkdir -p .deb-node
(cd .deb-node && apt-get download -q containerd/trixie runc/trixie busybox-static/trixie \
  iptables/trixie libip4tc2/trixie libip6tc2/trixie libnetfilter-conntrack3/trixie \
  libnfnetlink0/trixie \
  libseccomp2/trixie)
du -sh .deb .whl .deb-node
