"""Shared memory in CRIU's images, for the memory file's split (memfile.py): which shared
objects a process maps writable, where, and their pages.

CRIU dumps a shared anonymous mapping (``MAP_SHARED|MAP_ANONYMOUS``, what ``/dev/zero`` and
pinned host buffers are) and a memfd alike: as a memfd inode (``memfd.img``, named
``/dev/zero`` for the former) whose pages are in ``pagemap-shmem-<shmid>.img``, at their
offsets in the object. A mapping of it (``mm-<pid>.img``) names its file (``files.img``),
which names the inode. Older images name the object of a ``VMA_ANON_SHARED`` mapping by
``shmid`` directly. Either way a page at offset ``o`` of the object is at ``start + o -
pgoff`` of every process that maps that part: the fill writes it through one of them
(process_vm_writev writes a shared page in place), and CRIU restores the object without it
(an absent page of a shared object reads as zero, as a private one does)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import sparse

VMA_FILE_SHARED = 1 << 7
VMA_ANON_SHARED = 1 << 8
VMA_AREA_MEMFD = 1 << 14


@dataclass(frozen=True)
class Window:
    """Where process ``pid`` maps part of a shared object: ``[start, end)``, from offset
    ``pgoff`` of the object, writable."""

    pid: str
    start: int
    end: int
    pgoff: int

    def vaddr(self, offset: int) -> int:
        return self.start + offset - self.pgoff

    @property
    def offsets(self) -> tuple[int, int]:
        """The object's part it maps, [first, end) byte offsets."""
        return self.pgoff, self.pgoff + self.end - self.start


def writable_shared(vma: dict) -> bool:
    st = vma["status"]
    shared = st & VMA_ANON_SHARED or (st & VMA_AREA_MEMFD and st & VMA_FILE_SHARED)
    return bool(shared and st & sparse.VMA_AREA_REGULAR and vma.get("prot", 0) & sparse.PROT_WRITE)


def windows(images, images_dir: Path) -> dict[int, Window]:
    """For each shared object (by its pagemap's shmid) that some process maps writable, the
    largest such mapping (the first found, among equals)."""
    inode_shmid = {e["inode_id"]: e["shmid"] for e in _entries(images, images_dir / "memfd.img")}
    file_inode = {
        e["id"]: e["memfd"]["inode_id"]
        for e in _entries(images, images_dir / "files.img")
        if e.get("type") == "MEMFD" and "memfd" in e
    }
    out: dict[int, Window] = {}
    for pid in sparse.pids(images_dir):
        for v in sparse.vmas(images, images_dir, pid):
            if not writable_shared(v):
                continue
            if v["status"] & VMA_ANON_SHARED:
                shmid = v["shmid"]
            elif (inode := file_inode.get(v["shmid"])) is None or inode not in inode_shmid:
                continue
            else:
                shmid = inode_shmid[inode]
            w = Window(pid, v["start"], v["end"], v["pgoff"])
            have = out.get(shmid)
            if have is None or w.end - w.start > have.end - have.start:
                out[shmid] = w
    return out


def writable_shared_ranges(vmas: list[dict]) -> list[tuple[int, int]]:
    """[start, end) of a process's writable shared mappings (of anonymous memory or a
    memfd), sorted."""
    return sorted((v["start"], v["end"]) for v in vmas if writable_shared(v))


def _entries(images, path: Path) -> list[dict]:
    return sparse.load(images, path) if path.exists() else []
