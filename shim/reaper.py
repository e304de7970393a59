"""The shim is the child subreaper of its containers: every process of theirs that loses its
parent, and runc itself, ends up as our child. One reaper owns ``waitpid(-1)``: it hands
each exit to whoever awaits that PID — the runc driver for runc's own processes (the reaper
is its CommandRunner), the task service for container processes — and keeps exits nobody
claimed yet (a container's init can exit before runc's pid file is read)."""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import subprocess
from collections.abc import Callable

log = logging.getLogger(__name__)
PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def exit_code(status: int) -> int:
    """A wait status as containerd reports it: the exit code, or 128+signal."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 255


class Reaper:
    def __init__(self) -> None:
        self._waiters: dict[int, list[asyncio.Future]] = {}
        self._unclaimed: dict[int, int] = {}
        self._subscribers: list[Callable[[int, int], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.add_signal_handler(signal.SIGCHLD, self.reap)
        self.reap()

    def subscribe(self, fn: Callable[[int, int], None]) -> None:
        """``fn(pid, exit_code)`` is called for every exit (the task service's hook)."""
        self._subscribers.append(fn)

    def wait(self, pid: int) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        if pid in self._unclaimed:
            fut.set_result(self._unclaimed.pop(pid))
        else:
            self._waiters.setdefault(pid, []).append(fut)
        return fut

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            code = exit_code(status)
            waiters = self._waiters.pop(pid, None)
            if waiters:
                for f in waiters:
                    if not f.done():
                        f.set_result(code)
            else:
                self._unclaimed[pid] = code
                # bounded: exits of processes nobody asks about (orphans) are forgotten
                if len(self._unclaimed) > 4096:
                    self._unclaimed.pop(next(iter(self._unclaimed)))
            for fn in self._subscribers:
                try:
                    fn(pid, code)
                except Exception:
                    log.exception("exit subscriber failed for pid %d", pid)

    def forget(self, pid: int) -> int | None:
        """An exit already reaped for ``pid``, if any (consumed)."""
        return self._unclaimed.pop(pid, None)

    async def run(
        self, cmd: list[str], stdin=None, stdout=None, stderr=None, env=None
    ) -> tuple[int, bytes, bytes]:
        """Run a command whose exit this reaper collects (never Popen.wait, which would race
        with waitpid(-1)); returns (exit code, stdout, stderr) for the streams not given."""
        out_r = err_r = None
        if stdout is None:
            out_r, stdout = os.pipe()
        if stderr is None:
            err_r, stderr = os.pipe()
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=stdin if stdin is not None else subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                env=env,
                close_fds=True,
            )
        finally:
            for fd in (
                stdout if out_r is not None else None,
                stderr if err_r is not None else None,
            ):
                if fd is not None:
                    os.close(fd)
        fut = self.wait(proc.pid)
        loop = asyncio.get_running_loop()
        outs = await asyncio.gather(
            *(loop.run_in_executor(None, _read_all, fd) for fd in (out_r, err_r))
        )
        code = await fut
        proc.returncode = code  # tell Popen it is done; it must not wait on its own
        return code, outs[0], outs[1]


def _read_all(fd: int | None) -> bytes:
    if fd is None:
        return b""
    chunks = []
    try:
        while data := os.read(fd, 65536):
            chunks.append(data)
    finally:
        os.close(fd)
    return b"".join(chunks)
