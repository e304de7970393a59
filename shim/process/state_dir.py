"""What the shim keeps per container on the node: ``<state>/snapshot-shim/<namespace>/<id>/``
(pid files, a restore's work directory with its images view mounted, the CRIU log of a
failed restore) and runc's log beside it. It goes when the container is deleted: through the
task's Delete, or through ``shim delete``, which containerd runs when a shim died, at any
moment of a restore included. Nothing of it outlives the container."""

from __future__ import annotations

from pathlib import Path

from restore_runtime import mounts


def remove_container_state(ns_dir: Path, container_id: str) -> None:
    mounts.remove_tree(ns_dir / container_id)
    (ns_dir / f"runc-{container_id}.log").unlink(missing_ok=True)
