"""An artifact is bound to where it was made: the manifest records the source namespace,
PodSnapshot name and uid, and the signature covers them. A restore takes an artifact only
from the node's store, only for a pod of the same namespace, and only as the digest admission
saw. The errors say what did not hold, never whether some host path exists."""

from __future__ import annotations

import os
from pathlib import Path

from api.manifest import MANIFEST_NAME, Manifest

from ..errors import Problem, VerificationError


def _refuse(detail: str) -> VerificationError:
    return VerificationError([Problem(MANIFEST_NAME, "binding", detail)])


def in_store(artifact: Path, store_root: Path) -> Path:
    """The artifact's real path (symlinks resolved), which must lie under ``store_root``."""
    real = Path(os.path.realpath(artifact))
    root = Path(os.path.realpath(store_root))
    if real == root or not real.is_relative_to(root):
        raise _refuse(
            f"the artifact named by the pod is not in this node's artifact store ({root})"
        )
    return real


def for_namespace(manifest: Manifest, namespace: str) -> None:
    made_in = manifest.source.namespace
    if made_in != namespace:
        raise _refuse(
            f"the artifact was not checkpointed in namespace {namespace!r}; a pod restores only "
            "snapshots of its own namespace"
        )


def admitted(found_digest: str, admitted_digest: str | None) -> None:
    if admitted_digest is None:
        raise _refuse(
            "no admitted manifest digest: the pod was not admitted by the snapshot webhook"
        )
    if found_digest != admitted_digest:
        raise _refuse(f"manifest digest {found_digest} is not the admitted {admitted_digest}")


def _writable_by_others(st: os.stat_result) -> bool:
    return st.st_uid != 0 or bool(st.st_mode & 0o022)


def root_only(artifact: Path, store_root: Path) -> None:
    """Only root may be able to change what a restore reads: the store's directories down to
    the artifact, and everything in it, owned by root and writable by nobody else. Whoever
    else could write there could swap a checked image for another between the check and
    CRIU's read of it. Looked at with lstat only: nothing in the artifact is opened yet."""
    root = Path(os.path.realpath(store_root))
    real = Path(os.path.realpath(artifact))
    chain = [
        root,
        *(p for p in reversed(real.parents) if p.is_relative_to(root) and p != root),
        real,
    ]
    suspects = [p for p in chain if _writable_by_others(os.lstat(p))]
    for dirpath, dirnames, filenames in os.walk(real):
        for name in (*dirnames, *filenames):
            if _writable_by_others(os.lstat(os.path.join(dirpath, name))):
                suspects.append(Path(dirpath, name))
    if suspects:
        raise _refuse(
            f"{suspects[0]} can be written by others than root: a store that tenants or other "
            "users can write cannot be restored from (chown root, chmod go-w)"
        )
