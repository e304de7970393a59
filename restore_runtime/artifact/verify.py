"""Verification of an artifact before anything from it runs.

It reports every problem, not just the first: a missing, extra, truncated or modified file, a
path that escapes the artifact, an unreadable manifest, a missing or bad signature.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # cryptography costs ~0.1s to import; only signing needs it
    from restore_runtime.artifact.signing import VerifyKey

from pydantic import ValidationError

from api.manifest import MANIFEST_NAME, SIGNATURE_NAME, FileDigest, FileEntry, Manifest

from ..errors import Problem, VerificationError
from .hashing import ProgressFn, Slice, hash_slices, new_hash, slices


def manifest_digest(artifact: Path) -> str:
    return "sha256:" + hashlib.sha256((artifact / MANIFEST_NAME).read_bytes()).hexdigest()


def load_manifest(artifact: Path) -> Manifest:
    """Parse the manifest only (no digests): for ``inspect`` and for reading compat data."""
    try:
        return Manifest.from_json((artifact / MANIFEST_NAME).read_bytes())
    except FileNotFoundError as e:
        raise VerificationError([Problem(MANIFEST_NAME, "missing", "no manifest.json")]) from e
    except ValidationError as e:
        raise VerificationError([Problem(MANIFEST_NAME, "manifest", _first_error(e))]) from e


def _first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err.get("loc", ())) or "(root)"
    return f"invalid manifest at {loc}: {err.get('msg')}"


def unsafe_path(rel: str) -> str | None:
    """Why a manifest path cannot be trusted, or None. Paths are relative POSIX paths that
    stay inside the artifact."""
    if not rel or "\\" in rel or "\x00" in rel:
        return "empty or contains a backslash or NUL"
    p = PurePosixPath(rel)
    if p.is_absolute():
        return "absolute path"
    if any(part in ("..", ".", "") for part in rel.split("/")):
        return "contains '..' or '.' components"
    if rel in (MANIFEST_NAME, SIGNATURE_NAME):
        return "names the manifest itself"
    return None


@dataclass
class HashJob:
    """The digests one listed file must have, and the slices to hash for them."""

    entry: FileEntry
    slices: list[Slice]


def plan(
    artifact: Path, public_key: VerifyKey | None = None, raw: bytes | None = None
) -> tuple[Manifest | None, list[Problem], list[HashJob]]:
    """Every check that needs no hashing (manifest, signature, paths, presence, sizes,
    extra files), plus the hash jobs left to run. ``raw``: the manifest's bytes as the
    caller already read them (and checked their digest): read here otherwise."""
    artifact = artifact.absolute()
    if not artifact.is_dir():
        return None, [Problem(str(artifact), "missing", "artifact directory does not exist")], []
    try:
        raw = (artifact / MANIFEST_NAME).read_bytes() if raw is None else raw
    except FileNotFoundError:
        return None, [Problem(MANIFEST_NAME, "missing", "no manifest.json")], []
    problems: list[Problem] = []
    if public_key is not None:
        try:
            sig = (artifact / SIGNATURE_NAME).read_bytes()
        except FileNotFoundError:
            problems.append(Problem(SIGNATURE_NAME, "signature", "missing, but a key is set"))
        else:
            from . import signing

            if not signing.signature_valid(raw, sig, public_key):
                problems.append(
                    Problem(SIGNATURE_NAME, "signature", "does not match manifest.json")
                )
    try:
        manifest = Manifest.from_json(raw)
    except ValidationError as e:
        return None, [*problems, Problem(MANIFEST_NAME, "manifest", _first_error(e))], []

    real_root = os.path.realpath(artifact)
    listed: set[str] = set()
    jobs: list[HashJob] = []
    for entry in manifest.files:
        why = unsafe_path(entry.path)
        if why:
            problems.append(Problem(entry.path, "unsafe-path", why))
            continue
        if entry.path in listed:
            problems.append(Problem(entry.path, "manifest", "listed twice"))
            continue
        listed.add(entry.path)
        path = artifact / entry.path
        if not os.path.lexists(path):
            problems.append(Problem(entry.path, "missing", "listed in the manifest, not on disk"))
            continue
        real = os.path.realpath(path)
        if path.is_symlink() or os.path.commonpath([real_root, real]) != real_root:
            problems.append(
                Problem(entry.path, "unsafe-path", "is a symlink or leaves the artifact")
            )
            continue
        if not path.is_file():
            problems.append(Problem(entry.path, "unsafe-path", "not a regular file"))
            continue
        size = path.stat().st_size
        if size != entry.size:
            kind = "truncated" if size < entry.size else "modified"
            problems.append(Problem(entry.path, kind, f"{size} bytes, expected {entry.size}"))
            continue
        parts = slices(path, entry.size, manifest.chunk_size)
        if len(entry.chunks) != len(parts):
            problems.append(Problem(entry.path, "manifest", "chunk digests do not match its size"))
            continue
        jobs.append(HashJob(entry, parts or [Slice(path, -1, 0, entry.size)]))

    for dirpath, dirs, files in os.walk(artifact):
        for name in files + [d for d in dirs if Path(dirpath, d).is_symlink()]:
            rel = Path(dirpath, name).relative_to(artifact).as_posix()
            if rel not in listed and rel not in (MANIFEST_NAME, SIGNATURE_NAME):
                problems.append(Problem(rel, "extra", "on disk, not in the manifest"))
    return manifest, problems, jobs


def check_digests(
    jobs: list[HashJob],
    algorithm: FileDigest,
    workers: int | None = None,
    progress: ProgressFn | None = None,
) -> list[Problem]:
    digests = hash_slices([s for j in jobs for s in j.slices], algorithm, workers, progress)
    problems = []
    for j in jobs:
        expected = j.entry.digests
        got = [digests[(s.path, s.index)] for s in j.slices]
        bad = [i for i, (a, b) in enumerate(zip(expected, got, strict=True)) if a != b]
        if bad:
            where = f"chunk(s) {bad[:5]}" if j.entry.chunks else "content"
            problems.append(Problem(j.entry.path, "modified", f"{algorithm} mismatch in {where}"))
    return problems


def copy_verified(
    jobs: list[HashJob], artifact: Path, dest: Path, algorithm: FileDigest
) -> list[Problem]:
    """Each job's file read once, through a descriptor that follows no link, its bytes hashed
    and written to the same relative path under ``dest``: the restore then reads only those
    copies, so a store changed after the check (a shared store another node's root can
    write) changes nothing that is used. Only the bytes the manifest lists are copied."""
    problems = []
    for j in jobs:
        rel = j.entry.path
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        try:
            got = _copy_hashing(artifact / rel, dest / rel, j.slices, algorithm)
        except OSError as e:
            problems.append(Problem(rel, "unreadable", e.strerror or str(e)))
            continue
        if got is None:
            problems.append(Problem(rel, "truncated", "shorter than the manifest says"))
        elif got != j.entry.digests:
            problems.append(Problem(rel, "modified", f"{algorithm} mismatch"))
    return problems


def _copy_hashing(
    src: Path, dst: Path, parts: list[Slice], algorithm: FileDigest
) -> list[str] | None:
    digests = []
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        with open(dst, "xb") as out:
            for s in sorted(parts, key=lambda s: s.index):
                h, left = new_hash(algorithm), s.length
                while left:
                    block = os.pread(fd, min(left, 1 << 20), s.offset + s.length - left)
                    if not block:
                        return None
                    h.update(block)
                    out.write(block)
                    left -= len(block)
                digests.append(h.hexdigest())
    finally:
        os.close(fd)
    return digests


def verify(
    artifact: Path,
    public_key: VerifyKey | None = None,
    workers: int | None = None,
    progress: ProgressFn | None = None,
) -> tuple[Manifest | None, list[Problem]]:
    manifest, problems, jobs = plan(artifact, public_key)
    if manifest is None:
        return manifest, problems
    return manifest, problems + check_digests(jobs, manifest.file_digest, workers, progress)
