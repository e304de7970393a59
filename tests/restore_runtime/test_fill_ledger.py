"""The node's ledger of verified memory-file chunks (fill_ledger.py) through the real fill
(memfill.py) into a real stopped process: what one restore verified, another does not hash
again, and never for a file that changed since, a directory others can write, or a file
system other than a local one."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from api.manifest import FILE_DIGEST
from api.memory import MemoryRange
from restore_runtime import fill_ledger, memfill
from restore_runtime.errors import VerificationError
from restore_runtime.fill_ledger import Ledger

from .conftest import opened
from .test_memfill import CHUNK, DATA, MIB, _digests, _pages_file, _read

SETTLE = 0.05


@pytest.fixture(autouse=True)
def _short_settle(monkeypatch):
    """Files made by the test are seconds old at most: a shorter settle time, waited for."""
    monkeypatch.setattr(fill_ledger, "SETTLE_S", SETTLE)


def _setup(tmp_path: Path, pid: int, addr: int):
    path, content = _pages_file(tmp_path, DATA)
    ranges = [MemoryRange(pid=7, vaddr=addr + off, length=MIB, offset=off) for off in DATA]
    time.sleep(SETTLE * 2)
    return path, content, _digests(content), ranges


def _fill(path, digests, ranges, pid, root: Path, ledger: Ledger | None = None):
    fd = opened(path)  # one descriptor for the ledger and the fill, as a restore has
    ledger = ledger or Ledger.open(root, fd, FILE_DIGEST, digests)
    return memfill.fill(fd, CHUNK, digests, FILE_DIGEST, ranges, {7: pid}, workers=2, ledger=ledger)


def _tamper(path: Path, at: int, content: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(bytes([content[at] ^ 0xFF]))


def test_a_chunk_verified_once_is_not_hashed_again(tmp_path, target):
    pid, addr = target
    path, content, digests, ranges = _setup(tmp_path, pid, addr)
    first = _fill(path, digests, ranges, pid, tmp_path / "ledger")
    assert (first.hashed, first.trusted) == (3, 0)
    second = _fill(path, digests, ranges, pid, tmp_path / "ledger")
    assert (second.hashed, second.trusted) == (0, 3)
    assert _read(pid, addr, len(content)) == content
    assert (tmp_path / "ledger").stat().st_mode & 0o777 == 0o700


def test_a_file_changed_after_it_was_verified_is_hashed_again_and_refused(tmp_path, target):
    """The attack the ledger must not open: bytes swapped in the store after a restore
    verified them are never written unhashed."""
    pid, addr = target
    path, content, digests, ranges = _setup(tmp_path, pid, addr)
    _fill(path, digests, ranges, pid, tmp_path / "ledger")
    _tamper(path, CHUNK + 2 * MIB + 5, content)
    time.sleep(SETTLE * 2)
    with pytest.raises(VerificationError, match=r"mismatch in chunk\(s\) \[1\]"):
        _fill(path, digests, ranges, pid, tmp_path / "ledger")


def test_a_file_changed_while_it_is_filled_in_is_refused(tmp_path, target):
    """Marks taken for the file as it was when the fill began, the file written before its
    bytes are read: the fill fails after the write, as the tree has not run."""
    pid, addr = target
    path, content, digests, ranges = _setup(tmp_path, pid, addr)
    _fill(path, digests, ranges, pid, tmp_path / "ledger")
    ledger = Ledger.open(tmp_path / "ledger", opened(path), FILE_DIGEST, digests)
    assert ledger is not None
    _tamper(path, CHUNK + 2 * MIB + 5, content)
    with pytest.raises(VerificationError, match="changed while it was filled in"):
        _fill(path, digests, ranges, pid, tmp_path / "ledger", ledger)


def test_a_file_written_just_now_gets_no_ledger(tmp_path, target):
    pid, addr = target
    path, content, digests, _ = _setup(tmp_path, pid, addr)
    _tamper(path, 0, content)
    assert Ledger.open(tmp_path / "ledger", opened(path), FILE_DIGEST, digests) is None


def test_a_ledger_directory_others_can_write_is_not_used(tmp_path, target):
    pid, addr = target
    path, _, digests, ranges = _setup(tmp_path, pid, addr)
    root = tmp_path / "ledger"
    _fill(path, digests, ranges, pid, root)
    root.chmod(0o777)
    assert Ledger.open(root, opened(path), FILE_DIGEST, digests) is None
    assert _fill(path, digests, ranges, pid, root).hashed == 3


def test_a_ledger_path_that_is_a_link_is_not_used(tmp_path, target):
    pid, addr = target
    path, _, digests, _ = _setup(tmp_path, pid, addr)
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "ledger").symlink_to(real)
    assert Ledger.open(tmp_path / "ledger", opened(path), FILE_DIGEST, digests) is None


def test_a_file_on_another_file_system_than_a_local_one_gets_no_ledger(tmp_path):
    """procfs stands in for a shared file system (NFS, Lustre): its type is not a local
    store's, so every chunk of it would be hashed."""
    assert Ledger.open(tmp_path / "ledger", opened("/proc/self/status"), FILE_DIGEST, ["x"]) is None
    assert fill_ledger.fs_type(tmp_path) in fill_ledger.LOCAL_FS


