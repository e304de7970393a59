"""The memory file (criu/memfile.py, memfill.py), with real CRIU (root).

The workload (tests/workloads/big_heap.py) is a parent and a forked child with large private
anonymous memory, part of it still shared copy-on-write between them, beside read-only and
file mappings, and a shared anonymous mapping and a memfd that both map (pinned host buffers
are such objects: the memory file carries them too, as one object each). Its memory file
restores bitwise the same as CRIU's own images, in both processes; an artifact without one
(the old format) still restores. A tampered chunk, a truncated file or a hostile index is
refused: the tree never runs and nothing is left.
"""

from __future__ import annotations

import itertools
import json
import socket
import sys
from pathlib import Path

import pytest

from api.manifest import CHUNK_SIZE, FILE_DIGEST
from api.memory import MEMORY_INDEX, MEMORY_PAGES, MemoryIndex
from devnode import free_port
from restore_runtime import procs, sandbox
from restore_runtime.artifact.follow import still_valid
from restore_runtime.artifact.hashing import hash_range
from restore_runtime.artifact.pack import describe_files, write_manifest
from restore_runtime.artifact.verify import load_manifest
from restore_runtime.criu import memfile
from restore_runtime.executor.tree_access import CriuDumper
from tests.conftest import requires_criu
from tests.helpers import ROOT, ask, restore_cli, snapshotctl

pytestmark = [requires_criu, pytest.mark.root]

BIG_HEAP = ROOT / "tests" / "workloads" / "big_heap.py"


def _start(tmp: Path) -> tuple[int, int]:
    port = free_port()
    while port + 1 > 65535 or not _free(port + 1):  # the child listens on the next port
        port = free_port()
    argv = [sys.executable, str(BIG_HEAP), "127.0.0.1", str(port), str(tmp / "file.bin")]
    pid = sandbox.start(argv, tmp / "big-heap.log")
    return pid, port


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _both(port: int) -> list[dict]:
    return [ask("127.0.0.1", port, timeout=30), ask("127.0.0.1", port + 1, timeout=30)]


def _memory(art: Path) -> tuple[MemoryIndex, int]:
    index = MemoryIndex.from_json((art / MEMORY_INDEX).read_bytes())
    return index, (art / MEMORY_PAGES).stat().st_size


@pytest.fixture
def dumped(tmp_path, cleanup_pids):
    """The workload's answers, then its artifact with a memory file (the source ended)."""
    pid, port = _start(tmp_path)
    cleanup_pids.append(pid)
    before = _both(port)
    art = tmp_path / "art"
    snapshotctl("checkpoint", "--pid", str(pid), "--output", str(art))
    return art, port, before


def test_a_memory_file_restores_both_processes_bitwise(dumped, tmp_path, cleanup_pids):
    art, port, before = dumped
    index, size = _memory(art)
    pids = {r.pid for r in index.ranges}
    assert len(pids) == 2, "the parent's and the child's memory both moved"
    moved = sum(r.length for r in index.ranges)
    assert size >= moved + (14 << 20) and moved >= 48 << 20
    # the biggest page file became the memory file by a rename: the pages CRIU keeps were
    # copied out of it and freed, and the 7 MiB of zeros written in each process became
    # holes as the file was hashed, which the index then left out (the restore never
    # writes them: they read as zero, as the answers below check)
    allocated = (art / MEMORY_PAGES).stat().st_blocks * 512
    assert moved <= allocated <= moved + (1 << 20), (moved, allocated)
    assert _huge_marked(art, index), "the moved mappings are marked for huge pages"
    shared = _shared_ranges(art, index)
    assert sum(r.length for r in shared) == 6 << 20, "the shared mapping and the memfd moved"
    assert len({r.pid for r in shared}) == 1, "each object is written through one process"
    rpid, report = restore_cli(art, tmp_path)
    cleanup_pids.append(rpid)
    assert report["outcome"] == "restored" and "fill" in report["timings"]
    assert report["fillBytes"] == size  # every byte of the file hashed, its data written
    after = _both(port)
    assert after == before
    assert after[0]["map"] != after[1]["map"], "the child's own change came back"


