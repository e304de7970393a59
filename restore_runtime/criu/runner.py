"""The only module that runs the ``criu`` binary."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

from ..errors import CriuError, SnapshotError

CRIU_ENV = "SNAPSHOT_CRIU"
MIN_VERSION = (4, 2)
# CRIU logs a few "Error" lines that do not fail the operation (for example it cannot raise
# RLIMIT_NOFILE in a VM without CAP_SYS_RESOURCE); keep them out of the reported reason.
_BENIGN = (re.compile(r"rlimit: Can't setup RLIMIT_NOFILE"),)
_ERROR_LINE = re.compile(r"\b(Error|BUG)\b")


def criu_binary() -> str:
    path = os.environ.get(CRIU_ENV) or shutil.which("criu")
    if not path:
        raise SnapshotError("criu not found: install CRIU >= 4.2 (make setup) or set SNAPSHOT_CRIU")
    return path


@cache
def criu_version() -> str:
    out = subprocess.run(
        [criu_binary(), "--version"], capture_output=True, text=True, check=False
    ).stdout
    return parse_version(out)


def parse_version(out: str) -> str:
    """The version from ``criu --version``'s output."""
    m = re.search(r"Version:\s*(\S+)", out)
    if not m:
        raise SnapshotError(f"cannot read the CRIU version from: {out!r}")
    return m.group(1)


def version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def require_version(v: str | None = None) -> str:
    """Fail unless CRIU (version ``v``, or the installed one's) is new enough."""
    v = v or criu_version()
    if version_tuple(v)[:2] < MIN_VERSION:
        raise SnapshotError(
            f"CRIU {v} is too old: {'.'.join(map(str, MIN_VERSION))} or newer is required "
            "(older versions cannot dump TCP sockets or fail on current kernels)"
        )
    return v


#: CRIU stamps each log line with the seconds since it started: "(00.123456) ..."
_STAMP = re.compile(rb"^\((\d+\.\d+)\)", re.MULTILINE)


def own_seconds(log_path: Path) -> float | None:
    """How long CRIU itself ran, from the last time stamp of its log; None without one.
    Through runc, the rest of a restore's CRIU phase is runc's (its start, cgroups, mounts)."""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            stamps = _STAMP.findall(f.read())
    except OSError:
        return None
    return float(stamps[-1]) if stamps else None


def error_lines(log: str, limit: int = 20) -> list[str]:
    lines = [
        ln.strip()
        for ln in log.splitlines()
        if _ERROR_LINE.search(ln) and not any(b.search(ln) for b in _BENIGN)
    ]
    return lines[-limit:]


def run(args: list[str], log_path: Path, pass_fds: tuple[int, ...] = ()) -> None:
    """Run ``criu ARGS``; on failure raise CriuError with the log's error lines."""
    proc = subprocess.run(
        [criu_binary(), *args],
        capture_output=True,
        text=True,
        pass_fds=pass_fds,
        check=False,
    )
    if proc.returncode != 0:
        fallback = error_lines(proc.stderr) or proc.stderr.strip().splitlines()
        raise failure(args[0], proc.returncode, log_path, fallback[-20:])


#: CRIU cannot dump a mount of a filesystem it does not know (a squashfs of driver files
#: carried into the container by a recursive bind, say)
_UNSUPPORTED_MOUNT = re.compile(r"mnt: FS mnt \.?(\S+) dev (\S+) root \S+ unsupported id (\d+)")


def failure(action: str, returncode: int, log_path: Path, fallback: list[str]) -> CriuError:
    """A failed CRIU run (direct or through runc) as the error lines of its log; ``fallback``
    (the caller's stderr or message) where the log has none. A mount CRIU cannot dump is
    named first, with what to do about it."""
    try:
        text = log_path.read_text(errors="replace")
    except FileNotFoundError:
        text = ""
    lines = error_lines(text) or fallback
    if m := _UNSUPPORTED_MOUNT.search(text):
        where, dev, fs = m.groups()
        hint = (
            f"the mount at {where} (device {dev}, filesystem type id {fs}) cannot be "
            "dumped: bind it into the container as a mount of its own (not inside a "
            "recursive bind), so that it is external"
        )
        lines = [hint, *lines]
    if (full := _out_of_space(log_path.parent)) is not None:
        lines = [full, *lines]
    return CriuError(action, returncode, lines, str(log_path))


def _out_of_space(where: Path) -> str | None:
    """The cause, when the file system CRIU writes to is full: its log lives there too, so
    the line that would say so is often the one it could not write."""
    try:
        st = os.statvfs(where)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    if free >= _FULL_BELOW:
        return None
    return f"No space left on device: {free} bytes free where the images are written ({where})"


#: less than this left on the images' file system counts as full (CRIU writes pages in
#: blocks of up to 4 MiB, its log line by line)
_FULL_BELOW = 1 << 20