def test_a_chunk_another_restore_holds_is_hashed_here_after_a_bounded_wait(tmp_path, target):
    pid, addr = target
    path, content, digests, ranges = _setup(tmp_path, pid, addr)
    root = tmp_path / "ledger"
    held = Ledger.open(root, opened(path), FILE_DIGEST, digests)
    assert held is not None
    claim = held.claim(0)  # as another restore's thread would, mid-hash
    assert claim is not None and not claim.verified
    done = threading.Event()

    def run():
        res.append(_fill(path, digests, ranges, pid, root))
        done.set()

    res: list = []
    threading.Thread(target=run, daemon=True).start()
    assert done.wait(30), "the fill waited on the other restore's chunk past its bound"
    assert res[0].hashed == 3
    assert held.claim(0) is None  # still the other restore's
    claim.release()
    again = _fill(path, digests, ranges, pid, root)
    assert (again.hashed, again.trusted) == (1, 2)  # chunk 0 was never marked
    assert _read(pid, addr, len(content)) == content


def test_a_chunk_that_failed_its_digest_is_never_marked(tmp_path, target):
    pid, addr = target
    path, content, digests, ranges = _setup(tmp_path, pid, addr)
    _tamper(path, CHUNK + 2 * MIB + 5, content)
    time.sleep(SETTLE * 2)
    with pytest.raises(VerificationError):
        _fill(path, digests, ranges, pid, tmp_path / "ledger")
    with pytest.raises(VerificationError, match=r"mismatch in chunk\(s\) \[1\]"):
        _fill(path, digests, ranges, pid, tmp_path / "ledger")
    assert os.path.isdir(tmp_path / "ledger")


def test_fills_at_once_on_a_node_share_its_threads(tmp_path, target):
    """Three other fills under way (their slots held here, as their processes would): a fill
    asked for four threads runs on one, and fills everything."""
    pid, addr = target
    path, content, digests, ranges = _setup(tmp_path, pid, addr)
    root = tmp_path / "ledger"
    others = [Ledger.open(root, opened(path), FILE_DIGEST, digests) for _ in range(3)]
    for o in others:
        assert o is not None
        o.enter()
    try:
        assert others[0].fills() == 3
        crowded = memfill.fill(
            opened(path),
            CHUNK,
            digests,
            FILE_DIGEST,
            ranges,
            {7: pid},
            workers=4,
            ledger=Ledger.open(root, opened(path), FILE_DIGEST, digests),
        )
    finally:
        for o in others:
            o.leave()
    assert crowded.threads == 1
    assert _read(pid, addr, len(content)) == content
    assert others[0].fills() == 1  # none held now: never fewer than one


def test_a_parent_directory_swapped_during_the_fill_puts_no_other_bytes_in(tmp_path, target):
    """Isolation round 3, attack 3: the ledger's identity came from a stat() of the path and
    every chunk was read by opening the path again, so an artifact directory swapped for one
    holding other bytes after the check (and swapped back before the end: renaming a parent
    changes no change time inside) put those bytes into the process unhashed. A restore now
    opens the memory file once (executor/restore.py) and gives that descriptor to the ledger
    and the fill: the swapped-in bytes are never read. The attacker's timing is a hook on
    the ledger's final check, which swaps the directories back."""
    pid, addr = target
    art = tmp_path / "art"
    art.mkdir()
    path, content, digests, ranges = _setup(art, pid, addr)
    root = tmp_path / "ledger"
    _fill(path, digests, ranges, pid, root)  # verified once: every chunk marked
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        ledger = Ledger.open(root, fd, FILE_DIGEST, digests)
        assert ledger is not None
        os.rename(art, tmp_path / "art.orig")  # the attacker's directory, other bytes
        evil = tmp_path / "art"
        evil.mkdir()
        (evil / path.name).write_bytes(bytes(b ^ 0xFF for b in content))
        checked = ledger.unchanged

        def swap_back() -> bool:
            os.rename(evil, tmp_path / "art.evil")
            os.rename(tmp_path / "art.orig", art)
            return checked()

        ledger.unchanged = swap_back  # type: ignore[method-assign]
        result = memfill.fill(
            fd, CHUNK, digests, FILE_DIGEST, ranges, {7: pid}, workers=2, ledger=ledger
        )
    finally:
        os.close(fd)
    assert result.trusted == 3, "the marks were used"
    assert _read(pid, addr, len(content)) == content, "only the verified bytes went in"


def test_the_ledger_and_the_fill_take_a_descriptor_never_a_path(tmp_path, target):
    """Isolation round 4 (read): a path would be opened again, and could name other bytes
    by then (round 3's attack 3); no caller passed one, but the form is gone."""
    pid, addr = target
    path, _, digests, ranges = _setup(tmp_path, pid, addr)
    with pytest.raises(TypeError, match="not a path"):
        Ledger.open(tmp_path / "ledger", path, FILE_DIGEST, digests)
    with pytest.raises(TypeError, match="not a path"):
        memfill.fill(path, CHUNK, digests, FILE_DIGEST, ranges, {7: pid}, workers=2)