def test_the_index_leaves_the_memory_files_holes_out(tmp_path):
    """Unit: a hole of the memory file splits a range around it; a range in a hole goes."""
    from restore_runtime import holes

    (tmp_path / "memory").mkdir()
    with open(tmp_path / MEMORY_PAGES, "wb") as f:
        f.write(b"\x01" * (1 << 20))
        holes.punch(f.fileno(), 256 << 10, 256 << 10)
    ranges = [
        {"pid": 1, "vaddr": 1 << 30, "length": 768 << 10, "offset": 0},
        {"pid": 2, "vaddr": 2 << 30, "length": 128 << 10, "offset": 384 << 10},
        {"pid": 2, "vaddr": 3 << 30, "length": 256 << 10, "offset": 768 << 10},
    ]
    (tmp_path / MEMORY_INDEX).write_bytes(MemoryIndex.model_validate({"ranges": ranges}).to_json())
    assert memfile.drop_holes(tmp_path) == (384 << 10)
    got = [(r.pid, r.vaddr, r.length, r.offset) for r in _memory(tmp_path)[0].ranges]
    assert got == [
        (1, 1 << 30, 256 << 10, 0),
        (1, (1 << 30) + (512 << 10), 256 << 10, 512 << 10),
        (2, 3 << 30, 256 << 10, 768 << 10),
    ]


def test_a_mappings_run_is_one_range_of_the_index(dumped):
    """CRIU's pagemap entries stop at its pipe's size (1 MiB); the index joins what continues
    in memory and in the file within one mapping, so the fill handles a few large ranges
    (a 6.65 B worker's index had 13,202 of 1 MiB, and its fill ran at half speed)."""
    from restore_runtime.criu import sparse
    from restore_runtime.criu.images import _pycriu_images

    art, _, _ = dumped
    index, _ = _memory(art)
    for pid in {r.pid for r in index.ranges}:
        starts = {v["start"] for v in sparse.vmas(_pycriu_images(), art / "criu", str(pid))}
        mine = sorted((r for r in index.ranges if r.pid == pid), key=lambda r: r.vaddr)
        for a, b in itertools.pairwise(mine):
            continues = a.vaddr + a.length == b.vaddr and a.offset + a.length == b.offset
            assert not (continues and b.vaddr not in starts), (a, b)
    assert max(r.length for r in index.ranges) > (1 << 20)


def _shared_ranges(art: Path, index: MemoryIndex) -> list:
    """The ranges that lie in a shared mapping; their objects' pages left CRIU's images."""
    from restore_runtime.criu import shmem, sparse
    from restore_runtime.criu.images import _pycriu_images

    out = []
    for r in index.ranges:
        vmas = sparse.vmas(_pycriu_images(), art / "criu", str(r.pid))
        if any(s <= r.vaddr < e for s, e in shmem.writable_shared_ranges(vmas)):
            out.append(r)
    for pagemap in (art / "criu").glob("pagemap-shmem-*.img"):
        entries = sparse.load(_pycriu_images(), pagemap)[1:]
        assert sum(e["nr_pages"] for e in entries) < 256, f"{pagemap.name} kept its pages"
    return out


def _huge_marked(art: Path, index: MemoryIndex) -> bool:
    """Every private mapping that holds a range carries MADV_HUGEPAGE in its image (a shared
    object's huge pages are its mount's to decide)."""
    from restore_runtime.criu import sparse
    from restore_runtime.criu.images import _pycriu_images

    shared = {id(r) for r in _shared_ranges(art, index)}
    for r in index.ranges:
        if id(r) in shared:
            continue
        vmas = sparse.vmas(_pycriu_images(), art / "criu", str(r.pid))
        vma = next(v for v in vmas if v["start"] <= r.vaddr < v["end"])
        if not vma.get("madv", 0) & 1 << memfile.MADV_HUGEPAGE:
            return False
    return True


def test_an_artifact_without_a_memory_file_still_restores(tmp_path, cleanup_pids):
    pid, port = _start(tmp_path)
    cleanup_pids.append(pid)
    before = _both(port)
    art = tmp_path / "old"
    snapshotctl("checkpoint", "--pid", str(pid), "--output", str(art), "--no-split-memory")
    assert not (art / "memory").exists()
    rpid, report = restore_cli(art, tmp_path)
    cleanup_pids.append(rpid)
    assert "fill" not in report["timings"]
    assert _both(port) == before


def _refused(art: Path, port: int, tmp: Path, what: str) -> None:
    """The restore fails naming ``what``; no restored process is left, nothing listens."""
    pidfile = tmp / "refused.pid"
    out = snapshotctl("restore", str(art), "--pidfile", str(pidfile), check=False)
    assert out.returncode == 1, out.stdout + out.stderr
    assert what in out.stderr, out.stderr
    assert not pidfile.exists()
    assert not procs.running(load_manifest(art).source.pid), "the restored tree was killed"
    with pytest.raises(AssertionError):
        ask("127.0.0.1", port, timeout=1)


