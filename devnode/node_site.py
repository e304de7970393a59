"""A site-packages as the image has it, for the node's code only: this checkout's packages and
the third-party ones any module of theirs imports. The node bundle's tests copy it (the whole
virtualenv is 700 MB), and the GPU runs carry it (bench/gpu/bundle-carry.sh)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

#: what the shim imports first to serve a restore; the rest it imports when it needs it
SHIM_IMPORTS = (
    "shim.bootstrap",
    "shim.task.service",
    "shim.process.restore",
    "restore_runtime.artifact.signing",
    "restore_runtime.executor.restore",
)
_IMPORT_ALL = """
import ast, importlib, json, pathlib, sys
names = set(sys.argv[2:])
for pkg in ("shim", "restore_runtime", "api"):
    for f in (pathlib.Path(sys.argv[1]) / pkg).rglob("*.py"):
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, ast.Import):
                names |= {a.name for a in n.names}
            elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
                names.add(n.module)
for name in sorted(names):
    try:
        importlib.import_module(name)
    except Exception:
        pass
print(json.dumps(sorted({f for m in list(sys.modules.values())
                         if "site-packages" in (f := getattr(m, "__file__", None) or "")})))
"""


def site_packages(dest: Path) -> Path:
    """A site-packages as an image has it, for the node's code: this checkout's packages and
    the third-party ones any module of theirs imports, found by importing them all (links,
    which the installer copies)."""
    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-c", _IMPORT_ALL, str(root), *SHIM_IMPORTS]
    files = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    dest.mkdir()
    for f in files:
        site = next(p for p in Path(f).parents if p.name == "site-packages")
        top = site / Path(f).relative_to(site).parts[0]
        if top.name.startswith("__editable__") or top.suffix == ".pth":
            continue
        if not (dest / top.name).exists():
            (dest / top.name).symlink_to(top)
    for pkg in ("api", "shim", "restore_runtime"):
        (dest / pkg).symlink_to(root / pkg)
    return dest
