"""A process whose bulk is shared memory, as an engine's pinned host buffers are: SIZE MiB of
``MAP_SHARED|MAP_ANONYMOUS`` memory and SIZE MiB of a memfd, both filled with a pattern. It
writes its PID to READY and answers each connection on PORT with the digest of both.

    python shared_memory.py SIZE_MIB PORT READY
"""

from __future__ import annotations

import hashlib
import mmap
import os
import socket
import sys

MiB = 1 << 20


def main() -> None:
    size, port, ready = int(sys.argv[1]) * MiB, int(sys.argv[2]), sys.argv[3]
    anon = mmap.mmap(-1, size)  # MAP_SHARED | MAP_ANONYMOUS
    fd = os.memfd_create("pinned")
    os.ftruncate(fd, size)
    memfd = mmap.mmap(fd, size)
    block = hashlib.sha256(b"shared").digest() * (MiB // 32)
    for at in range(0, size, MiB):
        anon[at : at + MiB] = block
        memfd[at : at + MiB] = block[::-1]
    srv = socket.create_server(("127.0.0.1", port))
    with open(ready, "w") as f:
        f.write(str(os.getpid()))
    while True:
        conn, _ = srv.accept()
        with conn:
            h = hashlib.sha256(anon)
            h.update(memfd)
            conn.sendall(h.hexdigest().encode() + b"\n")


if __name__ == "__main__":
    main()
