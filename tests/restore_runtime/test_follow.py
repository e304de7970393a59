"""Page images hashed while CRIU writes them (restore_runtime/artifact/follow.py): a growing
file's whole chunks are hashed as they appear, a digest taken before the memory file's split
is used only where nothing changed since (on a real CRIU dump: test_memfile.py), and the
checkpoint's hashing takes such digests instead of hashing those chunks again."""

from __future__ import annotations

import os
import threading
import time

from api.manifest import FILE_DIGEST
from api.memory import MEMORY_PAGES
from restore_runtime.artifact import follow
from restore_runtime.artifact.hashing import hash_range
from restore_runtime.artifact.pack import describe_files

CHUNK = 256 * 1024


def _piece(seed: int, n: int, zeros_at: int | None = None) -> bytes:
    data = bytearray(os.urandom(n)) if seed else bytearray(n)
    if zeros_at is not None:
        data[zeros_at : zeros_at + 64 * 1024] = bytes(64 * 1024)
    return bytes(data)


def test_whole_chunks_are_hashed_as_the_file_grows(tmp_path, monkeypatch):
    monkeypatch.setattr(follow, "POLL_S", 0.01)
    path = tmp_path / "pages-1.img"
    path.touch()
    with follow.PageFollower(tmp_path, CHUNK, workers=2) as follower:
        with open(path, "ab") as f:
            for k in range(3):  # chunk 1 holds a 64 KiB block of zeros
                f.write(_piece(1, CHUNK, zeros_at=CHUNK // 2 if k == 1 else None))
                f.flush()
        time.sleep(0.5)  # the dump goes on; the three whole chunks are hashed meanwhile
        with open(path, "ab") as f:
            f.write(_piece(1, CHUNK + CHUNK // 2))
        digests = follower.stop()["pages-1.img"]
    size = path.stat().st_size
    assert {0, 1, 2} <= set(digests) <= {0, 1, 2, 3}, "whole chunks only, the early ones all"
    for k, d in digests.items():
        assert d == hash_range(path, k * CHUNK, CHUNK, FILE_DIGEST), f"chunk {k}"
    assert path.stat().st_blocks * 512 <= size - 64 * 1024, "the zero block became a hole"


def test_a_digest_counts_only_where_nothing_changed_since():
    digests = {k: f"d{k}" for k in range(6)}
    # a punched range across chunks 1 and 2, one inside chunk 4; the file was 5.5 chunks
    changed = [(CHUNK + 4096, CHUNK), (4 * CHUNK + 8192, 4096), (3 * CHUNK, 0)]
    valid = follow.still_valid(digests, CHUNK, 5 * CHUNK + CHUNK // 2, changed)
    assert valid == {0: "d0", 3: "d3"}


def test_the_checkpoints_hashing_takes_the_chunks_known(tmp_path):
    (tmp_path / "memory").mkdir()
    data = _piece(1, 4 * CHUNK)
    (tmp_path / MEMORY_PAGES).write_bytes(data)
    full = describe_files(tmp_path, CHUNK)
    known = {0: full[0].chunks[0], 2: full[0].chunks[2]}
    hashed: list[int] = []
    again = describe_files(
        tmp_path, CHUNK, progress=hashed.append, known_chunks={MEMORY_PAGES: known}
    )
    assert again == full
    assert sum(hashed) == 2 * CHUNK, "only the chunks not known were read"


def test_following_nothing_gives_nothing(tmp_path):
    with follow.PageFollower(tmp_path, CHUNK) as follower:
        threading.Event().wait(0.1)
        assert follower.stop() == {}
