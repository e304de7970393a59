#!/usr/bin/env bash
# (Files come from bench/gpu/prepare-carry.sh, run on a machine with registries.)
# Prepares a bare GPU machine (no package registries) for the GPU proof: unpacks the carried
# CRIU 4.2 .deb files into a private prefix with a wrapper that points LD_LIBRARY_PATH at it
# (the host's own glibc stays in use), and installs the carried Python wheels.
set -euo pipefail
prefix=/opt/snapshot-criu
mkdir -p "$prefix"
for f in .deb/*.deb; do dpkg -x "$f" "$prefix"; done
libs="$prefix/usr/lib/x86_64-linux-gnu:$prefix/lib/x86_64-linux-gnu"
cat > "$prefix/criu" <<WRAP
#!/bin/sh
LD_LIBRARY_PATH="$libs" exec "$prefix/usr/sbin/criu" "\$@"
WRAP
chmod +x "$prefix/criu"
"$prefix/criu" --version
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
ln -sfn "$prefix/usr/lib/python3/dist-packages/pycriu" /tmp/site/pycriu
# Bytecode ahead, as the node installer ships it (this machine sets PYTHONDONTWRITEBYTECODE:
# without it every import compiles from source, 0.45 s for the engine alone).
python3 -m compileall -q -j 0 -x '/\.git/' /tmp/site "$PWD" >/dev/null || true
echo "export SNAPSHOT_CRIU=$prefix/criu PYTHONPATH=/tmp/site:$PWD"
