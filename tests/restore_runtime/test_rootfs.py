"""The rootfs diff is hostile input unpacked as root (restore_runtime/artifact/rootfs.py).

Cases: a legitimate diff (files, directories, symlinks, a hard link, a FIFO, owners and
modes) comes out as it went in, setuid/setgid bits dropped; each escape is refused before it
writes anything outside the root: ``..``, an absolute name, a symlink planted earlier then
written through (also a long chain of them, the path-length trick), a hard link to a file
outside the root, a device node; overlay mount options refuse separators."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from restore_runtime import mounts
from restore_runtime.artifact.rootfs import UnsafeArchive, extract


def make_tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w") as t:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            t.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def info(name: str, type_=tarfile.REGTYPE, mode=0o644, linkname="", uid=0, gid=0):
    i = tarfile.TarInfo(name)
    i.type, i.mode, i.linkname, i.uid, i.gid = type_, mode, linkname, uid, gid
    return i


@pytest.fixture
def layout(tmp_path):
    root = tmp_path / "rootfs"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("host file")
    return tmp_path, root, outside


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: unpacking sets owners (uid 1000)")
def test_a_legitimate_diff_unpacks(layout):
    tmp, root, _ = layout
    tar = make_tar(
        tmp / "d.tar",
        [
            (info("etc", tarfile.DIRTYPE, 0o755), None),
            (info("etc/app.conf", mode=0o640, uid=1000, gid=1000), b"x=1\n"),
            (info("etc/link", tarfile.SYMTYPE, linkname="/etc/app.conf"), None),
            (info("etc/hard", tarfile.LNKTYPE, linkname="etc/app.conf"), None),
            (info("run.fifo", tarfile.FIFOTYPE, 0o600), None),
            (info("bin/tool", mode=0o4755), b"#!/bin/sh\n"),
        ],
    )
    extract(tar, root)
    assert (root / "etc/app.conf").read_text() == "x=1\n"
    st = (root / "etc/app.conf").stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1000, 1000, 0o640)
    assert os.readlink(root / "etc/link") == "/etc/app.conf"
    assert (root / "etc/hard").stat().st_ino == st.st_ino
    assert stat.S_ISFIFO((root / "run.fifo").lstat().st_mode)
    assert stat.S_IMODE((root / "bin/tool").stat().st_mode) == 0o755, "setuid dropped"


@pytest.mark.parametrize(
    ("members", "why"),
    [
        ([(info("../escaped"), b"x")], "not a relative path"),
        ([(info("/escaped"), b"x")], "not a relative path"),
        ([(info("a/../../escaped"), b"x")], "not a relative path"),
        (
            [(info("esc", tarfile.SYMTYPE, linkname="OUTSIDE"), None), (info("esc/escaped"), b"x")],
            "not a directory inside the root",
        ),
        (
            [(info("lnk", tarfile.LNKTYPE, linkname="../outside/secret"), None)],
            "not a relative path",
        ),
        ([(info("dev", tarfile.CHRTYPE), None)], "device node"),
        ([(info("blk", tarfile.BLKTYPE), None)], "device node"),
    ],
    ids=[
        "dotdot",
        "absolute",
        "inner-dotdot",
        "symlink-then-write",
        "hardlink-out",
        "char-device",
        "block-device",
    ],
)
def test_escapes_are_refused(layout, members, why):
    tmp, root, outside = layout
    fixed = []
    for i, data in members:
        if i.linkname == "OUTSIDE":
            i.linkname = str(outside)
        fixed.append((i, data))
    tar = make_tar(tmp / "evil.tar", fixed)
    with pytest.raises(UnsafeArchive, match=why):
        extract(tar, root)
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    assert (outside / "secret").read_text() == "host file"
    assert not (tmp / "escaped").exists()


def test_path_length_trick(layout):
    """A long chain of symlinks whose resolved path passes PATH_MAX (what got past tarfile's
    own filter on some Python releases), then a write through it: refused, nothing outside."""
    tmp, root, outside = layout
    members, prev = [], ""
    for i in range(15):
        name = f"{'d' * 200}{i}"
        members.append((info(f"{prev}{name}", tarfile.DIRTYPE, 0o755), None))
        prev = f"{prev}{name}/"
    members.append((info("l", tarfile.SYMTYPE, linkname=prev + "../" * 15 + ".." + str(tmp)), None))
    members.append((info("l/outside/config.json"), b"{}"))
    tar = make_tar(tmp / "long.tar", members)
    with pytest.raises(UnsafeArchive):
        extract(tar, root)
    assert not (outside / "config.json").exists()


def test_overlay_options_refuse_separators(tmp_path):
    assert mounts.overlay_option("lowerdir", tmp_path) == f"lowerdir={tmp_path}"
    for bad in ("a:b", "a,upperdir=/x", "a\\b"):
        with pytest.raises(OSError, match="unusable in an overlay mount"):
            mounts.overlay_option("lowerdir", tmp_path / bad)
