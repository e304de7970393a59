"""Zero pages left out of a dump: CRIU copies every page a process had touched, zeros
included, and at restore copies each back one 4 KiB page fault at a time (the slowest part of
a GPU restore: a 1.3 B worker's 4.3 GB image held 1.0 GB of zero pages, most of it in the host
buffers the CUDA checkpoint wrote). A page of a private anonymous mapping that CRIU does not
restore reads as zero anyway, so those pages are dropped from ``pages-*.img`` and its
pagemap after the dump: the restored memory is bitwise the same, with less to copy and store.

Only private anonymous mappings qualify. A private file mapping's absent page would read as
the file's contents, not zero, and shared memory is dumped apart; both keep every page.

Runs on our own fresh dump, before it is hashed and signed; images are read and rewritten
with pycriu, never by hand. A process whose pagemap has anything but plain present pages
(pages of a parent pre-dump, pages not in the file) is left as it is."""

from __future__ import annotations

import bisect
import itertools
import logging
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

from ..holes import punch
from .images import _pycriu_images

log = logging.getLogger(__name__)

PAGE = 4096
_ZERO = bytes(PAGE)
_BLOCK = 16  # pages compared at once before looking at single pages
_ZERO_BLOCK = bytes(PAGE * _BLOCK)
#: pagemap entry flags (CRIU's criu/include/pagemap.h); PE_LAZY only says a lazy restore
#: may fetch the page later, it is in the page file all the same
PE_PARENT = 1 << 0
PE_PRESENT = 1 << 2
#: VMA status bits (CRIU's criu/include/image.h)
VMA_AREA_REGULAR = 1 << 0
VMA_ANON_PRIVATE = 1 << 9
VMA_AREA_AIORING = 1 << 13


@dataclass
class Result:
    pages: int = 0
    dropped: int = 0

    @property
    def dropped_bytes(self) -> int:
        return self.dropped * PAGE


PROT_WRITE = 0x2
#: the unit in which pages move inside the page file (and its most extra room)
PIECE = 1 << 20


def anon_private_ranges(vmas: list[dict], writable: bool = False) -> list[tuple[int, int]]:
    """[start, end) of the mappings whose absent pages read as zero (and, with
    ``writable``, that process_vm_writev can fill: it never writes a read-only page)."""
    out = []
    for v in vmas:
        st = v["status"]
        anon = st & VMA_AREA_REGULAR and st & VMA_ANON_PRIVATE and not st & VMA_AREA_AIORING
        if anon and (not writable or v.get("prot", 0) & PROT_WRITE):
            out.append((v["start"], v["end"]))
    return sorted(out)


def mark_zero(m: mmap.mmap, first: int, count: int, drop: bytearray, base: int) -> None:
    """Set ``drop[base + k]`` for each zero page among ``count`` pages from page ``first``."""
    for b in range(0, count, _BLOCK):
        n = min(_BLOCK, count - b)
        at = (first + b) * PAGE
        if n == _BLOCK and m[at : at + n * PAGE] == _ZERO_BLOCK:
            drop[base + b : base + b + n] = b"\x01" * n
            continue
        for k in range(n):
            if m[at + k * PAGE : at + (k + 1) * PAGE] == _ZERO:
                drop[base + b + k] = 1


