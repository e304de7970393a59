#!/usr/bin/env bash
# Expose Debian's pycriu (python3-pycriu, pure Python) to the virtualenv, and only pycriu:
# linking the whole dist-packages directory would shadow the venv's own pinned packages.
set -euo pipefail
venv=${1:?usage: link-pycriu.sh VENV}
src=$(dpkg -L python3-pycriu 2>/dev/null | grep -m1 '/pycriu$' || true)
[[ -n "$src" && -d "$src" ]] || { echo "python3-pycriu is not installed (run make system)" >&2; exit 1; }
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
ln -sfn "$src" "$site/pycriu"
"$venv/bin/python" -c 'from pycriu import images' || { echo "pycriu does not import in $venv" >&2; exit 1; }
