"""Container stdio. containerd hands the shim FIFO paths (it reads stdout/stderr and writes
stdin through them); the container gets pipes, and the shim copies between the two, as the
runc shim does. Pipes rather than the FIFOs themselves keep the container's stdio
checkpointable (CRIU dumps pipes as external; a FIFO on the host is not in its mounts).

Output may also go to a file (`ctr run --log-uri file:///path`), as with the runc shim;
`binary://` logging drivers are refused at create. Output that cannot be delivered is read
and dropped: a container must never block on, or die of, a full or broken stdout."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import socket
import struct
import termios
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from restore_runtime.runc import Stdio

from .errors import Unimplemented

log = logging.getLogger(__name__)
_CHUNK = 32 * 1024
CONSOLE_DIR = Path("/run/snapshot-shim-tty")


@dataclass
class StdioPaths:
    stdin: str = ""
    stdout: str = ""
    stderr: str = ""
    terminal: bool = False


@dataclass
class _Sink:
    """The writable end of one output target, shared by the copies to it, and closed when
    the last lets go: containerd reads a FIFO without writers as the end of the container's
    output, so a cold start after a failed restore must take it over before the restore's
    copies let go (``ProcessIO.open(after=...)``)."""

    opening: asyncio.Future  # of the fd, or None where the target cannot be opened
    users: int = 0


@dataclass
class ProcessIO:
    """Pipes between runc's process and containerd's FIFOs, and the tasks copying them."""

    paths: StdioPaths
    #: output targets by path, shared with the ProcessIO this one took over from
    _sinks: dict[str, _Sink] = field(default_factory=dict)
    child: Stdio = field(default_factory=Stdio)
    _close_after_start: list[int] = field(default_factory=list)
    _tasks: list[asyncio.Task] = field(default_factory=list)
    _outputs: list[asyncio.Task] = field(default_factory=list)
    _stdin_w: int | None = None

    #: for a terminal: where runc sends the pty master (--console-socket)
    console_socket: str | None = None
    _console: socket.socket | None = None
    master: int | None = None

    @classmethod
    async def open(cls, paths: StdioPaths, after: ProcessIO | None = None) -> ProcessIO:
        """The stdio of a new process; ``after``: the one of a process it replaces (a
        failed restore's), whose output targets it takes over before that one is closed."""
        for target in (paths.stdout, paths.stderr):
            scheme = target.split("://", 1)[0] if "://" in target else ""
            if scheme not in ("", "fifo", "file"):
                raise Unimplemented(
                    f"stdio {target!r}: {scheme}:// logging is not "
                    "supported by this shim (FIFOs and file:// are)"
                )
        io = cls(paths) if after is None else cls(paths, _sinks=after._sinks)
        if paths.terminal:
            # runc connects here and passes the pty master it made (SCM_RIGHTS); the shim
            # then copies between the master and containerd's FIFOs.
            # a short directory: unix socket paths are limited to 108 bytes
            CONSOLE_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
            path = CONSOLE_DIR / f"{uuid.uuid4().hex[:12]}.sock"
            io._console = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            io._console.bind(str(path))
            io._console.listen(1)
            io.console_socket = str(path)
            return io
        if paths.stdin:
            r, w = os.pipe()
            io.child.stdin = r
            io._close_after_start.append(r)
            io._stdin_w = w
            io._tasks.append(asyncio.ensure_future(io._copy_in(paths.stdin, w)))
        for name in ("stdout", "stderr"):
            path = getattr(paths, name)
            if not path:
                continue
            r, w = os.pipe()
            setattr(io.child, name, w)
            io._close_after_start.append(w)
            io._output(io._copy_out(r, path), path)
        return io

    async def receive_master(self, timeout: float = 30.0) -> None:
        """Take the pty master from runc (call while runc create/exec runs), start copying."""
        assert self._console is not None
        loop = asyncio.get_running_loop()
        self._console.settimeout(timeout)
        try:
            self.master = await loop.run_in_executor(None, _recv_fd, self._console)
        finally:
            self._console.close()
            with contextlib.suppress(OSError):
                os.unlink(self.console_socket or "")
        if self.paths.stdout:
            self._output(self._copy_out(os.dup(self.master), self.paths.stdout), self.paths.stdout)
        if self.paths.stdin:
            self._stdin_w = os.dup(self.master)
            self._tasks.append(
                asyncio.ensure_future(self._copy_in(self.paths.stdin, self._stdin_w))
            )

    def resize(self, width: int, height: int) -> None:
        if self.master is not None:
            fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0))

    def after_start(self) -> None:
        """The process holds its ends now; drop ours so EOF propagates when it exits."""
        for fd in self._close_after_start:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._close_after_start.clear()

    def close_stdin(self) -> None:
        if self._stdin_w is not None:
            with contextlib.suppress(OSError):
                os.close(self._stdin_w)
            self._stdin_w = None

    def _output(self, coro, target: str) -> None:
        """A copy to ``target``, holding its sink from now until the copy ends, however it
        ends (cancelled before its first step too)."""
        self._acquire(target)
        task = asyncio.ensure_future(coro)
        task.add_done_callback(lambda _t: self._release(target))
        self._tasks.append(task)
        self._outputs.append(task)

    def _acquire(self, target: str) -> None:
        sink = self._sinks.get(target)
        if sink is None:
            sink = self._sinks[target] = _Sink(asyncio.ensure_future(_open_sink(target)))
        sink.users += 1

    def _release(self, target: str) -> None:
        sink = self._sinks[target]
        sink.users -= 1
        if sink.users:
            return
        del self._sinks[target]
        if not sink.opening.done():
            sink.opening.cancel()  # _open_in_thread closes what the open still returns
        elif not sink.opening.cancelled() and (fd := sink.opening.result()) is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    async def wait_drained(self, timeout: float = 5.0) -> None:
        """Wait for output copies to finish (the process exited and its pipes hit EOF); stdin
        is not waited for, containerd may keep it open."""
        outs = [t for t in self._outputs if not t.done()]
        if outs:
            await asyncio.wait(outs, timeout=timeout)

    def close(self) -> None:
        self.after_start()
        self.close_stdin()
        if self._console is not None:
            self._console.close()
        if self.master is not None:
            with contextlib.suppress(OSError):
                os.close(self.master)
            self.master = None
        for t in self._tasks:
            t.cancel()

    async def _copy_out(self, r: int, target: str) -> None:
        loop = asyncio.get_running_loop()
        try:
            # None: the target could not be opened (logged once), the output is dropped
            w: int | None = await asyncio.shield(self._sinks[target].opening)
            while True:
                data = await loop.run_in_executor(None, _read, r)
                if not data:
                    return
                if w is None:
                    continue
                try:
                    await loop.run_in_executor(None, _write_all, w, data)
                except OSError as e:
                    log.error("writing output to %s: %s; dropping the rest", target, e)
                    w = None  # the sink closes when its last copy ends
        finally:
            os.close(r)

    async def _copy_in(self, fifo: str, w: int) -> None:
        loop = asyncio.get_running_loop()
        try:
            r = await _open_in_thread(os.open, fifo, os.O_RDONLY)
        except OSError as e:
            log.error("cannot open %s: %s", fifo, e)
            return
        try:
            while self._stdin_w is not None:
                data = await loop.run_in_executor(None, _read, r)
                if not data:
                    break
                await loop.run_in_executor(None, _write_all, w, data)
        except OSError:
            pass
        finally:
            os.close(r)
            self.close_stdin()


