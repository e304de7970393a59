"""The agent's and the shim's side of the workload handshake, in a pod's control directory
(the contract is api/handshake.py; the workload's side is workload.py): ask for a checkpoint
and wait for the workload's answer, tell it it runs again, leave the restore report, and read
the files the tenant controls, safely."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import stat
import time
from datetime import UTC, datetime
from pathlib import Path

from api.handshake import (
    CHECKPOINT_REQUESTED,
    READY_FOR_SNAPSHOT,
    RESTORE_COMPLETE,
    RESTORE_REPORT,
    RestoreComplete,
    atomic_write,
)
from api.report import RestoreReport

from .errors import HandshakeTimeout, SnapshotError

POLL_S = 0.02
#: the most the agent reads of a file the workload wrote (they are small JSON documents)
MAX_CONTROL_FILE = 64 * 1024


class UnsafeControlFile(SnapshotError):
    """A file in a pod's control directory that is not a small regular file."""


def read_control_file(path: Path, limit: int = MAX_CONTROL_FILE) -> bytes:
    """Read a file of a pod's control directory, which its tenant controls: never through a
    symlink, never blocking (a FIFO), only a regular file of at most ``limit`` bytes.
    FileNotFoundError when absent; UnsafeControlFile for anything else."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise FileNotFoundError(path) from e
        raise UnsafeControlFile(f"{path.name}: cannot open safely ({e.strerror})") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeControlFile(f"{path.name}: not a regular file")
        if st.st_size > limit:
            raise UnsafeControlFile(f"{path.name}: {st.st_size} bytes, over the {limit} limit")
        data = os.read(fd, limit + 1)
        if len(data) > limit:
            raise UnsafeControlFile(f"{path.name}: over the {limit} byte limit")
        return data
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def request_checkpoint(control_dir: Path, timeout_s: float) -> dict:
    """Ask the workload to quiesce and wait for ``ready-for-snapshot``; return its payload
    (a JSON object, possibly empty)."""
    if not control_dir.is_dir():
        raise SnapshotError(f"control directory {control_dir} does not exist")
    for stale in (READY_FOR_SNAPSHOT, RESTORE_COMPLETE):
        _remove(control_dir / stale)
    payload = json.dumps({"requestedAt": datetime.now(UTC).isoformat()}).encode()
    atomic_write(control_dir / CHECKPOINT_REQUESTED, payload)
    ready = control_dir / READY_FOR_SNAPSHOT
    deadline = time.monotonic() + timeout_s
    while not ready.exists():
        if time.monotonic() > deadline:
            _remove(control_dir / CHECKPOINT_REQUESTED)
            raise HandshakeTimeout(
                f"workload did not write {READY_FOR_SNAPSHOT} in {control_dir} within "
                f"{timeout_s:g}s after {CHECKPOINT_REQUESTED}; is it using "
                "restore_runtime.workload (or an engine adapter)?"
            )
        time.sleep(POLL_S)
    try:
        data = json.loads(read_control_file(ready) or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError, OSError, UnsafeControlFile):
        data = {}
    return data if isinstance(data, dict) else {}


def complete_restore(
    control_dir: Path, pod_ip: str | None, timings: dict[str, float], mode: str = "restored"
) -> None:
    """Tell the workload it runs again (after a restore, or in place after a dump with
    --leave-running): clear the checkpoint files, then write ``restore-complete``."""
    for stale in (CHECKPOINT_REQUESTED, READY_FOR_SNAPSHOT):
        _remove(control_dir / stale)
    msg = RestoreComplete(
        pod_ip=pod_ip,
        hostname=socket.gethostname(),
        restored_at=datetime.now(UTC).isoformat(),
        timings=timings,
        mode=mode,
    )
    atomic_write(control_dir / RESTORE_COMPLETE, msg.to_json())


def write_report(control_dir: Path, report: RestoreReport) -> None:
    """Leave the restore report where operators (and the node agent) look for it."""
    atomic_write(control_dir / RESTORE_REPORT, report.to_json())
