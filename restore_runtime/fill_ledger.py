"""Which chunks of a memory file this node has already verified, so that restores of one
artifact on one node hash each chunk once (memfill.py), including restores that run at once.

Without it, N replicas restored together each read, hash and write the same file: on a GPU
node of 16 cores four fills took 0.9 s each against 0.23 s alone, a third of it hashing.

What a mark means: "chunk i of this file, as it was (device, inode, size, change time), hashed
to digest i of this manifest's list". It is trusted only where nobody but this node's root
could have changed the file since without a new change time: a local file system (a shared one
lets root on another node write behind this node's attribute cache, and there every byte is
hashed as it is written, as without a ledger), under a root-only directory, checked again after
the fill. Root on this node can change the bytes anyway, and holds the node's keys.

The ledger is one byte per chunk in a file of a root-only directory (tmpfs: it starts empty at
boot). A restore hashing a chunk holds an open-file-description lock on that byte, which the
kernel drops if the restore dies; another restore meeting the lock fills other chunks first
and, meeting it again, waits a bounded time for the mark before hashing that chunk itself.
Each restore starts at a random chunk, so restores that start together meet late.

The directory also counts the node's fills under way (a locked byte each in ``fills``), so
that N fills at once share the node's cores instead of each running all its threads: four
fills of 16 threads on 16 cores took 0.69-0.74 s each, of 4 threads 0.49-0.52 s (an H100 node,
every chunk verified before)."""

from __future__ import annotations

import ctypes
import fcntl
import logging
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from blake3 import blake3

log = logging.getLogger(__name__)

#: local file systems (statfs f_type) where only this node writes: ext4/3/2, XFS, btrfs,
#: tmpfs, ZFS, F2FS. Everything else (NFS, Lustre, GPFS, CephFS, FUSE, overlay) is hashed.
LOCAL_FS = frozenset({0xEF53, 0x58465342, 0x9123683E, 0x01021994, 0x2FC12FC1, 0xF2F52010})
#: ledger files untouched this long are removed (the next restore hashes again)
STALE_S = 24 * 3600.0
#: a file changed more recently than this gets no ledger: a second write within the kernel's
#: timestamp tick would leave its change time as it was
SETTLE_S = 2.0
_MARK = b"\x01"
_POLL_S = 0.002
#: the file whose locked bytes count the node's fills under way, and how many it counts
FILLS = "fills"
_SLOTS = 64
_OPEN = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
_FLOCK = "hhqqi"  # struct flock: type, whence, start, length, pid (0 for OFD locks)


def _lock(kind: int, byte: int) -> bytes:
    return struct.pack(_FLOCK, kind, os.SEEK_SET, byte, 1, 0)


_libc = ctypes.CDLL(None, use_errno=True)


def fs_type(file: Path | int) -> int:
    """statfs's f_type of a path, or of an open descriptor (fstatfs)."""
    buf = ctypes.create_string_buffer(256)  # struct statfs; f_type is its first word
    ok = (
        _libc.fstatfs(file, buf) if isinstance(file, int) else _libc.statfs(os.fsencode(file), buf)
    ) == 0
    if not ok:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(file))
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


def _root_only(st: os.stat_result) -> bool:
    return st.st_uid == 0 and not st.st_mode & 0o022


@dataclass(frozen=True)
class Identity:
    """A file's version as the kernel reports it: any write changes the change time."""

    dev: int
    ino: int
    size: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> Identity:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_ctime_ns)


class Claim:
    """A chunk's byte in the ledger, locked against other restores until ``release``."""

    def __init__(self, fd: int, index: int) -> None:
        self.fd, self.index = fd, index
        self.verified = os.pread(fd, 1, index) == _MARK

    def mark(self) -> None:
        os.pwrite(self.fd, _MARK, self.index)

    def release(self) -> None:
        os.close(self.fd)  # drops the lock


