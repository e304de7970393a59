"""Fixtures shared by the engine's tests."""

from __future__ import annotations

import ctypes
import mmap
import os
import signal

import pytest

#: the memory-fill tests' chunk size (test_memfill.py, test_fill_ledger.py)
CHUNK = 4 << 20


@pytest.fixture
def target():
    """(pid, address) of a stopped child with 3 chunks of untouched private anonymous memory;
    killed afterwards."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        m = mmap.mmap(-1, 3 * CHUNK, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        os.write(w, ctypes.addressof(ctypes.c_char.from_buffer(m)).to_bytes(8, "little"))
        os.kill(os.getpid(), signal.SIGSTOP)
        os._exit(0)
    os.close(w)
    addr = int.from_bytes(os.read(r, 8), "little")
    os.close(r)
    os.waitpid(pid, os.WSTOPPED)
    yield pid, addr
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


_OPENED: list[int] = []


def opened(path) -> int:
    """``path`` opened as a restore opens its memory file (read-only, no link followed),
    closed when the test ends: the ledger and the fill take a descriptor, never a path."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    _OPENED.append(fd)
    return fd


@pytest.fixture(autouse=True)
def _close_opened():
    yield
    while _OPENED:
        os.close(_OPENED.pop())


@pytest.fixture
def artifact(tmp_path, cleanup_pids):
    """(artifact, port): the test counter asked three times, then checkpointed with real
    CRIU (its source killed after the test)."""
    from restore_runtime.executor.checkpoint import CheckpointRequest, checkpoint
    from tests.helpers import ask, start_counter

    pid, port = start_counter(tmp_path)
    cleanup_pids.append(pid)
    for _ in range(3):
        ask("127.0.0.1", port)
    art = tmp_path / "art"
    checkpoint(CheckpointRequest(output=art, pid=pid))
    return art, port
