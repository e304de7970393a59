"""A private containerd node on this machine (containerd + CRI + CNI bridge + our shim),
for the demo and the integration tests. Nothing here is part of the product."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from api.annotations import RESTORED_CONDITION

#: every process devnode starts (containerd and the shims it starts, the kubelet, the control
#: plane, registries) inherits this variable, naming the run that owns it: once that run is
#: gone (killed), ``python -m devnode.sweep`` knows what it left
OWNER_ENV = "SNAPSHOT_DEVNODE_OWNER"
os.environ[OWNER_ENV] = str(os.getpid())
#: a file in each directory devnode makes under /tmp, naming the run that owns it
OWNER_FILE = "devnode-owner.pid"


def claim(directory: Path) -> None:
    """Mark ``directory`` as this run's, for the sweep."""
    (directory / OWNER_FILE).write_text(f"{os.getpid()}\n")


def free_port() -> int:
    """A TCP port nothing listens on now, on loopback (for servers the tests start)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(
    ready: Callable[[], bool],
    procs: Sequence[subprocess.Popen] = (),
    what: str = "",
    log: Path | None = None,
    timeout: float = 30.0,
    poll: float = 0.2,
) -> None:
    """Poll ``ready()`` (its OSError means not yet) until true; fail with the tail of ``log``
    as soon as one of ``procs`` exits, or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{what}: {p.args[0]} exited {p.returncode}:\n{_tail(log)}")
        with contextlib.suppress(OSError):
            if ready():
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready after {timeout:g}s:\n{_tail(log)}")
        time.sleep(poll)


def wait_for(what: str, probe, timeout: float = 120.0, every: float = 0.5, why=lambda: ""):
    """``probe()``'s first true answer; fails after ``timeout`` seconds with ``why()`` (what
    an operator would look at)."""
    deadline = time.monotonic() + timeout
    while not (got := probe()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout:g}s\n{why()}")
        time.sleep(every)
    return got


def condition(obj: dict | None, kind: str) -> dict | None:
    """The condition of type ``kind`` in a Kubernetes object's status, or None."""
    conds = (obj or {}).get("status", {}).get("conditions") or []
    return next((c for c in conds if c["type"] == kind), None)


def restored_condition(pod: dict) -> dict | None:
    """The pod's nvidia.com/Restored condition, once the agent has reported."""
    return condition(pod, RESTORED_CONDITION)


def tamper_pages(art: Path, offset: int = 4096) -> Path:
    """One flipped byte, at ``offset``, in the artifact's largest memory image; returns that
    file."""
    pages = max(art.rglob("pages-*.img"), key=lambda f: f.stat().st_size)
    with pages.open("r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))
    return pages


def _tail(log: Path | None, chars: int = 3000) -> str:
    if log is None:
        return ""
    try:
        return f"({log})\n" + log.read_text(errors="replace")[-chars:]
    except OSError:
        return f"({log}: unreadable)"


def stop_process(p: subprocess.Popen, timeout: float) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds; reaped either way."""
    p.terminate()
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def mount_points() -> list[str]:
    """Every mount point of this mount namespace."""
    return [ln.split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines()]


def unmount_under(*roots: str | Path) -> None:
    """Every mount at or under ``roots``, deepest first, lazily (a killed process leaves its
    overlay and namespace mounts busy)."""
    tops = [str(r) for r in roots]
    under = [m for m in mount_points() if any(m == t or m.startswith(f"{t}/") for t in tops)]
    for target in sorted(under, key=len, reverse=True):
        subprocess.run(["umount", "-l", target], capture_output=True)


def links() -> list[dict]:
    """This network namespace's links, as ``ip -j link`` gives them."""
    p = subprocess.run(["ip", "-j", "link"], capture_output=True, text=True)
    return json.loads(p.stdout or "[]") if p.returncode == 0 else []
