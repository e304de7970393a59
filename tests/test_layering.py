"""Dependencies stay one way, with no exceptions listed:

- the engine (``restore_runtime``) imports nothing of ours above it, and no Kubernetes or web
  library: it is what every node runs;
- ``shim``, ``webhook``, ``controller``, ``agent`` import the engine; the control plane
  (webhook, controller, agent) may share ``kubeclient``; nothing imports ``shim``,
  ``webhook``, ``controller`` or ``agent``;
- ``devnode``, ``bench`` and ``examples`` use the libraries (engine, kubeclient) and run the
  components as processes; product code never imports them or the tests;
- inside the shim, layers run ttrpc/proto/reaper <- process <- task <- bootstrap.

Cases: every package against its rule; the shim's inner layers; the rule catching an upward
import planted in a copy of the tree; the workload helper staying standard-library only."""

from __future__ import annotations

import ast
import gc
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMPONENTS = {"shim", "webhook", "controller", "agent", "signer"}
DEV_ONLY = {"devnode", "bench", "examples", "tests"}
CONTROL_PLANE_LIBS = {
    "kubernetes_asyncio",
    "kubernetes",
    "fastapi",
    "uvicorn",
    "jsonpatch",
    "prometheus_client",
    "starlette",
    "httpx",
    "aiohttp",
}
ALL_OURS = {"api", "restore_runtime", "kubeclient"} | COMPONENTS | DEV_ONLY

#: package -> what of ours (and which third-party control-plane libraries) it may import:
#: the contracts (api/) import nothing of ours; the webhook, the controller and kubeclient
#: need the contracts only, never the engine
ALLOWED: dict[str, set[str]] = {
    "api": {"api"},
    "restore_runtime": {"api", "restore_runtime"},
    "kubeclient": {"api", "kubeclient"} | CONTROL_PLANE_LIBS,
    "shim": {"api", "restore_runtime", "shim"},
    "webhook": {"api", "kubeclient", "webhook"} | CONTROL_PLANE_LIBS,
    "controller": {"api", "kubeclient", "controller"} | CONTROL_PLANE_LIBS,
    "agent": {"api", "restore_runtime", "kubeclient", "agent"} | CONTROL_PLANE_LIBS,
    # the engine for its Ed25519 signing only (restore_runtime/artifact/signing.py)
    "signer": {"api", "restore_runtime", "kubeclient", "signer"} | CONTROL_PLANE_LIBS,
    "devnode": {"api", "restore_runtime", "kubeclient", "devnode"} | CONTROL_PLANE_LIBS,
    "bench": {"api", "restore_runtime", "devnode", "examples", "bench"} | CONTROL_PLANE_LIBS,
    "examples": {"api", "restore_runtime", "devnode", "examples"},
}

#: the shim's layers, lowest first: a module may import its own layer or those below
SHIM_LAYERS = [{"ttrpc", "proto", "reaper"}, {"process"}, {"task"}, {"bootstrap", "__main__"}]


def _parse(source: str) -> ast.Module:
    """``ast.parse`` with the garbage collector held off. CPython before 3.11.8 (gh-106905)
    keeps one AST recursion counter per interpreter: a finalizer that runs mid-parse and
    formats a traceback (3.11's carets parse source too) makes the outer parse fail with
    "AST constructor recursion depth mismatch". A task another test leaked is enough."""
    gc.disable()
    try:
        return ast.parse(source)
    finally:
        gc.enable()


def imports(path: Path, root: Path = ROOT) -> set[str]:
    """Absolute module names imported by a file (relative imports resolved)."""
    pkg = path.relative_to(root).with_suffix("").parts[:-1]
    out = set()
    for node in ast.walk(_parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = list(pkg[: len(pkg) - node.level + 1]) if node.level else []
            mod = ".".join([*base, *(node.module.split(".") if node.module else [])])
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names}
    return out


def violations(root: Path, package: str) -> dict[str, list[str]]:
    bad = {}
    for p in (root / package).rglob("*.py"):
        tops = {m.split(".")[0] for m in imports(p, root)}
        wrong = sorted((tops & (ALL_OURS | CONTROL_PLANE_LIBS)) - ALLOWED[package])
        if wrong:
            bad[str(p.relative_to(root))] = wrong
    return bad


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_one_way_dependencies(package):
    assert violations(ROOT, package) == {}


def _shim_layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "shim" or len(parts) < 2:
        return None
    return next((i for i, names in enumerate(SHIM_LAYERS) if parts[1] in names), None)


def shim_layer_violations(root: Path) -> dict[str, list[str]]:
    bad = {}
    for p in (root / "shim").rglob("*.py"):
        mine = _shim_layer(".".join(p.relative_to(root).with_suffix("").parts))
        if mine is None:
            continue
        above = sorted(m for m in imports(p, root) if (_shim_layer(m) or -1) > mine)
        if above:
            bad[str(p.relative_to(root))] = above
    return bad


def test_shim_layers_run_downward():
    """The runc driver (in the engine) and the reaper sit below process/, which sits below
    task/: no module imports a layer above its own."""
    assert shim_layer_violations(ROOT) == {}


@pytest.mark.parametrize(
    ("where", "line"),
    [
        ("restore_runtime/compat.py", "from agent import decisions"),
        ("restore_runtime/compat.py", "import kubernetes_asyncio"),
        ("restore_runtime/executor/restore.py", "from ...shim.process import states"),
        ("controller/jobs.py", "from webhook import mutate"),
        ("devnode/cri.py", "from shim.task import service"),
        ("api/node.py", "from restore_runtime.artifact import signing"),
        ("webhook/mutate.py", "from restore_runtime import compat"),
    ],
)
def test_an_upward_import_is_caught(tmp_path, where, line):
    """The rules are not vacuous: the same check fails on a copy of the tree with one upward
    import added."""
    for pkg in ALLOWED:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / where
    target.write_text(target.read_text() + f"\n{line}\n")
    assert violations(tmp_path, where.split("/")[0]) != {}


def test_shim_layer_check_catches_an_upward_import(tmp_path):
    shutil.copytree(ROOT / "shim", tmp_path / "shim", ignore=shutil.ignore_patterns("__pycache__"))
    reaper = tmp_path / "shim" / "reaper.py"
    reaper.write_text(reaper.read_text() + "\nfrom .task import service\n")
    assert shim_layer_violations(tmp_path) == {"shim/reaper.py": ["shim.task", "shim.task.service"]}


def test_workload_helper_stays_standard_library_only():
    allowed_local = {"api", "restore_runtime", "__future__"}
    mods = (
        imports(ROOT / "restore_runtime" / "workload.py")
        | imports(ROOT / "restore_runtime" / "offload.py")
        | imports(ROOT / "restore_runtime" / "errors.py")
        | imports(ROOT / "api" / "handshake.py")
    )
    assert {m.split(".")[0] for m in mods} - set(sys.stdlib_module_names) <= allowed_local


def test_workload_helpers_import_in_a_bare_interpreter():
    """The check above reads direct imports only; an import that pulls in pydantic through
    another module would pass it and then fail in a bare inference server. So the helpers are
    imported for real, in an interpreter with no site-packages (``-I -S``), and nothing but
    the standard library and the project's own modules may be loaded by them."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "import restore_runtime.offload, restore_runtime.workload, api.handshake; "
        "own = {'api', 'restore_runtime', '__main__'}; "
        "print(sorted(m for m in sys.modules "
        "if m.split('.')[0] not in sys.stdlib_module_names and m.split('.')[0] not in own))"
    )
    p = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, str(ROOT)], capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]", p.stdout
