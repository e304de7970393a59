"""The pages of large anonymous mappings, private and shared, moved out of CRIU's images
into the artifact's memory file (api/memory.py), and the index checked against the images
before a restore trusts it.

CRIU restores pages with one thread, at 1.6-2.0 GB/s on an H200 node; filling the same
memory from outside with 16 threads ran ten times faster. So at checkpoint, right after the
dump, every run of at least ``MIN_RUN_PAGES`` pages of a writable private anonymous mapping
goes to ``memory/pages.bin``, and CRIU's pagemap and page file keep the rest (which the
zero-page pass then thins); CRIU restores those mappings empty and
restore_runtime/memfill.py fills them. The memory file's own zero blocks become holes as it
is hashed (artifact/hashing.py).

Shared anonymous memory and memfds (pinned host buffers, engines' IPC) move too: CRIU would
restore them on its one thread (criu/shmem.py). Their pages go to the index at the address
of one process that maps them writable; the fill writes them there, into the object every
process of it shares.

Same rules as criu/sparse.py: only anonymous memory (a file mapping's absent page would read
as the file, not as what is written later), only plain pagemaps (no parent pre-dump), images
read and rewritten with pycriu. Writable mappings only: process_vm_writev never writes a
read-only page."""

from __future__ import annotations

import bisect
import errno
import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path

from api.manifest import CRIU_DIR
from api.memory import MEMORY_INDEX, MEMORY_PAGES, MemoryIndex, MemoryRange

from ..errors import Problem, VerificationError
from ..holes import punch
from . import shmem, sparse
from .images import _pycriu_images

PAGE = sparse.PAGE
#: 1 MiB: a smaller run stays with CRIU (a write of its own would cost more than it saves)
MIN_RUN_PAGES = 256
_PIECE = sparse.PIECE


#: madvise advice numbers (CRIU's VMA image keeps a bit per advice the mapping had)
MADV_HUGEPAGE, MADV_NOHUGEPAGE = 14, 15


@dataclass
class Split:
    ranges: int = 0
    bytes: int = 0
    #: the page file that became the memory file, its size then, and the ranges of it
    #: written or punched since (what a digest taken during the dump no longer covers)
    source: str = ""
    source_size: int = 0
    changed: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class _Plan:
    """What moves out of one page file (a process's, or a shared object's), and what stays."""

    pid: str  # the process the moved pages are written into
    pagemap: Path
    pages: Path
    head: dict
    first: dict  # a pagemap entry, the shape write_pagemap copies
    moved: list[tuple[int, int, int]]  # (vaddr in pid, pages, index in the page file)
    kept: list[tuple[int, int, int, int]]  # (pagemap's vaddr, pages, index, flags)
    shared: bool = False

    @property
    def moved_bytes(self) -> int:
        return sum(n for _, n, _ in self.moved) * PAGE


def split(images_dir: Path, artifact: Path, min_run_pages: int = MIN_RUN_PAGES) -> Split:
    """Move the large runs of every process's writable private anonymous memory, and of
    every shared object a process maps writable, into ``artifact/memory/``. Nothing is
    written when there is none.

    Without a copy of the bulk: the page file of the process with the most to move becomes
    the memory file by a rename (the index points into it where CRIU wrote each page), and
    only its kept pages are copied out into a new page file of that name. The other
    processes' runs are appended. Every piece copied is freed at once, so a nearly full
    store takes the checkpoint. The mappings that moved are marked for transparent huge
    pages (as ``madvise(MADV_HUGEPAGE)`` would, unless the workload had said no): the fill
    then faults 2 MiB at a time, and the CUDA restore reads its host buffers from them."""
    images = _pycriu_images()
    plans = [
        p for pid in sparse.pids(images_dir) if (p := _plan(images, images_dir, pid, min_run_pages))
    ]
    plans += _shared_plans(images, images_dir, min_run_pages)
    if not plans:
        return Split()
    plans.sort(key=lambda p: p.moved_bytes, reverse=True)
    big, rest = plans[0], plans[1:]
    out = artifact / MEMORY_PAGES
    out.parent.mkdir()
    os.rename(big.pages, out)  # the staging directory: one file system
    index = [
        MemoryRange(pid=int(big.pid), vaddr=v, length=n * PAGE, offset=old * PAGE)
        for v, n, old in big.moved
    ]
    with open(out, "r+b") as dst:
        with open(big.pages, "xb") as f:
            at = 0
            for _, n, old, _ in big.kept:
                _copy(dst.fileno(), f.fileno(), old * PAGE, n * PAGE, at)
                at += n * PAGE
        end = size = os.fstat(dst.fileno()).st_size
        for p in rest:
            with open(p.pages, "r+b") as f:
                for v, n, old in p.moved:
                    _copy(f.fileno(), dst.fileno(), old * PAGE, n * PAGE, end)
                    index.append(MemoryRange(pid=int(p.pid), vaddr=v, length=n * PAGE, offset=end))
                    end += n * PAGE
                length = sparse.compact(f.fileno(), p.kept)
            os.truncate(p.pages, length)
    for p in plans:
        sparse.write_pagemap(images, p.pagemap, p.head, p.kept, p.first)
        if not p.shared:  # a shared object's huge pages are the tmpfs mount's to decide
            _mark_huge(images, images_dir / f"mm-{p.pid}.img", p.moved)
    (artifact / MEMORY_INDEX).write_bytes(MemoryIndex(ranges=index).to_json())
    punched = [(old * PAGE, n * PAGE) for _, n, old, _ in big.kept]
    return Split(len(index), sum(r.length for r in index), big.pages.name, size, punched)


