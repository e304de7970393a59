"""A TCP server whose memory holds touched zero pages, for the sparse-dump tests.

- 8 MiB of private anonymous memory, written with ones and then partly zeroed again (whole
  zero blocks, single zero pages): pages CRIU dumps although they hold only zeros;
- a private mapping of a file of ones (the path in argv) whose first page was zeroed: a zero
  page that must be restored as zero, not re-read from the file.

Each connection gets ``anon=HEX file=HEX``: digests of both, which only a faithful restore
keeps.

    python zero_pages.py HOST PORT FILE
"""

from __future__ import annotations

import hashlib
import mmap
import sys
import time

from counter_server import listen  # its sibling script (this directory is on sys.path)

PAGE = 4096
SIZE = 8 << 20


def main() -> None:
    host, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    anon = mmap.mmap(-1, SIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    anon[:] = b"\x01" * SIZE
    anon[: SIZE // 4] = bytes(SIZE // 4)  # a zero block
    for p in range(SIZE // 2, SIZE, 3 * PAGE):  # single zero pages between written ones
        anon[p : p + PAGE] = bytes(PAGE)
    with open(path, "wb") as f:
        f.write(b"\x02" * (4 * PAGE))
    with open(path, "r+b") as f:
        fmap = mmap.mmap(f.fileno(), 4 * PAGE, flags=mmap.MAP_PRIVATE)
    fmap[:PAGE] = bytes(PAGE)  # copy-on-write: a zero page in a file mapping
    srv = listen(host, port)
    while True:
        conn, _ = srv.accept()
        with conn:
            a, f_ = hashlib.sha256(anon).hexdigest()[:16], hashlib.sha256(fmap).hexdigest()[:16]
            conn.sendall(f"anon={a} file={f_}\n".encode())
        time.sleep(0)


if __name__ == "__main__":
    main()
