"""Fill a stopped restored tree's memory from the artifact's memory file, with many threads,
each byte hashed in the same pass (api/memory.py; criu/memfile.py made the file).

Each thread takes one chunk of ``pages.bin`` (the manifest's chunks, so their digests are
the signed ones), reads it block by block, hashes each block and writes it into the ranges
it belongs to with ``process_vm_writev``. Every system call and the hashing release the
GIL, so threads run in parallel. A block is small enough to stay in the core's cache between
its hash and its write. Only the index's ranges are written: the checkpoint left the file's
zero blocks out of them (criu/memfile.py, ``drop_holes``), so they are hashed (as holes, they
cost little to read) but never faulted into the tree. Finding them here instead measured
slower on an H200 node: a scan holds the GIL, and each ``lseek(SEEK_DATA)`` takes the file's
lock, on which the threads queue. A chunk's bytes reach the tree before its digest is
compared, but the tree has not run one instruction: any mismatch, short read or short write
raises, and the caller kills the tree.

With a ledger (fill_ledger.py), a chunk that a restore on this node already verified, of this
very file version, is read and written but not hashed again; concurrent restores of one
artifact hash each chunk once between them."""

from __future__ import annotations

import bisect
import ctypes
import itertools
import logging
import os
import random
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from api.manifest import FileDigest
from api.memory import MEMORY_PAGES, MemoryRange

from .artifact.hashing import new_hash
from .errors import Problem, SnapshotError, VerificationError
from .fill_ledger import Ledger

log = logging.getLogger(__name__)

_BLOCK = 1024 * 1024
#: how long a thread waits for a chunk another restore is hashing (about ten times one
#: 64 MiB chunk's hash on a loaded GPU node) before hashing it itself
WAIT_S = 1.0
_libc = ctypes.CDLL(None, use_errno=True)


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_IOV = ctypes.POINTER(_Iovec)
_libc.process_vm_writev.argtypes = [
    ctypes.c_int,
    _IOV,
    ctypes.c_ulong,
    _IOV,
    ctypes.c_ulong,
    ctypes.c_ulong,
]
_libc.process_vm_writev.restype = ctypes.c_ssize_t


def default_workers() -> int:
    return min(os.cpu_count() or 1, 16)


class _Plan:
    """The index by file offset, so a block finds the ranges it overlaps."""

    def __init__(self, ranges: list[MemoryRange], host_pid: dict[int, int]) -> None:
        self.ranges = sorted(ranges, key=lambda r: r.offset)
        self.starts = [r.offset for r in self.ranges]
        missing = sorted({r.pid for r in ranges} - set(host_pid))
        if missing:
            raise SnapshotError(
                f"the memory index names processes {missing} that the restored tree does not have"
            )
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


def _write(pid: int, buf: ctypes.Array, at: int, remote: int, length: int) -> None:
    local = _Iovec(ctypes.addressof(buf) + at, length)
    far = _Iovec(remote, length)
    n = _libc.process_vm_writev(pid, ctypes.byref(local), 1, ctypes.byref(far), 1, 0)
    if n != length:
        err = ctypes.get_errno() if n < 0 else 0
        raise SnapshotError(
            f"filling PID {pid} at {remote:#x}: wrote {n} of {length} bytes"
            + (f" ({os.strerror(err)})" if err else "")
        )


def _chunk(
    fd: int,
    plan: _Plan,
    algorithm: FileDigest,
    index: int,
    offset: int,
    length: int,
    verify: bool = True,
) -> tuple[str | None, dict]:
    """Write chunk ``index`` where it belongs, hashing it unless ``verify`` is off; returns its
    digest (None unhashed) and the seconds this thread spent in each step."""
    h = new_hash(algorithm) if verify else None
    raw = bytearray(min(_BLOCK, length))
    buf = (ctypes.c_char * len(raw)).from_buffer(raw)
    view = memoryview(raw)
    spent = dict.fromkeys(("read", "hash", "write"), 0.0)
    try:
        done = 0
        while done < length:
            t0 = time.perf_counter()
            n = os.preadv(fd, [view[: min(len(raw), length - done)]], offset + done)
            if n <= 0:
                raise VerificationError(
                    [
                        Problem(
                            MEMORY_PAGES,
                            "truncated",
                            f"shorter than its manifest entry (chunk {index})",
                        )
                    ]
                )
            t1 = time.perf_counter()
            if h is not None:
                h.update(view[:n])
            t2 = time.perf_counter()
            for pid, remote, at, size in plan.pieces(offset + done, n):
                _write(pid, buf, at, remote, size)
            t3 = time.perf_counter()
            spent["read"] += t1 - t0
            spent["hash"] += t2 - t1
            spent["write"] += t3 - t2
            done += n
    finally:
        del buf
    return (h.hexdigest() if h is not None else None), spent


@dataclass(frozen=True)
class FillResult:
    bytes: int
    #: chunks this fill hashed, and chunks it took as verified from the node's ledger
    hashed: int
    trusted: int
    #: threads that took part (fewer than asked when other fills ran on the node)
    threads: int


_Chunk = tuple[int, int, int]  # index, offset, length


