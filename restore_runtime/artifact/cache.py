"""The node's cache of artifacts pulled from an OCI registry: one directory per artifact,
named by the artifact's manifest digest (content-addressed: the name says what is inside),
each complete or absent (pulled into staging, every file checked against the manifest,
renamed into place), at most
``max_bytes`` in all, least recently used evicted first.

It lies under the node's artifact store, so the shim's "only from this node's store" binding
holds for pulled artifacts as for any other. An entry used within ``IN_USE_S`` is never
evicted: a restore reads its entry for seconds, not minutes."""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from api.manifest import MANIFEST_NAME
from api.node import DEFAULT_CACHE_MAX_BYTES

from ..errors import ArtifactExists
from .hashing import file_sha256
from .oci import DIGEST, OciError, OciRef, RegistryAccess, pull
from .pack import CACHE_DIR as CACHE_DIR  # re-exported: callers import it from here
from .pack import STAGING_GLOB, Staging
from .verify import verify

log = logging.getLogger(__name__)
IN_USE_S = 600.0


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


@dataclass
class ArtifactCache:
    root: Path
    max_bytes: int = DEFAULT_CACHE_MAX_BYTES
    access: RegistryAccess = field(default_factory=RegistryAccess)

    def entry(self, manifest_digest: str) -> Path:
        if not DIGEST.fullmatch(manifest_digest):
            raise OciError(f"{manifest_digest[:80]!r} is not a sha256 manifest digest")
        return self.root / manifest_digest.removeprefix("sha256:")

    def fetch(
        self, ref: OciRef, manifest_digest: str, timeout_s: float = 600.0
    ) -> tuple[Path, bool]:
        """The cached artifact whose manifest digest is ``manifest_digest``, pulled from
        ``ref`` first when absent. Returns (its directory, whether it was pulled now)."""
        entry = self.entry(manifest_digest)
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            st = Staging(entry)
        except ArtifactExists:  # cached (or another restore committed it a moment ago)
            os.utime(entry)  # most recently used
            return entry, False
        with st:
            pull(ref, st.dir, self.access, self.max_bytes, timeout_s, reserve=self.make_room)
            found = "sha256:" + file_sha256(st.dir / MANIFEST_NAME)
            if found != manifest_digest:
                # the entry's name must say what is inside, whatever the registry holds
                raise OciError(f"{ref.uri} holds the artifact {found}, not {manifest_digest}")
            # every file too, before the entry exists: anyone can push a copy of another
            # namespace's manifest with one page changed, and the entry, named by that
            # manifest, would then fail every restore of the real artifact on this node
            _, problems = verify(st.dir)
            if problems:
                raise OciError(
                    f"{ref.uri} does not hold the files its manifest lists: "
                    + "; ".join(str(p) for p in problems[:5])
                )
            try:
                st.commit()
            except ArtifactExists:  # another restore pulled it meanwhile: same content
                st.abort()
        return entry, True

    def entries(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return [p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")]

    def make_room(self, needed: int) -> None:
        """Evict least recently used entries until ``needed`` more bytes fit."""
        entries = sorted(((p.stat().st_mtime, p) for p in self.entries()), key=lambda e: e[0])
        sizes = {p: _size(p) for _, p in entries}
        used = sum(sizes.values())
        now = time.time()
        for mtime, p in entries:
            if used + needed <= self.max_bytes:
                return
            if now - mtime < IN_USE_S:
                continue
            log.info("evicting %s (%d bytes) from the artifact cache", p.name, sizes[p])
            shutil.rmtree(p, ignore_errors=True)
            used -= sizes[p]
        if used + needed > self.max_bytes:
            raise OciError(
                f"the artifact cache cannot make room for {needed} bytes "
                f"({used} of {self.max_bytes} in use by recent restores)"
            )

    def remove_stale_staging(self, older_than_s: float) -> list[Path]:
        """Pulls killed mid-way leave their staging directories; one older than any pull
        can run is nobody's (a pull in flight is never touched)."""
        if not self.root.is_dir():
            return []
        now = time.time()
        stale = [p for p in self.root.glob(STAGING_GLOB) if now - p.stat().st_mtime > older_than_s]
        for p in stale:
            shutil.rmtree(p, ignore_errors=True)
        return stale

    def remove(self, manifest_digest: str) -> None:
        shutil.rmtree(self.entry(manifest_digest), ignore_errors=True)

    def adopt(self, artifact: Path, manifest_digest: str) -> Path:
        """Move a freshly made artifact (same filesystem) into the cache under its digest:
        the node that checkpointed starts warm."""
        self.root.mkdir(parents=True, exist_ok=True)
        entry = self.entry(manifest_digest)
        os.rename(artifact, entry)
        return entry
