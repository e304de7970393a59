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
