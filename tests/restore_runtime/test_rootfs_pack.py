"""The rootfs diff is packed from the tenant's overlay upper directory, which its still
running container can change under the packer (isolation round 2, attack 1). The swap of a
directory for a symbolic link is made at the worst moment on purpose, not left to luck: just
after the packer has looked at the entry and before it descends into it. Real files and
links on this machine; the upper directory stands in for an overlay's (the walk is the
same, and containerd's snapshotter dir would need a running container to race)."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest

from api.manifest import ROOTFS_DIFF_NAME
from restore_runtime.artifact.rootfs_pack import RootfsTooLarge, pack_upper
from restore_runtime.executor.tree_access import RuncDumper


@pytest.fixture
def tree(tmp_path):
    upper = tmp_path / "upper"
    (upper / "cache").mkdir(parents=True)
    (upper / "cache" / "model.txt").write_text("weights")
    (upper / "app.log").write_text("log line")
    (upper / "link").symlink_to("/etc/hostname")
    secret = tmp_path / "keys"  # the node's signing key, as the agent sees it
    secret.mkdir()
    (secret / "private.pem").write_text("PRIVATE KEY")
    return upper, secret


def members(tar: Path) -> dict[str, bytes | str]:
    with tarfile.open(tar) as t:
        return {
            m.name: (t.extractfile(m).read() if m.isfile() else m.linkname or m.type)
            for m in t.getmembers()
        }


def swap_after_look(monkeypatch, upper: Path, secret: Path) -> list[str]:
    """Once the packer has stat'ed ``cache`` (as a directory), the tenant replaces it by a
    link to the secret directory: both ways of looking (lstat by path, stat by dir fd)."""
    swapped: list[str] = []
    real_stat, real_lstat = os.stat, os.lstat

    def swap(path) -> None:
        if not swapped and os.fspath(path).endswith("cache"):
            os.rename(upper / "cache", upper / "cache.old")
            os.symlink(secret, upper / "cache")
            swapped.append(os.fspath(path))

    def stat(path, *a, **kw):
        st = real_stat(path, *a, **kw)
        swap(path)
        return st

    def lstat(path, *a, **kw):
        st = real_lstat(path, *a, **kw)
        swap(path)
        return st

    monkeypatch.setattr(os, "stat", stat)
    monkeypatch.setattr(os, "lstat", lstat)
    return swapped


def test_a_directory_swapped_for_a_link_mid_pack_is_not_followed(tree, tmp_path, monkeypatch):
    upper, secret = tree
    dumper = RuncDumper(container=None)  # type: ignore[arg-type]
    dumper.upperdir = str(upper)
    staging = tmp_path / "staging"
    staging.mkdir()
    swapped = swap_after_look(monkeypatch, upper, secret)
    dumper.pack_extra(staging)
    monkeypatch.undo()
    assert swapped, "the swap never happened: the test proves nothing"
    got = members(staging / ROOTFS_DIFF_NAME)
    assert not any(b"PRIVATE KEY" in v for v in got.values() if isinstance(v, bytes)), got
    assert not any(name.endswith("private.pem") for name in got), got
    assert got["app.log"] == b"log line"


def test_links_are_stored_as_links_and_whiteouts_left_out(tree, tmp_path):
    upper, _ = tree
    os.mknod(upper / "deleted", 0o600 | 0o020000, os.makedev(0, 0))  # overlayfs whiteout
    pack_upper(str(upper), tmp_path / "d.tar")
    got = members(tmp_path / "d.tar")
    assert got["link"] == "/etc/hostname"
    assert got["cache/model.txt"] == b"weights"
    assert "deleted" not in got


def test_a_huge_sparse_file_is_refused_not_written(tree, tmp_path):
    """Finding 9: a 1 TiB hole would have been written as a terabyte of zeros."""
    upper, _ = tree
    with open(upper / "hole", "wb") as f:
        f.truncate(1024**4)
    out = tmp_path / "d.tar"
    with pytest.raises(RootfsTooLarge, match="exceed 1048576 bytes"):
        pack_upper(str(upper), out, max_bytes=1024**2)
    assert out.stat().st_size < 1024**2
