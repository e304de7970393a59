"""Fill a stopped restored tree's memory from the artifact's memory file, with many threads,
each byte hashed in the same pass (api/memory.py; criu/memfile.py made the file).

Each thread takes one chunk of ``pages.bin`` (the manifest's chunks, so their digests are
the signed ones), maps it (``_Mapped``; outside a root-only store it reads it block by block
instead), hashes each block and writes it into the ranges it belongs to with
``process_vm_writev``. Every system call and the hashing release the GIL, so threads run in
parallel. A block is small enough to stay in the core's cache between its hash and its
write. Only the index's ranges are written: the checkpoint left the file's zero blocks out of
them (criu/memfile.py, ``drop_holes``), so they are hashed as zeros but never faulted into
the tree. Finding them here instead measured slower on an H200 node: a scan holds the GIL,
and each ``lseek(SEEK_DATA)`` takes the file's lock, on which the threads queue. A chunk's
bytes reach the tree before its digest is compared, but the tree has not run one
instruction: any mismatch, short read or short write raises, and the caller kills the
tree."""

from __future__ import annotations

import bisect
import ctypes
import itertools
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from api.manifest import FileDigest
from api.memory import MEMORY_PAGES, MemoryRange

from .artifact.hashing import hash_range, new_hash
from .errors import Problem, SnapshotError, VerificationError

log = logging.getLogger(__name__)

_BLOCK = 1024 * 1024
_libc = ctypes.CDLL(None, use_errno=True)


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_IOV = ctypes.POINTER(_Iovec)
_libc.process_vm_writev.argtypes = [ctypes.c_int, _IOV, ctypes.c_ulong, _IOV, ctypes.c_ulong,
                                    ctypes.c_ulong]  # fmt: skip
_libc.process_vm_writev.restype = ctypes.c_ssize_t
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long]  # fmt: skip
_libc.mmap.restype = ctypes.c_void_p
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_PROT_READ, _MAP_SHARED, _MADV_POPULATE_READ = 1, 1, 22
_PAGE = os.sysconf("SC_PAGE_SIZE")
_MAP_FAILED = ctypes.c_void_p(-1).value
_ZEROS = memoryview(bytes(_BLOCK))


def default_workers() -> int:
    return min(os.cpu_count() or 1, 16)


class _Plan:
    """The index by file offset, so a block finds the ranges it overlaps."""

    def __init__(self, ranges: list[MemoryRange], host_pid: dict[int, int]) -> None:
        self.ranges = sorted(ranges, key=lambda r: r.offset)
        self.starts = [r.offset for r in self.ranges]
        missing = sorted({r.pid for r in ranges} - set(host_pid))
        if missing:
            raise SnapshotError(f"the memory index names processes {missing} that the restored "
                                "tree does not have")  # fmt: skip
        self.host_pid = host_pid

    def pieces(self, offset: int, length: int):
        """(host pid, remote address, offset into the block, length) of each range part in
        [offset, offset + length) of the file."""
        end = offset + length
        k = max(0, bisect.bisect_right(self.starts, offset) - 1)
        for r in itertools.islice(self.ranges, k, None):  # not ranges[k:]: a copy per block
            if r.offset >= end:
                break
            lo, hi = max(offset, r.offset), min(end, r.offset + r.length)
            if lo < hi:
                yield self.host_pid[r.pid], r.vaddr + (lo - r.offset), lo - offset, hi - lo


def _write(pid: int, local: int, remote: int, length: int) -> None:
    iov_local = _Iovec(local, length)
    far = _Iovec(remote, length)
    n = _libc.process_vm_writev(pid, ctypes.byref(iov_local), 1, ctypes.byref(far), 1, 0)
    if n != length:
        err = ctypes.get_errno() if n < 0 else 0
        raise SnapshotError(f"filling PID {pid} at {remote:#x}: wrote {n} of {length} bytes"
                            + (f" ({os.strerror(err)})" if err else ""))  # fmt: skip


