"""Holes in files of our own staging: zero bytes the store need not hold.

A punched range reads as zero, so punching zeros changes neither the bytes nor their digest.
The page-file compaction (criu/sparse.py) frees what it moved; the memory file's hashing
(artifact/hashing.py) punches its zero blocks, so the store holds less."""

from __future__ import annotations

import ctypes
import errno
import os

#: the unit in which zero bytes are found and punched
ZERO_BLOCK = 64 * 1024
_ZEROS = bytes(ZERO_BLOCK)
_PUNCH_HOLE, _KEEP_SIZE = 0x02, 0x01
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]


def punch(fd: int, offset: int, length: int) -> None:
    """Free ``length`` bytes at ``offset``. A file system without holes (EOPNOTSUPP) keeps
    them: it only needs more room."""
    if length <= 0:
        return
    if _libc.fallocate(fd, _PUNCH_HOLE | _KEEP_SIZE, offset, length) != 0:
        err = ctypes.get_errno()
        if err != errno.EOPNOTSUPP:
            raise OSError(err, os.strerror(err))


def zero_blocks(buf: bytearray | bytes, length: int) -> list[tuple[int, int]]:
    """[start, end) runs of whole ``ZERO_BLOCK``s of zeros in ``buf[:length]``, at memcmp
    speed: ``startswith`` compares in place and stops at the first non-zero byte."""
    runs: list[tuple[int, int]] = []
    for at in range(0, length - ZERO_BLOCK + 1, ZERO_BLOCK):
        if buf.startswith(_ZEROS, at):
            if runs and runs[-1][1] == at:
                runs[-1] = (runs[-1][0], at + ZERO_BLOCK)
            else:
                runs.append((at, at + ZERO_BLOCK))
    return runs
