"""What a restore is asked to do (restore.py runs it): the artifact, the node it runs on (its
settings, keys and runtime, given whole), and where the tree goes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..node import NodeContext


@dataclass
class RestoreRequest:
    artifact: Path
    #: the node's settings and what they open; default: standalone (no store binding, a
    #: signature only when a key is set), as snapshotctl runs
    node: NodeContext = field(default_factory=NodeContext.standalone)
    #: Binding (the shim's node is bound; snapshotctl's is not): the artifact must lie under
    #: the node's store root, be made in ``namespace``, and have the manifest digest admitted
    namespace: str | None = None
    admitted_digest: str | None = None
    pidfile: Path | None = None
    control_dir: Path | None = None
    #: network namespace to restore into (name under /run/netns or a path); default: ours
    netns: str | None = None
    skip_compat: bool = False
    image_digest: str | None = None
    #: the new container's root, which receives the artifact's rootfs diff (containers only)
    rootfs: Path | None = None
    #: the container's OCI spec: restored credentials may not exceed what it grants
    oci_spec: dict | None = None
    #: where CRIU's log of a failed restore is kept (else it is logged)
    log_dir: Path | None = None
    #: the restore's work directory (staged images, CRIU's logs): the shim names one under
    #: the container's own state directory, which its delete removes even when the shim
    #: died mid-restore; a random directory in /tmp otherwise
    work_dir: Path | None = None