class _Mapped:
    """The whole file mapped read-only, once, for every thread (libc's mmap: Python's
    read-only mmap objects do not give their address). The hash and ``process_vm_writev``
    read the page cache in place, so the read's copy of every byte is gone: on a GPU node
    that copy took over a quarter of the fill's thread-seconds (6.2 of 21.8 for 15 GB).

    One mapping, unmapped after the last thread: an unmapping per chunk took the address
    space's lock for writing between every thread's page faults, and halved the fill on an
    H200 node. Each block's ranges are populated with one ``MADV_POPULATE_READ`` rather than
    a fault per 64 KiB. Only the ranges are touched, so a hole is never faulted in (on tmpfs
    that would allocate it). A file truncated under the mapping would raise SIGBUS, and one
    changed under it could differ between hash and write: only a store that only root can
    write (binding.root_only) is read this way."""

    def __init__(self, fd: int, length: int) -> None:
        addr = _libc.mmap(None, length, _PROT_READ, _MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            err = ctypes.get_errno()
            raise SnapshotError(f"mapping the memory file: {os.strerror(err)}")
        self.addr, self.length = addr, length
        self._populate = True

    def populate(self, at: int, length: int) -> None:
        """Fault ``[at, at + length)`` in with one call (Linux 5.14; else page by page)."""
        if self._populate:
            lo = (self.addr + at) & ~(_PAGE - 1)
            if _libc.madvise(lo, self.addr + at + length - lo, _MADV_POPULATE_READ) != 0:
                self._populate = False  # an older kernel: page faults will do it

    def view(self, at: int, length: int) -> memoryview:
        return memoryview((ctypes.c_char * length).from_address(self.addr + at)).cast("B")

    def close(self) -> None:
        _libc.munmap(self.addr, self.length)


def _chunk(path: Path, plan: _Plan, algorithm: FileDigest, m: _Mapped | None, index: int,
           offset: int, length: int) -> tuple[str, dict]:  # fmt: skip
    """Hash chunk ``index`` and write it where it belongs (from ``m``, else read from
    ``path``); returns its digest and the seconds this thread spent in each step."""
    h = new_hash(algorithm)
    spent = dict.fromkeys(("read", "hash", "write"), 0.0)
    fd = -1 if m else os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    raw = bytearray(0 if m else min(_BLOCK, length))
    buf = (ctypes.c_char * len(raw)).from_buffer(raw)
    try:
        done = 0
        while done < length:
            n = min(_BLOCK, length - done)
            t0 = time.perf_counter()
            pieces = list(plan.pieces(offset + done, n))
            if m is None:
                n = os.preadv(fd, [memoryview(raw)[:n]], offset + done)
                if n <= 0:
                    raise _truncated(index)
                base = ctypes.addressof(buf)
            else:
                base = m.addr + offset + done
                if pieces:
                    m.populate(offset + done + pieces[0][2],
                               pieces[-1][2] + pieces[-1][3] - pieces[0][2])  # fmt: skip
            t1 = time.perf_counter()
            if m is None:
                h.update(memoryview(raw)[:n])
            else:
                # the gaps between ranges are the file's holes (the index left them out):
                # hashed as the zeros they read as, never faulted in, never written
                at = 0
                for _, _, start, size in pieces:
                    if start < at:  # the index check refuses these before any fill
                        raise SnapshotError(f"the memory index overlaps itself in chunk {index}")
                    h.update(_ZEROS[: start - at])
                    h.update(m.view(offset + done + start, size))
                    at = start + size
                h.update(_ZEROS[: n - at])
            t2 = time.perf_counter()
            for pid, remote, start, size in pieces:
                _write(pid, base + start, remote, size)
            t3 = time.perf_counter()
            spent["read"] += t1 - t0
            spent["hash"] += t2 - t1
            spent["write"] += t3 - t2
            done += n
    finally:
        del buf
        if fd >= 0:
            os.close(fd)
    return h.hexdigest(), spent


def _truncated(index: int) -> VerificationError:
    why = "shorter than its manifest entry" + (f" (chunk {index})" if index >= 0 else "")
    return VerificationError([Problem(MEMORY_PAGES, "truncated", why)])


def _map(path: Path, size: int) -> _Mapped:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if os.fstat(fd).st_size != size:  # mapped past the end would raise SIGBUS
            raise _truncated(-1)
        return _Mapped(fd, size)
    finally:
        os.close(fd)  # the mapping keeps the file


def fill(path: Path, chunk_size: int, digests: list[str], algorithm: FileDigest,
         ranges: list[MemoryRange], host_pid: dict[int, int],
         workers: int | None = None, mapped: bool = True) -> int:  # fmt: skip
    """Write ``path``'s bytes into the stopped tree (``host_pid``: the images' PIDs to the
    host's), checking chunk ``i`` against ``digests[i]``. Returns the bytes written; raises
    VerificationError on a mismatch, SnapshotError on a failed write. ``mapped``: the file is
    read through a mapping (``_Mapped``), else copied block by block with ``preadv``."""
    size = os.stat(path).st_size
    plan = _Plan(ranges, host_pid)
    offsets = range(0, size, chunk_size)
    chunks = [(i, off, min(chunk_size, size - off)) for i, off in enumerate(offsets)]
    if len(chunks) != len(digests):
        raise VerificationError([Problem(MEMORY_PAGES, "truncated", f"{len(chunks)} chunks, the "
                                         f"manifest lists {len(digests)}")])  # fmt: skip
    lengths = sorted(r.length for r in ranges)
    log.info("memory index: %d range(s) of %d process(es), median %d bytes, %.2f GB",
             len(lengths), len(host_pid), lengths[len(lengths) // 2] if lengths else 0,
             sum(lengths) / 1e9)  # fmt: skip
    m = _map(path, size) if mapped and size else None
    try:
        with ThreadPoolExecutor(workers or default_workers()) as pool:
            results = list(pool.map(lambda c: _chunk(path, plan, algorithm, m, *c), chunks))
    finally:
        if m is not None:
            m.close()
    got = [d for d, _ in results]
    # where the threads' time went, summed over them: read, hash or write bound
    log.info("fill thread-seconds: %s", {k: round(sum(s[k] for _, s in results), 2)
                                         for k in ("read", "hash", "write")})  # fmt: skip
    bad = [i for i, (a, b) in enumerate(zip(got, digests, strict=True)) if a != b]
    if bad and mapped:
        # A store without holes (punch unsupported) keeps data in the gaps, which then are
        # not the zeros hashed above: such a chunk is hashed again whole, as it is in the
        # file. Its ranges were written from the same bytes, in a store only root can write.
        whole = [i for i in bad if hash_range(path, chunks[i][1], chunks[i][2], algorithm)
                 == digests[i]]  # fmt: skip
        if whole:
            log.warning("memory file: %d chunk(s) hold data outside the index (a store "
                        "without holes?); hashed again whole", len(whole))  # fmt: skip
        bad = [i for i in bad if i not in whole]
    if bad:
        raise VerificationError([Problem(MEMORY_PAGES, "modified", f"{algorithm} mismatch in "
                                         f"chunk(s) {bad[:5]}")])  # fmt: skip
    return size