class _Share:
    """This fill's share of its threads while others fill on the node: ``workers`` divided
    by the fills under way, counted again at most every ``RECOUNT_S``."""

    RECOUNT_S = 0.01

    def __init__(self, ledger: Ledger | None, workers: int) -> None:
        self.ledger, self.workers = ledger, workers
        self.at, self.threads = 0.0, workers
        self.used: set[int] = set()

    def allows(self, thread: int) -> bool:
        if self.ledger is None or thread == 0:
            return True
        now = time.monotonic()
        if now - self.at > self.RECOUNT_S:
            self.at, self.threads = now, max(1, self.workers // self.ledger.fills())
        return thread < self.threads


def _drain(
    thread: int,
    share: _Share,
    todo: deque,
    fd: int,
    plan: _Plan,
    algorithm: FileDigest,
    digests: list[str],
    ledger: Ledger | None,
    out: dict,
) -> None:
    """One thread: fill chunks off ``todo`` until none is left, or until its share of the
    node's cores no longer includes it (it ends; the others finish the queue). A chunk
    another restore is hashing goes to the back once; met again, it is waited for up to
    ``WAIT_S`` (the other restore's hash is most of the work it saves), then hashed here."""
    while share.allows(thread):
        try:
            (i, offset, length), deferred = todo.popleft()
        except IndexError:
            return
        share.used.add(thread)
        claim = ledger.claim(i, WAIT_S if deferred else 0.0) if ledger is not None else None
        if ledger is not None and claim is None and not deferred:
            todo.append(((i, offset, length), True))
            continue
        try:
            trusted = claim is not None and claim.verified
            digest, spent = _chunk(fd, plan, algorithm, i, offset, length, verify=not trusted)
            if claim is not None and not trusted and digest == digests[i]:
                claim.mark()
        finally:
            if claim is not None:
                claim.release()
        out[i] = digest, spent


def fill(
    memory_fd: int,
    chunk_size: int,
    digests: list[str],
    algorithm: FileDigest,
    ranges: list[MemoryRange],
    host_pid: dict[int, int],
    workers: int | None = None,
    ledger: Ledger | None = None,
) -> FillResult:
    """Write the memory file's bytes into the stopped tree (``host_pid``: the images' PIDs to
    the host's), checking chunk ``i`` against ``digests[i]`` unless ``ledger`` says this node
    already did. Raises VerificationError on a mismatch, SnapshotError on a failed write.
    ``memory_fd``: the descriptor the restore opened the memory file on, the one the ledger
    was opened on; never a path, which could name other bytes by the time it is read."""
    if not isinstance(memory_fd, int):
        raise TypeError("the fill takes the descriptor the restore opened, not a path")
    return _fill(memory_fd, chunk_size, digests, algorithm, ranges, host_pid, workers, ledger)


def _fill(
    fd: int,
    chunk_size: int,
    digests: list[str],
    algorithm: FileDigest,
    ranges: list[MemoryRange],
    host_pid: dict[int, int],
    workers: int | None,
    ledger: Ledger | None,
) -> FillResult:
    size = os.fstat(fd).st_size
    plan = _Plan(ranges, host_pid)
    offsets = range(0, size, chunk_size)
    chunks = [(i, off, min(chunk_size, size - off)) for i, off in enumerate(offsets)]
    if len(chunks) != len(digests):
        raise VerificationError(
            [
                Problem(
                    MEMORY_PAGES,
                    "truncated",
                    f"{len(chunks)} chunks, the manifest lists {len(digests)}",
                )
            ]
        )
    lengths = sorted(r.length for r in ranges)
    log.info(
        "memory index: %d range(s) of %d process(es), median %d bytes, %.2f GB",
        len(lengths),
        len(host_pid),
        lengths[len(lengths) // 2] if lengths else 0,
        sum(lengths) / 1e9,
    )
    if ledger is not None:  # restores that start together begin apart (fill_ledger.py)
        start = random.randrange(len(chunks)) if chunks else 0
        chunks = chunks[start:] + chunks[:start]
    todo: deque[tuple[_Chunk, bool]] = deque((c, False) for c in chunks)
    out: dict[int, tuple[str | None, dict]] = {}
    n = workers or default_workers()
    share = _Share(ledger, n)
    if ledger is not None:
        ledger.enter()
    try:
        with ThreadPoolExecutor(n) as pool:
            for f in [
                pool.submit(_drain, t, share, todo, fd, plan, algorithm, digests, ledger, out)
                for t in range(n)
            ]:
                f.result()
    finally:
        if ledger is not None:
            ledger.leave()
    results = [out[i] for i in range(len(digests))]
    # where the threads' time went, summed over them: read, hash or write bound
    log.info(
        "fill thread-seconds: %s",
        {k: round(sum(s[k] for _, s in results), 2) for k in ("read", "hash", "write")},
    )
    bad = [
        i
        for i, ((a, _), b) in enumerate(zip(results, digests, strict=True))
        if a is not None and a != b
    ]
    if bad:
        raise VerificationError(
            [Problem(MEMORY_PAGES, "modified", f"{algorithm} mismatch in chunk(s) {bad[:5]}")]
        )
    trusted = sum(a is None for a, _ in results)
    if trusted and ledger is not None and not ledger.unchanged():
        raise VerificationError(
            [Problem(MEMORY_PAGES, "modified", "the memory file changed while it was filled in")]
        )
    if trusted:
        log.info("fill: %d of %d chunk(s) verified before on this node", trusted, len(chunks))
    return FillResult(size, len(chunks) - trusted, trusted, len(share.used))
