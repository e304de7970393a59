"""Start a plain process the way a container runtime would for checkpointing: in its own PID
and mount namespace with its own /proc, as a session leader, with stdio opened inside.

CRIU needs all three: restored PIDs must be free (a fresh PID namespace guarantees it, where
the host's are taken by driver threads), CUDA needs a /proc that matches its PID namespace,
and CRIU refuses a tree whose session leader is outside it. Containers get this from runc;
``snapshotctl run`` gives it to plain processes (demos, tests, the GPU proof).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from . import procs
from .errors import SnapshotError
from .netns import netns_path

# stdio are opened after unshare, inside the new mount namespace: a descriptor inherited from
# the host's mounts cannot be dumped ("Can't lookup mount=N for fd=0").
_INNER = 'exec setsid "$@" </dev/null >>"$SNAPSHOT_SANDBOX_LOG" 2>&1'


def start(
    argv: list[str],
    log: Path,
    netns: str | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout_s: float = 10.0,
) -> int:
    """Start ``argv``; return the host PID of its process (PID 1 of its namespace)."""
    if not argv:
        raise SnapshotError("no command given")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.touch()
    cmd = ["unshare", "--pid", "--fork", "--mount-proc", "--", "sh", "-c", _INNER, "sh", *argv]
    if netns:
        cmd = ["nsenter", f"--net={netns_path(netns)}", "--", *cmd]
    full_env = {**os.environ, **(env or {}), "SNAPSHOT_SANDBOX_LOG": str(log.absolute())}
    launcher = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,
        start_new_session=True,
        env=full_env,
        cwd=cwd,
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if launcher.poll() is not None:
            raise SnapshotError(
                f"{argv[0]} exited at once (status {launcher.returncode}); see {log}"
            )
        kids = procs.children(launcher.pid)
        # nsenter (if any) execs unshare in place, so the launcher's child is the namespace
        # init; wait until the shell has exec'd the command.
        if kids and procs.cmdline(kids[0])[:1] not in (["sh"], ["unshare"], ["setsid"]):
            return kids[0]
        time.sleep(0.01)
    raise SnapshotError(f"{argv[0]} did not start within {timeout_s}s")
