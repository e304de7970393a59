"""The artifact manifest (``manifest.json``), format ``snapshot.artifact/v1``.

An artifact directory holds ``manifest.json``, optionally ``manifest.sig`` (Ed25519 over the
exact bytes of manifest.json), ``criu/`` (CRIU images) and, for containers,
``rootfs-diff.tar``. Every file other than the manifest and its signature is listed in
``files`` with its size and digests.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

from .host import GpuInfo as GpuInfo  # re-exported: the manifest's models name it
from .host import HostFingerprint
from .quiesce import Quiesce

FORMAT = "snapshot.artifact/v1"
MANIFEST_NAME = "manifest.json"
SIGNATURE_NAME = "manifest.sig"
CRIU_DIR = "criu"
ROOTFS_DIFF_NAME = "rootfs-diff.tar"
#: Large files are hashed in chunks of this size so verification runs on every core.
CHUNK_SIZE = 64 * 1024 * 1024

#: How a manifest's file digests are made. A restore hashes every byte it uses, the memory
#: file's included, while the tree waits: BLAKE3 hashed three times as fast as SHA-256 per
#: core on an H200 node (bench/results/gpu-trials/fill-bench-mapped-vs-copy-blake3.json),
#: with SHA-NI. Artifacts made before it (no ``fileDigest``) are SHA-256.
FileDigest = Literal["sha256", "blake3"]
FILE_DIGEST: FileDigest = "blake3"
_STORED: dict = {"stored": True}  # from_json's validation context


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


#: What a host must match to restore this artifact: the fingerprint of the host it was made
#: on (``restore_runtime.compat`` compares it with the restoring host's).
Compat = HostFingerprint


class Source(_Model):
    pid: int
    hostname: str
    command: list[str] = Field(default_factory=list)
    pod: str | None = None
    namespace: str | None = None
    container: str | None = None
    node: str | None = None
    #: the PodSnapshot this artifact was made for (binding; the signature covers it)
    pod_snapshot: str | None = Field(default=None, alias="podSnapshot")
    pod_snapshot_uid: str | None = Field(default=None, alias="podSnapshotUid")


class Network(_Model):
    pod_ips: list[str] = Field(default_factory=list, alias="podIPs")
    hostname: str | None = None
    #: the source had its own network namespace, dumped as external (restored into another)
    external_netns: bool = Field(default=False, alias="externalNetns")


class Cuda(_Model):
    """Which processes of the tree held CUDA state, by their PID inside the dumped PID
    namespace: those PIDs survive restore, host PIDs do not."""

    ns_pids: list[int] = Field(default_factory=list, alias="nsPids")


class FileEntry(_Model):
    path: str
    size: int
    #: the whole file's digest (the manifest's ``fileDigest``): for a file of one chunk
    digest: str | None = None
    #: the digest of each CHUNK_SIZE slice; present for files larger than one chunk
    chunks: list[str] = Field(default_factory=list)
    #: older artifacts (SHA-256) only: the whole file's sha256, for every file
    sha256: str | None = None

    @property
    def digests(self) -> list[str]:
        """What is checked: one digest per chunk (the whole file's, for one chunk)."""
        return self.chunks or [self.digest or self.sha256 or ""]

    @model_validator(mode="after")
    def _one_digest_at_least(self) -> FileEntry:
        if self.digest is None and self.sha256 is None and not self.chunks:
            raise ValueError(f"{self.path}: neither a whole-file digest nor chunk digests")
        return self


class Manifest(_Model):
    format: Literal["snapshot.artifact/v1"] = FORMAT
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC), alias="createdAt")
    source: Source
    compat: Compat
    network: Network = Field(default_factory=Network)
    cuda: Cuda = Field(default_factory=Cuda)
    chunk_size: int = Field(default=CHUNK_SIZE, alias="chunkSize")
    #: how ``files`` were hashed (from_json reads an artifact without it as SHA-256)
    file_digest: FileDigest = Field(default=FILE_DIGEST, alias="fileDigest")
    files: list[FileEntry]
    #: seconds per checkpoint phase (setup, quiesce, cuda, criu, pack, total, unaccounted)
    #: how the source was quiesced, so how a restore wakes it (None: the handshake files)
    quiesce: Quiesce | None = None
    timings: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _stored_before_blake3(cls, data: Any, info: ValidationInfo) -> Any:
        # a stored manifest that does not say was made before BLAKE3 (a new one says)
        if info.context is _STORED and isinstance(data, dict):
            data.setdefault("fileDigest", "sha256")
        return data

    @model_validator(mode="after")
    def _one_algorithm(self) -> Manifest:
        # an entry's field names its algorithm: a "sha256" in a BLAKE3 manifest is read as
        # neither, rather than checked with the wrong one
        if self.file_digest != "sha256" and any(f.sha256 for f in self.files):
            raise ValueError(f"a sha256 entry in a {self.file_digest} manifest")
        return self

    @property
    def size_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def uses_cuda(self) -> bool:
        return bool(self.cuda.ns_pids)

    def to_json(self) -> bytes:
        return self.model_dump_json(by_alias=True, indent=2).encode() + b"\n"

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        return cls.model_validate_json(data, context=_STORED)
