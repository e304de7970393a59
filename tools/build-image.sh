#!/usr/bin/env bash
# An image's base without Docker: a Debian root filesystem from mmdebstrap and a virtualenv
# holding pinned Python dependencies (wheels downloaded here for the image's Python, installed
# offline inside the root filesystem). Written as one layer tar into a cache outside the
# repository, keyed by what goes in; a second run finds it and only prints its path.
#
#   tools/build-image.sh snapshot   # the project image: image/debian-packages (the list the
#                                   # Dockerfile installs too), /opt/snapshot with the project's
#                                   # dependencies (extras control, gpu)
#   tools/build-image.sh cpu-demo   # the CPU demo's: python3, /opt/venv with the demo extra
#
# devnode/project_image.py adds the code as a second layer on top (so a code change never
# rebuilds this) and pushes the image to devnode's registry.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
name=${1:-snapshot}
CACHE=${SNAPSHOT_IMAGE_CACHE:-/var/cache/snapshot-tools/images}
SUITE=trixie
PY=3.13   # trixie's python3
MIRROR=http://deb.debian.org/debian
# a Python with pip: Debian's python3 has none without python3-pip (make uses the venv's)
host_python=${SNAPSHOT_PYTHON:-python3}

case "$name" in
  snapshot)
    packages=$(grep -v '^#' "$root/image/debian-packages" | paste -sd, -)
    venv=/opt/snapshot ;;
  cpu-demo)
    packages=python3,python3-venv,libstdc++6,libgomp1  # numpy, scipy and scikit-learn link them
    venv=/opt/venv ;;
  *) echo "unknown image $name (snapshot, cpu-demo)" >&2; exit 2 ;;
esac
key=$(cat "$root/image/debian-packages" "$root/pyproject.toml" "$0" "$root/scripts/link-pycriu.sh" \
      | { cat; echo "$name"; } | sha256sum | cut -c1-16)
out="$CACHE/$name-base-$key.tar"
if [[ -s "$out" ]]; then echo "$out"; exit 0; fi
command -v mmdebstrap >/dev/null || { echo "mmdebstrap is needed (make system installs it)" >&2; exit 1; }
# mmdebstrap's root mode runs `mount --make-rprivate /` in the mount namespace it was started
# in: on the host, that turns every shared mount private (a running cluster's kubelet root, or
# a systemd host's /). The build gets a mount namespace of its own, so the host's stay as
# they are.
if [[ -z ${SNAPSHOT_IMAGE_OWN_MOUNTS:-} ]]; then
  SNAPSHOT_IMAGE_OWN_MOUNTS=1 exec unshare --mount --propagation private -- bash "$0" "$@"
fi
mkdir -p "$CACHE"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# manylinux wheels for the image's Python: no compiler in the image, no network in the chroot
dl=("$host_python" -m pip download -q -d "$work/wheels" --only-binary=:all: --python-version "$PY"
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux2014_x86_64 --platform any)
if [[ $name == snapshot ]]; then
  # the project's wheel is built from a copy: building in place leaves build/ in the checkout
  git -C "$root" ls-files -z | (cd "$root" && tar --null -cf - -T -) | (mkdir "$work/src" && tar -xf - -C "$work/src")
  "$host_python" -m pip wheel -q --no-deps -w "$work/wheels" "$work/src" >&2
  whl=$(ls "$work"/wheels/*.whl)
  "${dl[@]}" "gpu-snapshot[control,gpu] @ file://$whl" >&2
  want='gpu-snapshot[control,gpu]'
else
  mapfile -t reqs < <("$host_python" -c 'import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]["demo"]))' \
    "$root/pyproject.toml")
  "${dl[@]}" "${reqs[@]}" >&2
  want="${reqs[*]}"
fi
cp "$root/scripts/link-pycriu.sh" "$work/wheels/"

hooks=(--customize-hook="copy-in $work/wheels /tmp"
       --customize-hook="chroot \"\$1\" python3 -m venv $venv"
       --customize-hook="chroot \"\$1\" env -u PIP_FIND_LINKS $venv/bin/pip install -q --no-index --no-compile --find-links /tmp/wheels $want")
if [[ $name == cpu-demo ]]; then
  # Compiled, as the Dockerfile's pip compiles them: without it the demo's first start wrote
  # 1157 .pyc files (22 MB) into its writable layer, which its rootfs diff then carried and
  # every restore unpacked (0.6-1.6 s of the restore's setup in the cluster story). Checked by
  # the source's hash, not its time: the layer's tar keeps other times than pip's compile saw.
  hooks+=(--customize-hook="chroot \"\$1\" $venv/bin/python -m compileall -q --invalidation-mode checked-hash $venv/lib")
fi
if [[ $name == snapshot ]]; then
  # the code layer brings the project's packages; the dist-info and console scripts stay
  hooks+=(--customize-hook="chroot \"\$1\" bash /tmp/wheels/link-pycriu.sh $venv"
          --customize-hook='for p in api restore_runtime shim webhook controller agent signer kubeclient; do rm -rf "$1"/opt/snapshot/lib/python*/site-packages/$p; done')
fi
hooks+=(--customize-hook='rm -rf "$1"/tmp/wheels "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*')

echo "mmdebstrap $SUITE for $name: $packages" >&2
# package mirrors may serve a frozen snapshot of the archive, whose Release files "expired"
mmdebstrap --variant=essential --include="$packages" \
  --aptopt="APT::Default-Release \"$SUITE\"" \
  --aptopt='Acquire::Check-Valid-Until "false"' --aptopt='Acquire::Check-Date "false"' \
  "${hooks[@]}" "$SUITE" "$work/rootfs.tar" "deb $MIRROR $SUITE main" "deb $MIRROR sid main" >&2
mv "$work/rootfs.tar" "$out.tmp"
mv "$out.tmp" "$out"
# the bases of earlier keys are dead weight (400 MB each)
find "$CACHE" -maxdepth 1 -name "$name-base-*" ! -name "$(basename "$out" .tar).*" -delete
echo "$out"
