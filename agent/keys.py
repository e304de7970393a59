"""The node's verification keys kept as the signer serves them: the current key and the
retired ones still trusted for what they signed. The init container installs them once; this
refreshes them while the agent runs, so a rotation reaches every node without a restart
(docs/operations.md, "Rotating the signing key")."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from api.handshake import atomic_write

from .signer_client import RemoteSigner

log = logging.getLogger("snapshot.agent")
#: how often the agent asks the signer for its keys
KEY_REFRESH_S = 300.0


def refresh(signer: RemoteSigner, path: Path) -> bool:
    """Write the keys the signer serves to ``path`` (atomically) when they differ from what
    is there; True when written. What is not Ed25519 public keys is refused unwritten (by
    ``public_key``)."""
    pem = signer.public_key()
    try:
        if path.read_bytes() == pem:
            return False
    except FileNotFoundError:
        pass
    atomic_write(path, pem)
    log.info("verification keys at %s updated from %s", path, signer.url)
    return True


async def keep_fresh(signer: RemoteSigner, path: Path, every_s: float = KEY_REFRESH_S) -> None:
    while True:
        await asyncio.sleep(every_s)
        try:
            await asyncio.to_thread(refresh, signer, path)
        except Exception as e:  # the signer is away or serves garbage: keep the keys we have
            log.warning("cannot refresh the verification keys from %s: %s", signer.url, e)
