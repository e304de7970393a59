"""The rootfs diff: the source container's writable-layer changes, unpacked into the new
container's root before it is restored.

The tar comes from an artifact, so it is hostile until proven otherwise, and it is unpacked
as root on the host. ``tarfile``'s own extraction filters changed between Python patch
releases (and one let a long path escape), so extraction here does not rely on them: every
path is resolved one component at a time under a directory descriptor of the root, never
following a symlink (``O_NOFOLLOW``, ``*at`` calls), so neither ``..``, an absolute name,
a symlink planted earlier in the same archive nor a hard link can reach outside the root.
Device nodes are refused; setuid/setgid bits are dropped."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from api.manifest import ROOTFS_DIFF_NAME

from ..errors import SnapshotError

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: permission bits kept: rwx for all and the sticky bit; never setuid/setgid
_MODE_MASK = 0o1777


class UnsafeArchive(SnapshotError):
    phase = "setup"


def apply_rootfs_diff(artifact: Path, rootfs: Path) -> bool:
    """Unpack the artifact's rootfs diff (if it has one) into ``rootfs``; False if none."""
    diff = artifact / ROOTFS_DIFF_NAME
    if not diff.exists():
        return False
    extract(diff, rootfs)
    return True


def extract(archive: Path, root: Path) -> None:
    """Extract ``archive`` confined to ``root``; UnsafeArchive names the first member that
    would leave it (or is a device), before anything of that member is written."""
    root_fd = os.open(root, _DIR)
    try:
        with tarfile.open(archive) as t:
            for m in t:
                try:
                    _extract_member(t, m, root_fd)
                except UnsafeArchive:
                    raise
                except OSError as e:  # ENAMETOOLONG, EEXIST on a directory, ...
                    raise UnsafeArchive(
                        f"{ROOTFS_DIFF_NAME}: cannot unpack member {m.name[:200]!r}: {e.strerror}"
                    ) from e
    except tarfile.TarError as e:
        raise UnsafeArchive(f"{ROOTFS_DIFF_NAME} is not a readable tar: {e}") from e
    finally:
        os.close(root_fd)


def _parts(name: str) -> list[str]:
    path = PurePosixPath(name)
    parts = [p for p in path.parts if p not in ("", ".")]
    if path.is_absolute() or ".." in parts or not parts:
        raise UnsafeArchive(
            f"{ROOTFS_DIFF_NAME}: member {name!r} is not a relative path inside the root"
        )
    return parts


@contextlib.contextmanager
def _parent(root_fd: int, parts: list[str], create: bool) -> Iterator[int]:
    """A descriptor of the directory holding ``parts[-1]``, walked without following
    symlinks (a symlink on the way is an error, not a detour)."""
    fd = os.dup(root_fd)
    try:
        for comp in parts[:-1]:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(comp, 0o755, dir_fd=fd)
            try:
                nxt = os.open(comp, _DIR, dir_fd=fd)
            except OSError as e:
                raise UnsafeArchive(
                    f"{ROOTFS_DIFF_NAME}: {'/'.join(parts)!r} passes through {comp!r}, "
                    f"which is not a directory inside the root ({e.strerror})"
                ) from e
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


def _clear(leaf: str, dir_fd: int, keep_dir: bool) -> None:
    """Remove what stands at ``leaf`` (a later member replaces an earlier one)."""
    try:
        st = os.stat(leaf, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        if keep_dir:
            return
        fd = os.open(leaf, _DIR, dir_fd=dir_fd)
        try:
            for name in os.listdir(fd):
                _clear(name, fd, keep_dir=False)
        finally:
            os.close(fd)
        os.rmdir(leaf, dir_fd=dir_fd)
    else:
        os.unlink(leaf, dir_fd=dir_fd)


def _extract_member(t: tarfile.TarFile, m: tarfile.TarInfo, root_fd: int) -> None:
    if m.ischr() or m.isblk():
        raise UnsafeArchive(f"{ROOTFS_DIFF_NAME}: device node {m.name!r} is not allowed")
    if not (m.isfile() or m.isdir() or m.issym() or m.islnk() or m.isfifo()):
        raise UnsafeArchive(f"{ROOTFS_DIFF_NAME}: member {m.name!r} has an unsupported type")
    parts = _parts(m.name)
    leaf, mode = parts[-1], m.mode & _MODE_MASK
    with _parent(root_fd, parts, create=True) as d:
        _clear(leaf, d, keep_dir=m.isdir())
        if m.isdir():
            with contextlib.suppress(FileExistsError):
                os.mkdir(leaf, 0o700, dir_fd=d)
        elif m.issym():
            # the target is only ever resolved inside the container (its own root)
            os.symlink(m.linkname, leaf, dir_fd=d)
        elif m.islnk():
            _hardlink(root_fd, _parts(m.linkname), leaf, d, m.name)
            return  # a hard link shares its target's inode, owner and mode
        elif m.isfifo():
            os.mkfifo(leaf, mode, dir_fd=d)
        else:
            _write_file(t, m, leaf, d)
        os.chown(leaf, m.uid, m.gid, dir_fd=d, follow_symlinks=False)
        if not m.issym():
            os.chmod(leaf, mode, dir_fd=d)


def _write_file(t: tarfile.TarFile, m: tarfile.TarInfo, leaf: str, dir_fd: int) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(leaf, flags, 0o600, dir_fd=dir_fd)
    src = t.extractfile(m)
    assert src is not None  # a regular member
    with os.fdopen(fd, "wb") as dst, src:
        shutil.copyfileobj(src, dst, 1 << 20)


def _hardlink(root_fd: int, target: list[str], leaf: str, dir_fd: int, name: str) -> None:
    with _parent(root_fd, target, create=False) as src_dir:
        try:
            st = os.stat(target[-1], dir_fd=src_dir, follow_symlinks=False)
        except FileNotFoundError:
            raise UnsafeArchive(
                f"{ROOTFS_DIFF_NAME}: hard link {name!r} points at {'/'.join(target)!r}, "
                "which is not a file inside the root"
            ) from None
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeArchive(f"{ROOTFS_DIFF_NAME}: hard link {name!r} to a non-regular file")
        os.link(target[-1], leaf, src_dir_fd=src_dir, dst_dir_fd=dir_fd, follow_symlinks=False)
