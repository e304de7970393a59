"""The checkpoint side of the rootfs diff: a container's overlay upper directory as a tar.

The upper directory belongs to the tenant, and its container may still be running (with
``keepSourceRunning`` it is resumed before the pack). Nothing in it is resolved by name as
root: every entry is opened relative to its parent directory's descriptor with
``O_NOFOLLOW`` and described by ``fstat`` of what was opened, so a directory swapped for a
symbolic link (to the node's signing key, say, or through ``/proc/1/root``) fails to open
instead of being followed, and a file swapped for something else is what the descriptor
says it is. Symbolic links are stored as links, never read through. Device nodes, sockets
and overlayfs whiteouts are left out (a restore refuses devices anyway), and the bytes
written are bounded: a huge sparse file cannot fill the store."""

from __future__ import annotations

import errno
import logging
import os
import stat
import tarfile
from pathlib import Path

from ..errors import SnapshotError

log = logging.getLogger(__name__)

#: the default bound on the bytes of file content a rootfs diff may hold
DEFAULT_MAX_BYTES = 8 * 1024**3
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_SKIPPED_ERRNO = {errno.ELOOP, errno.ENOTDIR, errno.ENOENT, errno.ENXIO}


class RootfsTooLarge(SnapshotError):
    pass


def _info(name: str, st: os.stat_result) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mode, info.uid, info.gid = stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid
    info.mtime = int(st.st_mtime)
    return info


class _Packer:
    def __init__(self, tar: tarfile.TarFile, max_bytes: int) -> None:
        self.tar, self.budget, self.max_bytes = tar, max_bytes, max_bytes

    def _skipped(self, name: str, why: str) -> None:
        log.warning("rootfs diff: %s left out (%s)", name, why)

    def directory(self, fd: int, prefix: str) -> None:
        for entry in sorted(os.listdir(fd)):
            name = f"{prefix}{entry}"
            try:
                st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed by the running container meanwhile
            if stat.S_ISLNK(st.st_mode):
                info = _info(name, st)
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink(entry, dir_fd=fd)
                self.tar.addfile(info)
            elif stat.S_ISDIR(st.st_mode):
                self._open(fd, entry, name, os.O_DIRECTORY, self._add_dir)
            elif stat.S_ISREG(st.st_mode):
                self._open(fd, entry, name, 0, self._add_file)
            elif stat.S_ISFIFO(st.st_mode):
                info = _info(name, st)
                info.type = tarfile.FIFOTYPE
                self.tar.addfile(info)
            elif stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                continue  # an overlayfs whiteout: deletions are not carried over
            else:
                self._skipped(name, "device node or socket")

    def _open(self, fd: int, entry: str, name: str, flags: int, add) -> None:
        try:
            child = os.open(entry, _OPEN | flags, dir_fd=fd)
        except OSError as e:
            if e.errno in _SKIPPED_ERRNO:  # swapped for a link, or gone: never followed
                self._skipped(name, f"changed while packing: {e.strerror}")
                return
            raise
        try:
            add(child, name, os.fstat(child))
        finally:
            os.close(child)

    def _add_dir(self, fd: int, name: str, st: os.stat_result) -> None:
        info = _info(name, st)
        info.type = tarfile.DIRTYPE
        self.tar.addfile(info)
        self.directory(fd, f"{name}/")

    def _add_file(self, fd: int, name: str, st: os.stat_result) -> None:
        if not stat.S_ISREG(st.st_mode):
            self._skipped(name, "not a regular file once opened")
            return
        if st.st_size > self.budget:
            raise RootfsTooLarge(
                f"the container's rootfs changes exceed {self.max_bytes} bytes (at {name!r}, "
                f"{st.st_size} bytes): raise the limit or keep large files in a volume"
            )
        self.budget -= st.st_size
        info = _info(name, st)
        info.size = st.st_size
        with os.fdopen(os.dup(fd), "rb") as f:
            try:
                self.tar.addfile(info, f)
            except OSError as e:
                if e.errno is not None:  # the store's (ENOSPC, EIO): the checkpoint's error
                    raise
                # tarfile's "unexpected end of data": the running container truncated it
                raise SnapshotError(f"rootfs diff: {name!r} changed while packing: {e}") from e


def pack_upper(upper: str, out: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
    """Write ``upper``'s tree to the tar ``out`` (member names relative to ``upper``)."""
    fd = os.open(upper, _OPEN | os.O_DIRECTORY)
    try:
        with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
            _Packer(tar, max_bytes).directory(fd, "")
    finally:
        os.close(fd)