async def _open_sink(target: str) -> int | None:
    try:
        return await _open_in_thread(open_output, target)
    except OSError as e:
        log.error("cannot open %s: %s; the container's output is dropped", target, e)
        return None


def _recv_fd(sock: socket.socket) -> int:
    conn, _ = sock.accept()
    with conn:
        _, fds, _, _ = socket.recv_fds(conn, 4096, 1)
    if not fds:
        raise OSError("runc sent no pty master over the console socket")
    return fds[0]


async def _open_in_thread(fn, *args) -> int:
    """fn(*args) -> fd, in a thread (opening a FIFO may block). If the caller is cancelled
    meanwhile, the thread still finishes the open: its fd is closed then, not leaked. A FIFO
    left open here keeps containerd waiting for EOF on it forever (tests/shim/process/
    test_io.py)."""
    fut = asyncio.get_running_loop().run_in_executor(None, fn, *args)
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        fut.add_done_callback(_close_result)
        raise


def _close_result(fut: asyncio.Future) -> None:
    if not fut.cancelled() and fut.exception() is None:
        with contextlib.suppress(OSError):
            os.close(fut.result())


def open_output(target: str) -> int:
    """A writable fd for an output target: a FIFO path (O_RDWR never blocks and survives
    containerd reconnecting), or file:///path (appended to, created with its directory)."""
    if target.startswith("file://"):
        path = Path(target.removeprefix("file://"))
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    return os.open(target.removeprefix("fifo://"), os.O_RDWR)


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, _CHUNK)
    except OSError as e:
        if e.errno in (errno.EIO, errno.EBADF):
            return b""
        raise


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
