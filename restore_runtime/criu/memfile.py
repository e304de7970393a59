"""The pages of large private anonymous mappings, moved out of CRIU's images into the
artifact's memory file (contracts/memory.py), and the index checked against the images
before a restore trusts it.

CRIU restores pages with one thread, at 1.6-2.0 GB/s on an H200 node; filling the same
memory from outside with 16 threads ran ten times faster. So at checkpoint, after the
zero-page pass, every run of at least ``MIN_RUN_PAGES`` pages of a writable private
anonymous mapping goes to ``memory/pages.bin``, and CRIU's pagemap and page file keep the
rest; CRIU then restores those mappings empty and restore_runtime/memfill.py fills them.

Same rules as criu/sparse.py: only private anonymous mappings (a file mapping's absent page
would read as the file, not as what is written later), only plain pagemaps (no parent
pre-dump), images read and rewritten with pycriu. Writable ones only: process_vm_writev never
writes a read-only page."""

from __future__ import annotations

import itertools
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..contracts.memory import MEMORY_INDEX, MEMORY_PAGES, MemoryIndex, MemoryRange
from . import sparse
from .images import _pycriu_images

PAGE = sparse.PAGE
#: 1 MiB: a smaller run stays with CRIU (a write of its own would cost more than it saves)
MIN_RUN_PAGES = 256
_PIECE = sparse.PIECE


@dataclass
class Split:
    ranges: int = 0
    bytes: int = 0


def split(images_dir: Path, artifact: Path, min_run_pages: int = MIN_RUN_PAGES) -> Split:
    """Move the large runs of every process's writable private anonymous memory into
    ``artifact/memory/``. Nothing is written when there is none."""
    images = _pycriu_images()
    index: list[MemoryRange] = []
    out = artifact / MEMORY_PAGES
    out.parent.mkdir()
    with open(out, "wb") as dst:
        for pid in sparse.pids(images_dir):
            _split_one(images, images_dir, pid, dst, index, min_run_pages)
    if not index:
        shutil.rmtree(out.parent)
        return Split()
    (artifact / MEMORY_INDEX).write_bytes(MemoryIndex(ranges=index).to_json())
    return Split(len(index), sum(r.length for r in index))


def _split_one(images, images_dir: Path, pid: str, dst: BinaryIO, index: list[MemoryRange],
               min_run: int) -> None:  # fmt: skip
    ranges = sparse.anon_private_ranges(sparse.vmas(images, images_dir, pid), writable=True)
    if not ranges or (plain := sparse.plain_pagemap(images, images_dir, pid)) is None:
        return
    head, entries = plain
    pages = images_dir / f"pages-{head['pages_id']}.img"
    if not pages.stat().st_size:
        return
    kept: list[tuple[int, int, int, int]] = []  # (vaddr, pages, index in the old file, flags)
    moved_any = False
    at = 0
    with open(pages, "r+b") as f:
        for e in entries:
            n, vaddr = e.get("nr_pages") or e["compat_nr_pages"], e["vaddr"]
            moved = bytearray(n)
            for i, j in sparse.spans(ranges, vaddr, n):
                if j - i < min_run:
                    continue
                moved[i:j] = b"\x01" * (j - i)
                offset = dst.tell()
                _copy(f.fileno(), dst.fileno(), (at + i) * PAGE, (j - i) * PAGE)
                dst.seek(offset + (j - i) * PAGE)
                index.append(MemoryRange(pid=int(pid), vaddr=vaddr + i * PAGE,
                                         length=(j - i) * PAGE, offset=offset))  # fmt: skip
                moved_any = True
            kept += [(vaddr + i * PAGE, j - i, at + i, e["flags"])
                     for i, j in sparse.kept_runs(moved)]  # fmt: skip
            at += n
        if not moved_any:
            return
        pagemap = images_dir / f"pagemap-{pid}.img"
        sparse.write_pagemap(images, pagemap, head, kept, entries[0])
        length = sparse.compact(f.fileno(), kept)
    os.truncate(pages, length)


def _copy(src: int, dst: int, offset: int, length: int) -> None:
    """Append ``length`` bytes at ``offset`` of ``src`` to ``dst``, freeing each piece of
    the source once copied: the store never holds the moved pages twice (a nearly full
    store takes the checkpoint, as the zero-page step's in-place compaction made sure)."""
    out = os.lseek(dst, 0, os.SEEK_CUR)
    while length:  # the kernel copies; no page passes through Python
        done = os.copy_file_range(src, dst, min(length, _PIECE), offset, out)
        if not done:
            raise OSError(f"short copy into {MEMORY_PAGES}")
        sparse.punch(src, offset, done)
        offset, out, length = offset + done, out + done, length - done


# -- restore: the index is tenant-reachable input until checked --------------------------
def check_index(index: MemoryIndex, images_dir: Path, file_size: int) -> list[str]:
    """Why ``index`` cannot be filled into what CRIU restores from ``images_dir``: every
    range page-aligned, inside ``pages.bin``, inside one writable private anonymous mapping
    of a process of the images, no two overlapping in one process."""
    images = _pycriu_images()
    problems: list[str] = []
    mappings: dict[int, list[tuple[int, int]]] = {}
    for pid in sparse.pids(images_dir):
        mappings[int(pid)] = sparse.anon_private_ranges(sparse.vmas(images, images_dir, pid),
                                                        writable=True)  # fmt: skip
    by_pid: dict[int, list[tuple[int, int]]] = {}
    for k, r in enumerate(index.ranges):
        where = f"range {k} (pid {r.pid}, {r.vaddr:#x}+{r.length:#x})"
        if r.vaddr % PAGE or r.length % PAGE or r.offset % PAGE:
            problems.append(f"{where}: not page-aligned")
        elif r.offset + r.length > file_size:
            problems.append(f"{where}: past the end of {MEMORY_PAGES} ({file_size} bytes)")
        elif r.pid not in mappings:
            problems.append(f"{where}: no such process in the images")
        elif not any(s <= r.vaddr and r.vaddr + r.length <= e for s, e in mappings[r.pid]):
            problems.append(f"{where}: not inside one writable private anonymous mapping")
        else:
            by_pid.setdefault(r.pid, []).append((r.vaddr, r.vaddr + r.length))
    for pid, spans in by_pid.items():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            if start < end:
                problems.append(f"pid {pid}: ranges overlap at {start:#x}")
                break
    return problems
