"""What a node's settings (api/node.py) open in the engine: its registry access, its cache
of pulled artifacts and the key restores must be signed with. Here rather than on the
settings themselves, so that api/ imports nothing of ours."""

from __future__ import annotations

from typing import TYPE_CHECKING

from api.node import NodeConfig

from .cache import CACHE_DIR, ArtifactCache
from .oci import RegistryAccess

if TYPE_CHECKING:
    from restore_runtime.artifact.signing import VerifyKey


def registry_access(node: NodeConfig) -> RegistryAccess:
    return RegistryAccess(frozenset(node.oci_plain_http), node.oci_auth_file)


def artifact_cache(node: NodeConfig) -> ArtifactCache:
    """The node's cache of artifacts pulled from OCI registries (under the store)."""
    return ArtifactCache(node.store_root / CACHE_DIR, node.oci_cache_max_bytes,
                         registry_access(node))  # fmt: skip


def verify_key(node: NodeConfig) -> VerifyKey | None:
    """The Ed25519 public key restores require a signature from. A configured key that
    cannot be read fails the restore: unverifiable is not unsigned."""
    if node.verify_key_path is None:
        return None
    from . import signing  # cryptography costs ~0.1 s to import: only when a key is set

    return signing.load_public_key(node.verify_key_path)
