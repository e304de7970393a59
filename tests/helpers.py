"""Shared helpers for the engine tests: start the counter workload, talk to it, clean up."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from devnode import free_port
from devnode.probe import first_response, parse
from restore_runtime import sandbox

ROOT = Path(__file__).resolve().parent.parent
COUNTER = ROOT / "tests" / "workloads" / "counter_server.py"
BACKLOG_LISTENER = ROOT / "tests" / "workloads" / "backlog_listener.py"


def ask(host: str, port: int, timeout: float = 10.0) -> dict[str, str]:
    """One request; returns the parsed ``key=value`` reply. Retries until ``timeout``."""
    try:
        _, line = first_response(host, port, time.monotonic(), timeout)
    except TimeoutError as e:
        raise AssertionError(str(e)) from None
    return parse(line)


def connect(host: str, port: int, timeout: float = 30.0) -> socket.socket:
    """A connection to a listener that may not be up yet (retried until ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection((host, port), timeout=5)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    for _ in range(300):
        if not Path(f"/proc/{pid}").exists():
            return
        # A restored tree is re-parented; reap it if it became our child.
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.01)


def start_counter(
    tmp: Path, host: str = "127.0.0.1", port: int | None = None, netns: str | None = None,
    control_dir: Path | None = None, script: Path = COUNTER,
) -> tuple[int, int]:  # fmt: skip
    port = port or free_port()
    env = (
        {"SNAPSHOT_CONTROL_DIR": str(control_dir)} if control_dir else {"SNAPSHOT_CONTROL_DIR": ""}
    )
    pid = sandbox.start(
        [sys.executable, str(script), host, str(port)], tmp / f"counter-{port}.log",
        netns=netns, env=env,
    )  # fmt: skip
    return pid, port


def snapshotctl(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(
        [sys.executable, "-m", "restore_runtime.cli", *args],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    if check and p.returncode != 0:
        raise AssertionError(f"snapshotctl {' '.join(args)} failed ({p.returncode}):\n{p.stderr}")
    return p


def restore_cli(art: Path, tmp: Path, *extra: str) -> tuple[int, dict]:
    """``snapshotctl restore ART --json``: the restored root's PID and the report."""
    pidfile = tmp / f"restored-{len(list(tmp.iterdir()))}.pid"
    out = snapshotctl("restore", str(art), "--pidfile", str(pidfile), "--json", *extra)
    return int(pidfile.read_text()), json.loads(out.stdout)


def get_json(ip: str, port: int, path: str = "/generate", timeout: float = 60.0) -> dict:
    """An HTTP workload's JSON answer (a stand-in engine's), retried until it serves (an
    engine asleep answers 503, which is retried too)."""
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://{ip}:{port}{path}", timeout=5) as r:
                return json.loads(r.read())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def processes(pattern: str) -> list[str]:
    """``pgrep -af PATTERN``: the matching processes' command lines, pgrep itself left out."""
    out = subprocess.run(["pgrep", "-af", "--", pattern], capture_output=True, text=True).stdout
    return [ln for ln in out.splitlines() if "pgrep" not in ln]


def shim_pids(container_id: str) -> list[int]:
    """The shim server(s) started for a container or pod sandbox (its ``start`` command
    line names the id)."""
    return [int(ln.split()[0]) for ln in processes(f"-id {container_id} .*start")]


#: what the shim imports first to serve a restore; the rest it imports when it needs it
SHIM_IMPORTS = ("shim.bootstrap", "shim.task.service", "shim.process.restore",
                "restore_runtime.artifact.signing", "restore_runtime.executor.restore")  # fmt: skip
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


def shim_packages(dest: Path) -> Path:
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
