"""A parent and a forked child whose memory the memory file carries, for its tests.

Before the fork the parent fills 48 MiB of private anonymous memory (a malloc'd heap
buffer) and a 16 MiB private anonymous mapping; the child changes a quarter of the
mapping, so the rest is still shared copy-on-write with the parent's. An 8 MiB private
anonymous mapping holds data in its first MiB and zeros written over the rest (dumped pages
all the same, which the memory file punches out as holes). Beside them: a
read-only private anonymous mapping with data (never filled from outside: it stays in CRIU's
images), a shared anonymous mapping and a memfd mapping (as pinned host buffers are: CRIU
dumps both as shared objects, and the memory file carries them too), and a private mapping
of a file with one page changed. Each process answers on its own port with ``heap=HEX map=HEX
zeros=HEX ro=HEX shared=HEX memfd=HEX file=HEX`` (digests of what it sees), which only a faithful
restore keeps.

    python big_heap.py HOST PORT FILE     (the child answers on PORT + 1)
"""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import os
import sys

from counter_server import listen  # its sibling script (this directory is on sys.path)

MiB = 1 << 20
PRIVATE = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS


def _pattern(n: int, seed: int) -> bytes:
    block = hashlib.sha256(str(seed).encode()).digest() * (MiB // 32)
    return (block * (n // MiB + 1))[:n]


def main() -> None:
    host, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    heap = bytearray(_pattern(48 * MiB, 1))
    anon = mmap.mmap(-1, 16 * MiB, flags=PRIVATE)
    anon[:] = _pattern(16 * MiB, 2)
    zeros = mmap.mmap(-1, 8 * MiB, flags=PRIVATE)
    zeros[:] = _pattern(8 * MiB, 6)
    zeros[MiB:] = bytes(7 * MiB)
    ro = mmap.mmap(-1, 4 * MiB, flags=PRIVATE)
    ro[:] = _pattern(4 * MiB, 3)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(ro))
    if ctypes.CDLL(None).mprotect(ctypes.c_void_p(addr), ctypes.c_size_t(4 * MiB), 1):
        raise OSError("mprotect failed")
    shared = mmap.mmap(-1, 2 * MiB)  # MAP_SHARED | MAP_ANONYMOUS
    shared[:] = _pattern(2 * MiB, 4)
    fd = os.memfd_create("pinned")
    os.ftruncate(fd, 4 * MiB)
    memfd = mmap.mmap(fd, 4 * MiB)  # MAP_SHARED
    memfd[:] = _pattern(4 * MiB, 7)
    with open(path, "wb") as f:
        f.write(b"\x02" * (4 * 4096))
    with open(path, "r+b") as f:
        fmap = mmap.mmap(f.fileno(), 4 * 4096, flags=mmap.MAP_PRIVATE)
    fmap[:4096] = b"\x05" * 4096
    if os.fork() == 0:
        anon[: 4 * MiB] = _pattern(4 * MiB, 5)
        port += 1
    srv = listen(host, port)
    while True:
        conn, _ = srv.accept()
        with conn:
            parts = {
                "heap": heap,
                "map": anon,
                "zeros": zeros,
                "ro": ro,
                "shared": shared,
                "memfd": memfd,
                "file": fmap,
            }
            line = " ".join(f"{k}={hashlib.sha256(v).hexdigest()[:16]}" for k, v in parts.items())
            conn.sendall(f"{line} pid={os.getpid()}\n".encode())


if __name__ == "__main__":
    main()