def test_a_tampered_chunk_never_runs(dumped, tmp_path):
    art, port, _ = dumped
    with open(art / MEMORY_PAGES, "r+b") as f:
        f.seek(5 << 20)
        b = f.read(1)
        f.seek(5 << 20)
        f.write(bytes([b[0] ^ 1]))
    _refused(art, port, tmp_path, "memory/pages.bin")


def test_a_truncated_memory_file_is_refused(dumped, tmp_path):
    art, port, _ = dumped
    with open(art / MEMORY_PAGES, "r+b") as f:
        f.truncate((art / MEMORY_PAGES).stat().st_size - 4096)
    _refused(art, port, tmp_path, "memory/pages.bin")


def _rewrite_index(art: Path, ranges: list[dict]) -> None:
    """A hostile index, with a manifest that lists it (an unsigned artifact: what someone
    who can write the store could make)."""
    (art / MEMORY_INDEX).write_text(json.dumps({"version": 1, "ranges": ranges}))
    m = load_manifest(art)
    m.files = describe_files(art, CHUNK_SIZE)
    write_manifest(art, m, None)


def _other_mapping(art: Path, pid: int) -> dict:
    """A mapping of ``pid`` that is neither writable anonymous memory nor a writable
    shared object (the read-only mapping, a file's)."""
    from restore_runtime.criu import shmem, sparse
    from restore_runtime.criu.images import _pycriu_images

    vmas = sparse.vmas(_pycriu_images(), art / "criu", str(pid))
    ok = sparse.anon_private_ranges(vmas, writable=True) + shmem.writable_shared_ranges(vmas)
    return next(
        v for v in vmas if (v["start"], v["end"]) not in ok and v["end"] - v["start"] >= 8192
    )


@pytest.mark.parametrize(
    "hostile", ["overlap", "outside", "other-mapping", "overflow", "past-end", "unaligned"]
)
def test_a_hostile_index_is_refused(dumped, tmp_path, hostile):
    art, port, _ = dumped
    index, size = _memory(art)
    r = index.ranges[0].model_dump()
    ranges = [x.model_dump() for x in index.ranges]
    if hostile == "overlap":
        ranges.append({**r, "vaddr": r["vaddr"] + 4096, "length": 4096})
    elif hostile == "outside":
        ranges.append({**r, "vaddr": 0x1000, "length": 4096})
    elif hostile == "other-mapping":
        v = _other_mapping(art, r["pid"])
        ranges.append({**r, "vaddr": v["start"], "length": 4096})
    elif hostile == "overflow":
        ranges.append({**r, "vaddr": (1 << 64) - 4096, "length": 1 << 64})
    elif hostile == "past-end":
        ranges.append({**r, "offset": size, "length": 4096})
    else:
        ranges.append({**r, "vaddr": r["vaddr"] + 1})
    _rewrite_index(art, ranges)
    problems = memfile.check_index(
        MemoryIndex.model_validate({"ranges": ranges}), art / "criu", size
    )
    assert problems, hostile
    _refused(art, port, tmp_path, "memory/index.json")


CHUNK = 256 * 1024  # many chunks of the memory file, some of them with runs that stay


def test_digests_taken_before_the_split_hold_where_it_says(tmp_path, cleanup_pids):
    """A real dump (tests/workloads/big_heap.py: two processes, runs that move and runs
    that stay with CRIU), every page file's chunks hashed as the follower would, then the
    split: each digest still_valid keeps matches the memory file's chunk now."""
    pid, port = _start(tmp_path)
    cleanup_pids.append(pid)
    _both(port)  # both processes have filled their memory
    images, work, art = tmp_path / "criu", tmp_path / "work", tmp_path / "art"
    for d in (images, work, art):
        d.mkdir()
    CriuDumper().dump(pid, images, work, True, None)
    before = {
        p.name: {
            k: hash_range(p, k * CHUNK, CHUNK, FILE_DIGEST, holes=True)
            for k in range(p.stat().st_size // CHUNK)
        }
        for p in images.glob("pages-*.img")
    }
    split = memfile.split(images, art)
    assert split.source in before and split.changed, "runs were punched out of the source"
    valid = still_valid(before[split.source], CHUNK, split.source_size, split.changed)
    assert 0 < len(valid) < len(before[split.source]), "some chunks kept, some dropped"
    for k, d in valid.items():
        now = hash_range(art / MEMORY_PAGES, k * CHUNK, CHUNK, FILE_DIGEST)
        assert now == d, f"chunk {k}"
