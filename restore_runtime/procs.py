"""Process trees through /proc: which PIDs make up a workload, which of them use CUDA, and how
PIDs inside a PID namespace map to host PIDs."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from .errors import SnapshotError

PROC = Path("/proc")


def exists(pid: int) -> bool:
    return (PROC / str(pid)).exists()


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), or None when it is gone: with the PID,
    it names one process, never a later one that reused the number."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(stat.rpartition(")")[2].split()[19])


def running(pid: int) -> bool:
    """``pid`` exists and is not a zombie (dead, waiting for its parent to reap it)."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def require(pid: int) -> None:
    if not exists(pid):
        raise SnapshotError(f"no process with PID {pid}")


def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = list((PROC / str(pid) / "task").iterdir())
    except FileNotFoundError:
        return out
    for t in tasks:
        try:
            out += [int(x) for x in (t / "children").read_text().split()]
        except FileNotFoundError:
            continue
    return out


def tree(pid: int) -> list[int]:
    """pid and all its descendants, parents first."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo += children(p)
    return out


def continue_tree(pid: int) -> None:
    """SIGCONT to a stopped tree (CRIU left it stopped), parents first."""
    for p in tree(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGCONT)


def kill_tree(pid: int, timeout_s: float) -> None:
    """SIGKILL ``pid`` and its descendants, and wait until none of their PIDs is in use
    (reaping those that are our children), so a retry can restore the same PIDs."""
    pids = tree(pid)
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while pids and time.monotonic() < deadline:
        for p in pids:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(p, os.WNOHANG)
        pids = [p for p in pids if exists(p)]
        if pids:
            time.sleep(0.01)
    if pids:
        raise SnapshotError(f"restored processes {pids} did not go away within {timeout_s:g}s")


def ns_pid(pid: int) -> int:
    """The PID of ``pid`` inside its innermost PID namespace."""
    for line in (PROC / str(pid) / "status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    return pid


def host_pids_by_ns_pid(root: int) -> dict[int, int]:
    return {ns_pid(p): p for p in tree(root)}


def uses_nvidia_device(pid: int) -> bool:
    """True when the process holds an NVIDIA device node open: every process that has
    initialised CUDA holds /dev/nvidiactl (and usually /dev/nvidia-uvm)."""
    fd_dir = PROC / str(pid) / "fd"
    try:
        fds = os.listdir(fd_dir)
    except (FileNotFoundError, PermissionError):
        return False
    for fd in fds:
        try:
            if os.readlink(fd_dir / fd).startswith("/dev/nvidia"):
                return True
        except OSError:
            continue
    return False


def cuda_pids(root: int) -> list[int]:
    return [p for p in tree(root) if uses_nvidia_device(p)]


def maps_nvidia_device(pid: int) -> bool:
    """True when the process has an NVIDIA device node mapped into memory, which CRIU cannot
    dump unless the CUDA checkpoint released it first."""
    try:
        with open(PROC / str(pid) / "maps") as f:
            return any("/dev/nvidia" in line for line in f)
    except (FileNotFoundError, PermissionError):
        return False


def cmdline(pid: int) -> list[str]:
    raw = (PROC / str(pid) / "cmdline").read_bytes()
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def netns_inode(pid: int | str) -> int:
    return os.stat(PROC / str(pid) / "ns" / "net").st_ino
