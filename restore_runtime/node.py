"""The node a restore runs on, built once: its settings (api/node.py), and what they open in
the engine (the key restores must be signed with, the registry access and the cache of
pulled artifacts, the OCI runtime). The shim's bootstrap builds one for its life and hands it
down whole, snapshotctl builds one from its flags: nothing below renames a setting. Here
rather than on the settings themselves, so that api/ imports nothing of ours."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from api.node import NodeConfig

if TYPE_CHECKING:  # imported when used: a plain pod's shim never needs them
    from .artifact.cache import ArtifactCache
    from .artifact.oci import RegistryAccess
    from .artifact.signing import VerifyKey
    from .runc import Runc


def registry_access(settings: NodeConfig) -> RegistryAccess:
    from .artifact.oci import RegistryAccess

    return RegistryAccess(frozenset(settings.oci_plain_http), settings.oci_auth_file)


@dataclass
class NodeContext:
    settings: NodeConfig = field(default_factory=NodeConfig)
    #: the OCI runtime containers are restored with (in the shim: run by its reaper); None
    #: where CRIU restores plain process trees itself (snapshotctl)
    runc: Runc | None = None
    #: whether a restore must lie in ``settings.store_root``, be made in the pod's namespace
    #: and be the manifest admitted (the shim: always; snapshotctl: never)
    bound: bool = True
    #: a root-only directory where this node's restores record the memory-file chunks they
    #: verified (fill_ledger.py); None: every chunk is hashed
    fill_ledger_dir: Path | None = None

    @classmethod
    def of(cls, settings: NodeConfig, runc: Runc | None = None) -> NodeContext:
        """The shim's node: every restore bound to the store, the ledger where settings say."""
        return cls(settings, runc, bound=True, fill_ledger_dir=settings.fill_ledger_dir)

    @classmethod
    def standalone(
        cls,
        verify_key: Path | None = None,
        fill_threads: int | None = None,
        fill_ledger_dir: Path | None = None,
    ) -> NodeContext:
        """A node for ``snapshotctl`` and tests: no store binding, and a signature required
        only when a key is given."""
        settings = NodeConfig(
            verify_key_path=verify_key,
            signing_required=verify_key is not None,
            fill_threads=fill_threads,
        )
        return cls(settings, runc=None, bound=False, fill_ledger_dir=fill_ledger_dir)

    def verify_key(self) -> VerifyKey | None:
        """The Ed25519 public key restores require a signature from, read at each restore (a
        shim lives as long as its pod; the agent rotates the node's keys). A configured key
        that cannot be read fails the restore: unverifiable is not unsigned."""
        if self.settings.verify_key_path is None:
            return None
        from .artifact import signing  # cryptography costs ~0.1 s to import: only with a key

        return signing.load_public_key(self.settings.verify_key_path)

    def artifact_cache(self) -> ArtifactCache:
        """The node's cache of artifacts pulled from OCI registries (under the store)."""
        from .artifact.cache import CACHE_DIR, ArtifactCache

        s = self.settings
        return ArtifactCache(s.store_root / CACHE_DIR, s.oci_cache_max_bytes, registry_access(s))
