"""What a restore is asked to do (restore.py runs it): the artifact, where the tree goes,
and the node's settings that bind and verify it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # cryptography is slow to import; only signing needs it
    from restore_runtime.artifact.signing import VerifyKey


@dataclass
class RestoreRequest:
    artifact: Path
    pidfile: Path | None = None
    verify_key: VerifyKey | None = None
    control_dir: Path | None = None
    #: network namespace to restore into (name under /run/netns or a path); default: ours
    netns: str | None = None
    skip_compat: bool = False
    image_digest: str | None = None
    #: the new container's root, which receives the artifact's rootfs diff (containers only)
    rootfs: Path | None = None
    #: the CRIU version, when the caller read it itself (the shim, through its reaper: no
    #: subprocess of the engine's may race the shim's waitpid(-1))
    criu_version: str | None = None
    #: Binding (the shim sets all three; snapshotctl none): the artifact must lie under
    #: ``store_root``, be made in ``namespace``, and have the manifest digest admitted
    store_root: Path | None = None
    namespace: str | None = None
    admitted_digest: str | None = None
    #: refuse an artifact without a valid signature (needs ``verify_key``)
    require_signature: bool = False
    #: the container's OCI spec: restored credentials may not exceed what it grants
    oci_spec: dict | None = None
    #: where CRIU's log of a failed restore is kept (else it is logged)
    log_dir: Path | None = None
    #: the restore's work directory (staged images, CRIU's logs): the shim names one under
    #: the container's own state directory, which its delete removes even when the shim
    #: died mid-restore; a random directory in /tmp otherwise
    work_dir: Path | None = None
    #: threads that fill the memory file into the tree (memfill.py); default min(CPUs, 16)
    fill_threads: int | None = None
    #: a root-only directory where this node records the memory-file chunks restores have
    #: verified (fill_ledger.py); None: every chunk is hashed
    fill_ledger: Path | None = None