def spans(ranges: list[tuple[int, int]], vaddr: int, n: int) -> list[tuple[int, int]]:
    """The page-index spans [i, j) of an entry (``n`` pages at ``vaddr``) that lie in
    ``ranges`` (sorted, not overlapping: mappings)."""
    end = vaddr + n * PAGE
    out = []
    # the first mapping that could reach the entry: a GPU worker has thousands of both
    k = max(0, bisect.bisect_right(ranges, (vaddr, vaddr)) - 1)
    for s, e in itertools.islice(ranges, k, None):  # not ranges[k:]: a copy per entry
        if s >= end:
            break
        lo, hi = max(s, vaddr), min(e, end)
        if lo < hi:
            out.append(((lo - vaddr) // PAGE, (hi - vaddr) // PAGE))
    return out


def kept_runs(drop: bytearray) -> list[tuple[int, int]]:
    """[i, j) runs of zeros (pages kept) in ``drop``, found at C speed."""
    runs, i, n = [], 0, len(drop)
    while i < n:
        i = drop.find(0, i)
        if i < 0:
            break
        j = drop.find(1, i)
        j = n if j < 0 else j
        runs.append((i, j))
        i = j
    return runs


def load(images, path: Path) -> list[dict]:
    with open(path, "rb") as f:
        return images.load(f, pretty=False)["entries"]


def vmas(images, images_dir: Path, pid: str) -> list[dict]:
    return load(images, images_dir / f"mm-{pid}.img")[0].get("vmas", [])


def plain_pagemap(images, pagemap: Path) -> tuple[dict, list[dict]] | None:
    """The pagemap's head and entries, or None when it has pages outside its page file
    (of a parent pre-dump): those are left as they are."""
    head, *entries = load(images, pagemap)
    if any(
        e.get("flags", 0) & (PE_PARENT | PE_PRESENT) != PE_PRESENT or e.get("in_parent")
        for e in entries
    ):
        log.info("%s has pages outside its page file: left as it is", pagemap.name)
        return None
    return head, entries


def pids(images_dir: Path) -> list[str]:
    return [mm.name[len("mm-") : -len(".img")] for mm in sorted(images_dir.glob("mm-*.img"))]


def _sparse_one(images, images_dir: Path, pid: str, total: Result) -> None:
    ranges = anon_private_ranges(vmas(images, images_dir, pid))
    pagemap = images_dir / f"pagemap-{pid}.img"
    if (plain := plain_pagemap(images, pagemap)) is None:
        return
    head, entries = plain
    pages = images_dir / f"pages-{head['pages_id']}.img"
    if not ranges or not pages.stat().st_size:
        return
    runs: list[tuple[int, int, int, int]] = []  # (vaddr, pages, index in the old file, flags)
    at = dropped = 0
    with open(pages, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        for e in entries:
            n, vaddr = e.get("nr_pages") or e["compat_nr_pages"], e["vaddr"]
            drop = bytearray(n)
            for i, j in spans(ranges, vaddr, n):
                mark_zero(m, at + i, j - i, drop, i)
            dropped += drop.count(1)
            flags = e["flags"]
            runs += [(vaddr + i * PAGE, j - i, at + i, flags) for i, j in kept_runs(drop)]
            at += n
        total.pages += at
        total.dropped += dropped
        if dropped:
            write_pagemap(images, pagemap, head, runs, entries[0])
            kept = compact(f.fileno(), runs)
    if dropped:
        os.truncate(pages, kept)


def compact(fd: int, runs: list[tuple[int, int, int, int]]) -> int:
    """Move the kept runs to the front of the page file, in place: a kept run never moves
    forward, so each piece reads bytes no earlier write has overwritten. With read and write
    calls, not a mapping: the memory file's split leaves holes, and filling a hole through a
    mapping on a full store raises SIGBUS, not ENOSPC. Each piece's old place is freed once
    moved, so the file never grows. Returns the new length; a failure leaves the file broken
    in a staging directory, which the checkpoint then removes."""
    out = 0
    for _, n, old, _ in runs:
        src, length = old * PAGE, n * PAGE
        while length and src != out:
            piece = os.pread(fd, min(length, PIECE), src)
            if os.pwrite(fd, piece, out) != len(piece):
                raise OSError("short write while compacting the page file")
            # the part of the old place that no later write reuses
            punch(fd, max(src, out + len(piece)), src + len(piece) - max(src, out + len(piece)))
            src, out, length = src + len(piece), out + len(piece), length - len(piece)
        out += length
    return out


def write_pagemap(
    images, pagemap: Path, head: dict, runs: list[tuple[int, int, int, int]], like: dict
) -> None:
    """The kept runs as the new pagemap, written beside the old one and renamed over it."""
    entries = []
    for vaddr, n, _, flags in runs:
        # as CRIU writes them: the count in nr_pages, compat_nr_pages 0 (older images had
        # the count in compat_nr_pages alone)
        if "nr_pages" in like:
            e = {"vaddr": vaddr, "compat_nr_pages": 0, "flags": flags, "nr_pages": n}
        else:
            e = {"vaddr": vaddr, "compat_nr_pages": n, "flags": flags}
        entries.append(e)
    tmp_map = pagemap.with_suffix(".sparse")
    with open(tmp_map, "wb") as f:
        images.dump({"magic": "PAGEMAP", "entries": [head, *entries]}, f)
    os.replace(tmp_map, pagemap)


def elide_zero_pages(images_dir: Path) -> Result:
    """Drop the zero pages of private anonymous mappings from every process's images."""
    images = _pycriu_images()
    total = Result()
    for pid in pids(images_dir):
        _sparse_one(images, images_dir, pid, total)
    return total
