"""Writing an artifact: everything goes into a staging directory beside the destination and is
renamed into place only once complete, so a half-written artifact is never visible under the
destination name."""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from api.manifest import FILE_DIGEST, MANIFEST_NAME, SIGNATURE_NAME, FileDigest, FileEntry, Manifest

from ..errors import ArtifactExists, SnapshotError
from .hashing import ProgressFn, Slice, default_workers, hash_slices, slices

#: the exact bytes of manifest.json -> their signature: a local key (signing.local_signer),
#: or the cluster's signer, which holds the key off the node (agent/signer_client.py)
Signer = Callable[[bytes], bytes]

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_libc = ctypes.CDLL(None, use_errno=True)


def rename_noreplace(src: Path, dst: Path) -> None:
    """rename(2) that fails instead of replacing: a plain rename silently replaces an empty
    directory that appeared at the destination meanwhile."""
    if _libc.renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE):
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise ArtifactExists(str(dst))
        raise OSError(err, os.strerror(err), str(dst))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


STAGING_GLOB = ".*.staging-*"
#: the node's cache of pulled artifacts, under the store (artifact/cache.py)
CACHE_DIR = "oci-cache"


def remove_stale_staging(store: Path) -> list[Path]:
    """Staging directories left by checkpoints that were killed mid-way (under ``store`` and
    its namespace directories): nothing will ever commit them. Call only while no checkpoint
    runs (the agent, at start)."""
    # not the node cache's: shims pull into it while the agent starts (cache.py ages them)
    nested = (p for p in store.glob(f"*/{STAGING_GLOB}") if p.parent.name != CACHE_DIR)
    stale = [*store.glob(STAGING_GLOB), *nested]
    for d in stale:
        shutil.rmtree(d, ignore_errors=True)
    return stale


class Staging:
    """A staging directory for one artifact. Use as a context manager: leaving it by an
    exception removes everything it wrote."""

    def __init__(self, output: Path):
        self.output = output.absolute()
        if self.output.exists():
            raise ArtifactExists(str(self.output))
        if not self.output.parent.is_dir():
            raise SnapshotError(f"output directory {self.output.parent} does not exist")
        self.dir = self.output.parent / f".{self.output.name}.staging-{uuid.uuid4().hex[:12]}"
        self.dir.mkdir(mode=0o700)
        self.committed = False

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.committed:
            self.abort()

    def abort(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def commit(self) -> Path:
        self.dir.chmod(0o755)
        rename_noreplace(self.dir, self.output)
        _fsync_dir(self.output.parent)
        self.committed = True
        return self.output


def list_files(root: Path) -> list[Path]:
    """Every regular file under root except the manifest and its signature, sorted."""
    out = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath, name)
            rel = p.relative_to(root)
            if str(rel) in (MANIFEST_NAME, SIGNATURE_NAME):
                continue
            if p.is_symlink() or not p.is_file():
                raise SnapshotError(f"refusing to pack {rel}: not a regular file")
            out.append(p)
    return sorted(out)


def describe_files(
    root: Path,
    chunk_size: int,
    workers: int | None = None,
    progress: ProgressFn | None = None,
    holes: frozenset[str] = frozenset(),
    only: frozenset[str] | None = None,
    known: list[FileEntry] | None = None,
    algorithm: FileDigest = FILE_DIGEST,
    known_chunks: dict[str, dict[int, str]] | None = None,
) -> list[FileEntry]:
    """Size and digests of every file, all hashed in parallel: a file of one chunk whole, a
    larger one per chunk only (its whole-file digest would be one core's pass over the
    biggest file, and would check nothing its chunks do not). The files named in ``holes``
    (relative paths) have their zero blocks punched out as they are hashed. ``only``: these
    files alone; ``known``: entries made earlier, taken as they are; ``known_chunks``: chunk
    digests taken earlier (artifact/follow.py), per relative path and chunk index."""
    done = {e.path: e for e in known or []}
    rels = {p: p.relative_to(root).as_posix() for p in list_files(root)}
    paths = [p for p, rel in rels.items() if rel not in done and (only is None or rel in only)]
    sizes = {p: p.stat().st_size for p in paths}
    parts = {p: slices(p, sizes[p], chunk_size, rels[p] in holes) for p in paths}
    early = {p: (known_chunks or {}).get(rels[p], {}) for p in paths}
    work = [s for p in paths for s in parts[p] or [Slice(p, -1, 0, sizes[p])]]
    work = [s for s in work if s.index not in early[s.path]]
    digests = hash_slices(work, algorithm, workers or default_workers(), progress)
    for p in paths:
        digests.update({(p, i): d for i, d in early[p].items()})
    entries = list(done.values())
    for p in paths:
        n = len(parts[p])
        entries.append(
            FileEntry(
                path=rels[p],
                size=sizes[p],
                digest=digests[(p, -1)] if not n else None,
                chunks=[digests[(p, i)] for i in range(n)],
            )
        )
    return sorted(entries, key=lambda e: e.path)


def write_manifest(root: Path, manifest: Manifest, sign: Signer | None) -> str:
    """Write manifest.json (and manifest.sig, from ``sign``); return the manifest digest
    ``sha256:<hex>``."""
    data = manifest.to_json()
    _write_synced(root / MANIFEST_NAME, data)
    if sign is not None:
        _write_synced(root / SIGNATURE_NAME, sign(data))
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
