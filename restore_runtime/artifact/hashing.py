"""Digests of artifact files (the manifest's ``fileDigest``: BLAKE3, or SHA-256 in older
artifacts), in parallel.

Large files are hashed per ``CHUNK_SIZE`` slice so one big CRIU page image spreads over all
cores: both hashes release the GIL while they hash, so threads are enough. A slice may also turn
its zero blocks into holes as it hashes them (the memory file): the bytes, and so the digest,
stay the same, the store holds less, and a restore skips what reads as zero anyway.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from blake3 import blake3

from api.manifest import FileDigest

from ..holes import punch, zero_blocks

_READ = 4 * 1024 * 1024

ProgressFn = Callable[[int], None]


def new_hash(algorithm: FileDigest):
    """A hashlib-style hasher. BLAKE3 on one thread: the callers already hash on every core."""
    return blake3(max_threads=1) if algorithm == "blake3" else hashlib.sha256()


@dataclass(frozen=True)
class Slice:
    path: Path
    index: int
    offset: int
    length: int
    #: punch the slice's zero blocks into holes as it is hashed (a file of our own staging)
    holes: bool = False


def hash_range(
    path: Path,
    offset: int,
    length: int,
    algorithm: FileDigest,
    progress: ProgressFn | None = None,
    holes: bool = False,
) -> str:
    """The digest of ``length`` bytes at ``offset``. A file shorter than that hashes what it has,
    so a truncated file yields a different digest rather than an exception. With ``holes``,
    the zero blocks read are punched out of the file (it must be writable)."""
    h = new_hash(algorithm)
    buf = bytearray(min(_READ, max(length, 1)))
    view = memoryview(buf)
    with open(path, "r+b" if holes else "rb", buffering=0) as f:
        f.seek(offset)
        at, remaining = offset, length
        while remaining > 0:
            n = f.readinto(view[: min(len(buf), remaining)])
            if not n:
                break
            h.update(view[:n])
            if holes:
                for a, b in zero_blocks(buf, n):
                    punch(f.fileno(), at + a, b - a)
            at, remaining = at + n, remaining - n
            if progress:
                progress(n)
    return h.hexdigest()


def slices(path: Path, size: int, chunk_size: int, holes: bool = False) -> list[Slice]:
    if size <= chunk_size:
        return []
    return [
        Slice(path, i, off, min(chunk_size, size - off), holes)
        for i, off in enumerate(range(0, size, chunk_size))
    ]


def default_workers() -> int:
    return min(32, (os.cpu_count() or 2) * 2)


def hash_slices(
    work: Iterable[Slice],
    algorithm: FileDigest,
    workers: int | None = None,
    progress: ProgressFn | None = None,
) -> dict[tuple[Path, int], str]:
    work = list(work)
    with ThreadPoolExecutor(max_workers=workers or default_workers()) as pool:
        digests = pool.map(
            lambda s: hash_range(s.path, s.offset, s.length, algorithm, progress, s.holes), work
        )
        return {(s.path, s.index): d for s, d in zip(work, digests, strict=True)}


def file_sha256(path: Path) -> str:
    """A whole file's sha256 (a manifest's digest, as the webhook pins it), on one core."""
    return hash_range(path, 0, path.stat().st_size, "sha256")
