"""The memory fill (memfill.py) into a real stopped process, without CRIU: a forked child
with an untouched private anonymous mapping stands where CRIU's restored tree would be."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from api.manifest import FILE_DIGEST
from api.memory import MemoryRange
from restore_runtime import memfill
from restore_runtime.artifact.hashing import new_hash
from restore_runtime.errors import VerificationError

from .conftest import CHUNK, opened

MIB = 1 << 20


def _read(pid: int, addr: int, n: int) -> bytes:
    with open(f"/proc/{pid}/mem", "rb") as f:
        f.seek(addr)
        return f.read(n)


def _pages_file(where: Path, data_at: list[int]) -> tuple[Path, bytes]:
    """A sparse 2.5-chunk file: 1 MiB of random bytes at each offset in ``data_at``, holes
    elsewhere (as the checkpoint punches zero blocks)."""
    size = 2 * CHUNK + CHUNK // 2
    content = bytearray(size)
    path = where / "pages.bin"
    with open(path, "wb") as f:
        f.truncate(size)
        for off in data_at:
            block = os.urandom(MIB)
            f.seek(off)
            f.write(block)
            content[off : off + MIB] = block
    return path, bytes(content)


def _digests(content: bytes) -> list[str]:
    out = []
    for o in range(0, len(content), CHUNK):
        h = new_hash(FILE_DIGEST)
        h.update(content[o : o + CHUNK])
        out.append(h.hexdigest())
    return out


DATA = [0, 3 * MIB, CHUNK + 2 * MIB, 2 * CHUNK]


def test_the_index_ranges_land_bitwise_and_its_gaps_stay_untouched(tmp_path, target):
    pid, addr = target
    path, content = _pages_file(tmp_path, DATA)
    # the index names the data blocks only; the holes between them are gaps
    ranges = [MemoryRange(pid=7, vaddr=addr + off, length=MIB, offset=off) for off in DATA]
    n = memfill.fill(
        opened(path), CHUNK, _digests(content), FILE_DIGEST, ranges, {7: pid}, workers=2
    )
    assert n.bytes == len(content)
    assert _read(pid, addr, len(content)) == content


def test_a_changed_byte_in_a_range_fails_its_chunk(tmp_path, target):
    pid, addr = target
    path, content = _pages_file(tmp_path, DATA)
    digests = _digests(content)
    at = CHUNK + 2 * MIB + 5  # in the second chunk's block of data
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(bytes([content[at] ^ 0xFF]))
    ranges = [MemoryRange(pid=7, vaddr=addr + off, length=MIB, offset=off) for off in DATA]
    with pytest.raises(VerificationError, match=r"mismatch in chunk\(s\) \[1\]"):
        memfill.fill(opened(path), CHUNK, digests, FILE_DIGEST, ranges, {7: pid}, workers=2)


def test_a_file_cut_short_fails_its_last_chunk(tmp_path, target):
    """A memory file shorter than its manifest says: its last chunk fails its digest."""
    pid, addr = target
    path, content = _pages_file(tmp_path, DATA)
    digests = _digests(content)
    os.truncate(path, 2 * CHUNK + MIB // 2)  # the last block of data loses its second half
    ranges = [MemoryRange(pid=7, vaddr=addr + off, length=MIB, offset=off) for off in DATA]
    with pytest.raises(VerificationError, match=r"mismatch in chunk\(s\) \[2\]"):
        memfill.fill(opened(path), CHUNK, digests, FILE_DIGEST, ranges, {7: pid}, workers=2)


def test_gaps_are_hashed_as_zeros_and_never_read_into_the_page_cache(target):
    """A memory file on tmpfs (a store in /dev/shm): its holes are the zero blocks the
    checkpoint saved; filling them in (reading them through a mapping would) costs that
    memory again."""
    pid, addr = target
    if not _is_tmpfs("/dev/shm"):
        pytest.skip("/dev/shm is not tmpfs here: needed to see holes filled by page faults")
    shm = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="snapshot-memfill-"))
    try:
        path, content = _pages_file(shm, DATA)
        before = os.stat(path).st_blocks
        ranges = [MemoryRange(pid=7, vaddr=addr + off, length=MIB, offset=off) for off in DATA]
        memfill.fill(
            opened(path), CHUNK, _digests(content), FILE_DIGEST, ranges, {7: pid}, workers=2
        )
        assert os.stat(path).st_blocks == before, "the fill allocated the file's holes"
    finally:
        shutil.rmtree(shm)


def _is_tmpfs(path) -> bool:
    real = os.path.realpath(path)
    best = ""
    fstype = ""
    with open("/proc/self/mounts") as f:
        for line in f:
            _, mnt, typ, *_ = line.split()
            if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                best, fstype = mnt, typ
    return fstype == "tmpfs"
