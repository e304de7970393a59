"""Dependencies stay one way: shim (and later webhook, controller) -> restore_runtime. The
engine imports none of the components above it, and no product code imports the dev/test
helpers (devnode, bench, examples, tests)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ABOVE_ENGINE = {"shim", "webhook", "controller"}
DEV_ONLY = {"devnode", "bench", "examples", "tests"}


def imported_packages(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


@pytest.mark.parametrize("package", ["restore_runtime", "shim", "webhook", "controller"])
def test_one_way_dependencies(package):
    # Nothing imports the shim or the webhook; only the engine is shared.
    forbidden = DEV_ONLY | (ABOVE_ENGINE - {package})
    bad = {
        str(p.relative_to(ROOT)): sorted(imported_packages(p) & forbidden)
        for p in (ROOT / package).rglob("*.py")
        if imported_packages(p) & forbidden
    }
    assert bad == {}


def test_workload_helper_stays_standard_library_only():
    allowed_local = {"restore_runtime", "__future__"}
    mods = imported_packages(ROOT / "restore_runtime" / "workload.py") | imported_packages(
        ROOT / "restore_runtime" / "contracts" / "handshake.py"
    )
    assert {m for m in mods if m not in sys.stdlib_module_names} <= allowed_local


CONTROL_PLANE_LIBS = {"kubernetes_asyncio", "fastapi", "uvicorn", "jsonpatch", "prometheus_client"}


def test_node_side_never_loads_the_control_plane_libraries():
    """The shim and the engine's data path run on every node, many times: they must not import
    the Kubernetes client or the web stack (only restore_runtime.kube and the agent may)."""
    allowed = {ROOT / "restore_runtime" / "kube.py"} | set(
        (ROOT / "restore_runtime" / "agent").rglob("*.py")
    )
    bad = {
        str(p.relative_to(ROOT)): sorted(imported_packages(p) & CONTROL_PLANE_LIBS)
        for pkg in ("shim", "restore_runtime")
        for p in (ROOT / pkg).rglob("*.py")
        if p not in allowed and imported_packages(p) & CONTROL_PLANE_LIBS
    }
    assert bad == {}