class Ledger:
    def __init__(self, path: Path, identity: Identity, memory_fd: int) -> None:
        self.path, self.identity, self.memory_fd = path, identity, memory_fd
        self._slot_fd: int | None = None  # this fill's counted slot in FILLS (enter)

    @classmethod
    def open(cls, root: Path, memory_fd: int, algorithm: str, digests: list[str]) -> Ledger | None:
        """The ledger of the memory file open at ``memory_fd`` (checked against ``digests``)
        under ``root``, or None where marks cannot be trusted: the file on a shared file
        system, changed within ``SETTLE_S``, or ``root`` not a root-only directory. Makes
        ``root`` (0700) if missing. A descriptor, never a path: the one the fill reads
        through (memfill.fill), so the identity is that of the bytes filled in, whatever a
        path names meanwhile (a parent directory swapped between the check and the reads
        changed no change time)."""
        if not isinstance(memory_fd, int):
            raise TypeError("the ledger takes the descriptor the restore opened, not a path")
        try:
            st = os.fstat(memory_fd)
            if fs_type(memory_fd) not in LOCAL_FS:
                log.info("memory file on a shared file system: every chunk is hashed")
                return None
            root.mkdir(mode=0o700, parents=True, exist_ok=True)
            dst = os.lstat(root)
        except OSError as e:
            log.warning("no fill ledger (%s): every chunk is hashed", e)
            return None
        if not (os.path.stat.S_ISDIR(dst.st_mode) and _root_only(dst)):
            log.warning("fill ledger %s is not a root-only directory: every chunk is hashed", root)
            return None
        if time.time_ns() - st.st_ctime_ns < SETTLE_S * 1e9:
            return None
        ident = Identity.of(st)
        key = blake3(struct.pack("<4Q", ident.dev, ident.ino, ident.size, ident.ctime_ns))
        key.update(algorithm.encode() + b"\0" + "\0".join(digests).encode())
        _prune(root, keep={FILLS})
        return cls(root / key.hexdigest(), ident, memory_fd)

    # -- the node's fills under way: one locked byte each in the directory's FILLS file ----
    def enter(self) -> None:
        """Count this fill among the node's until ``leave`` (or its death: the kernel drops
        the lock). Beyond ``_SLOTS`` fills at once, the others go uncounted."""
        fd = os.open(self.path.parent / FILLS, _OPEN, 0o600)
        for slot in range(_SLOTS):
            try:
                fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _lock(fcntl.F_WRLCK, slot))
                self._slot_fd = fd
                return
            except BlockingIOError:
                continue
        os.close(fd)

    def leave(self) -> None:
        if self._slot_fd is not None:
            os.close(self._slot_fd)
            self._slot_fd = None

    def fills(self) -> int:
        """How many fills are under way on this node, this one included."""
        fd = os.open(self.path.parent / FILLS, _OPEN, 0o600)
        try:
            held = sum(
                struct.unpack(_FLOCK, fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _lock(fcntl.F_WRLCK, s)))[
                    0
                ]
                != fcntl.F_UNLCK
                for s in range(_SLOTS)
            )
        finally:
            os.close(fd)
        return max(1, held)

    def claim(self, index: int, wait_s: float = 0.0) -> Claim | None:
        """Chunk ``index``'s byte, locked; None while another restore holds it past
        ``wait_s`` (polled: a blocking lock could not give up)."""
        fd = os.open(self.path, _OPEN, 0o600)
        lock = _lock(fcntl.F_WRLCK, index)
        deadline = time.monotonic() + wait_s
        try:
            while True:
                try:
                    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, lock)
                    return Claim(fd, index)
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        os.close(fd)
                        return None
                    time.sleep(_POLL_S)
        except BaseException:
            os.close(fd)
            raise

    def unchanged(self) -> bool:
        """Whether the memory file is still the version the marks were made for (asked after
        the fill: a write during it changes the change time)."""
        try:
            return Identity.of(os.fstat(self.memory_fd)) == self.identity
        except OSError:
            return False


def _prune(root: Path, keep: set[str]) -> None:
    cutoff = time.time() - STALE_S
    with os.scandir(root) as it:
        for e in it:
            if e.name in keep:
                continue
            try:
                st = e.stat(follow_symlinks=False)
                if os.path.stat.S_ISREG(st.st_mode) and st.st_mtime < cutoff:
                    os.unlink(e.path)
            except OSError:
                pass  # another restore pruned it first
