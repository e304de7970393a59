"""Container stdio: no FIFO may stay open in the shim once its ProcessIO is closed.

containerd's side waits for EOF on the stdout/stderr FIFOs before it finishes deleting a
task (client task.Delete -> io.Wait). A FIFO the shim still holds open keeps that wait, and
with it containerd's CRI event loop, blocked forever: StopPodSandbox then hangs. This
happened once in CI after a restore fell back to a cold start, whose first ProcessIO was
closed while its copy tasks were still opening the FIFOs."""

from __future__ import annotations

import asyncio
import os

from shim.process.io import ProcessIO, StdioPaths


def fifo_fds(path: str) -> list[int]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == path:
                out.append(int(fd))
        except OSError:
            pass
    return out


async def test_closing_while_the_fifos_are_being_opened_leaks_no_fd(tmp_path):
    paths = StdioPaths(stdout=str(tmp_path / "out"), stderr=str(tmp_path / "err"))
    for p in (paths.stdout, paths.stderr):
        os.mkfifo(p)
    for _ in range(20):  # the window is a few microseconds wide: try it many times
        io = await ProcessIO.open(paths)
        await asyncio.sleep(0)  # the copy tasks start and hand the open to a thread
        io.close()  # ... and are cancelled while it runs (a failed restore does this)
        await asyncio.sleep(0.05)
        assert fifo_fds(paths.stdout) == [] and fifo_fds(paths.stderr) == []


async def test_output_reaches_the_fifo_and_is_released_at_eof(tmp_path):
    out = str(tmp_path / "out")
    os.mkfifo(out)
    reader = os.open(out, os.O_RDONLY | os.O_NONBLOCK)
    io = await ProcessIO.open(StdioPaths(stdout=out))
    os.write(io.child.stdout, b"hello\n")
    io.after_start()  # the "process" exits: its end of the pipe closes
    await io.wait_drained(timeout=5)
    os.set_blocking(reader, True)
    assert os.read(reader, 100) == b"hello\n"
    assert fifo_fds(out) == [reader]  # the shim let go of the FIFO: the reader sees EOF
    assert os.read(reader, 100) == b""
    os.close(reader)