def drop_holes(artifact: Path) -> int:
    """Leave the memory file's holes (its zero blocks, punched as it was hashed) out of the
    index, so a restore never writes them: the mappings CRIU restored empty read as zero
    there already. The chunk digests still cover every byte. Returns the bytes left out.
    Once per checkpoint, on one thread (``lseek`` takes the file's lock)."""
    path = artifact / MEMORY_INDEX
    if not path.exists():
        return 0
    index = MemoryIndex.from_json(path.read_bytes())
    fd = os.open(artifact / MEMORY_PAGES, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = _data_extents(fd)
    finally:
        os.close(fd)
    # the pages of each range that lie in data (both page-aligned: sparse.spans applies)
    kept = [
        MemoryRange(
            pid=r.pid, vaddr=r.vaddr + i * PAGE, length=(j - i) * PAGE, offset=r.offset + i * PAGE
        )
        for r in index.ranges
        for i, j in sparse.spans(data, r.offset, r.length // PAGE)
    ]
    path.write_bytes(MemoryIndex(ranges=kept).to_json())
    return sum(r.length for r in index.ranges) - sum(r.length for r in kept)


def _data_extents(fd: int) -> list[tuple[int, int]]:
    """[start, end) of the file's data, widened to whole pages."""
    out: list[tuple[int, int]] = []
    pos, size = 0, os.fstat(fd).st_size
    while pos < size:
        try:
            data = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  # holes only, up to the end
                break
            raise
        hole = os.lseek(fd, data, os.SEEK_HOLE)
        out.append((data // PAGE * PAGE, -(-hole // PAGE) * PAGE))
        pos = hole
    return out


def _plan(images, images_dir: Path, pid: str, min_run: int) -> _Plan | None:
    ranges = sparse.anon_private_ranges(sparse.vmas(images, images_dir, pid), writable=True)
    pagemap = images_dir / f"pagemap-{pid}.img"
    return _plan_pagemap(images, pagemap, pid, ranges, 0, min_run)


def _shared_plans(images, images_dir: Path, min_run: int) -> list[_Plan]:
    """A plan per shared object some process maps writable: the pages of the part that
    process maps (at its offsets in the object), written there."""
    plans = []
    for shmid, w in shmem.windows(images, images_dir).items():
        pagemap = images_dir / f"pagemap-shmem-{shmid}.img"
        if pagemap.exists():
            p = _plan_pagemap(images, pagemap, w.pid, [w.offsets], w.start - w.pgoff, min_run)
            if p is not None:
                p.shared = True
                plans.append(p)
    return plans


def _plan_pagemap(images, pagemap: Path, pid: str, ranges: list[tuple[int, int]], shift: int,
                  min_run: int) -> _Plan | None:  # fmt: skip
    """What of ``pagemap``'s pages in ``ranges`` (its own addresses: a process's, or offsets
    in a shared object) moves; a moved page at ``a`` belongs at ``a + shift`` of ``pid``."""
    if not ranges or (plain := sparse.plain_pagemap(images, pagemap)) is None:
        return None
    head, entries = plain
    pages = pagemap.parent / f"pages-{head['pages_id']}.img"
    if not pages.stat().st_size:
        return None
    moved: list[tuple[int, int, int]] = []
    kept: list[tuple[int, int, int, int]] = []
    starts = {s + shift for s, _ in ranges}
    at = 0
    for e in entries:
        n, vaddr = e.get("nr_pages") or e["compat_nr_pages"], e["vaddr"]
        mask = bytearray(n)
        for i, j in sparse.spans(ranges, vaddr, n):
            if j - i >= min_run:
                mask[i:j] = b"\x01" * (j - i)
                _append_run(moved, (vaddr + i * PAGE + shift, j - i, at + i), starts)
        kept += [(vaddr + i * PAGE, j - i, at + i, e["flags"]) for i, j in sparse.kept_runs(mask)]
        at += n
    if not moved:
        return None
    return _Plan(pid, pagemap, pages, head, entries[0], moved, kept)


def _append_run(
    moved: list[tuple[int, int, int]], run: tuple[int, int, int], starts: set[int]
) -> None:
    """Append (vaddr, pages, index in the page file), merged into the run before it when it
    continues that run in memory and in the file, within one mapping (``starts``: where
    mappings begin). CRIU's pagemap entries stop at its pipe's size (1 MiB): unmerged, a
    6.65 B worker's index held 13,202 ranges, and the fill paid for each."""
    if moved:
        v, n, at = moved[-1]
        if v + n * PAGE == run[0] and at + n == run[2] and run[0] not in starts:
            moved[-1] = (v, n + run[1], at)
            return
    moved.append(run)


def _mark_huge(images, mm: Path, moved: list[tuple[int, int, int]]) -> None:
    """Set MADV_HUGEPAGE on each mapping that holds a moved run; CRIU's restorer applies
    the image's advice to the mapping it recreates."""
    with open(mm, "rb") as f:
        img = images.load(f, pretty=False)
    starts = sorted(v for v, _, _ in moved)
    for vma in img["entries"][0].get("vmas", []):
        k = bisect.bisect_left(starts, vma["start"])
        madv = vma.get("madv", 0)
        if k < len(starts) and starts[k] < vma["end"] and not madv & (1 << MADV_NOHUGEPAGE):
            vma["madv"] = madv | 1 << MADV_HUGEPAGE
    tmp = mm.with_suffix(".huge")
    with open(tmp, "wb") as f:
        images.dump(img, f)
    os.replace(tmp, mm)


def _copy(src: int, dst: int, offset: int, length: int, out: int) -> None:
    """Copy ``length`` bytes at ``offset`` of ``src`` to ``out`` of ``dst``, freeing each
    piece of the source once copied: the store never holds those pages twice."""
    while length:  # the kernel copies; no page passes through Python
        done = os.copy_file_range(src, dst, min(length, _PIECE), offset, out)
        if not done:
            raise OSError(f"short copy into {MEMORY_PAGES}")
        punch(src, offset, done)
        offset, out, length = offset + done, out + done, length - done


# -- restore: the index is tenant-reachable input until checked --------------------------
def load_index(artifact: Path, size: int) -> MemoryIndex:
    """The memory file's index (hashed with the core files), refused unless every range lies
    in a writable anonymous mapping (private or shared) the images restore."""
    try:
        index = MemoryIndex.from_json((artifact / MEMORY_INDEX).read_bytes())
    except (OSError, ValueError) as e:
        raise VerificationError([Problem(MEMORY_INDEX, "manifest", f"unreadable: {e}")]) from e
    problems = check_index(index, artifact / CRIU_DIR, size)
    if problems:
        raise VerificationError([Problem(MEMORY_INDEX, "manifest", p) for p in problems[:20]])
    return index


def check_index(index: MemoryIndex, images_dir: Path, file_size: int) -> list[str]:
    """Why ``index`` cannot be filled into what CRIU restores from ``images_dir``: every
    range page-aligned, inside ``pages.bin``, inside one writable anonymous mapping (private,
    or of a shared object) of a process of the images, no two overlapping in one process."""
    images = _pycriu_images()
    problems: list[str] = []
    mappings: dict[int, list[tuple[int, int]]] = {}
    for pid in sparse.pids(images_dir):
        vmas = sparse.vmas(images, images_dir, pid)
        mappings[int(pid)] = sorted(
            sparse.anon_private_ranges(vmas, writable=True) + shmem.writable_shared_ranges(vmas)
        )
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
            problems.append(f"{where}: not inside one writable anonymous mapping")
        else:
            by_pid.setdefault(r.pid, []).append((r.vaddr, r.vaddr + r.length))
    for pid, spans in by_pid.items():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            if start < end:
                problems.append(f"pid {pid}: ranges overlap at {start:#x}")
                break
    return problems
