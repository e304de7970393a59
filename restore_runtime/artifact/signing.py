"""Ed25519 signatures over the exact bytes of manifest.json (PEM keys, via cryptography)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ..errors import SnapshotError


class KeyError_(SnapshotError):
    """A key file is missing, unreadable or not an Ed25519 key."""


def generate_keypair(private_path: Path, public_path: Path, overwrite: bool = False) -> None:
    """A new Ed25519 pair; the private key is created 0600 (never readable by others, not
    even for a moment) and an existing key file is never replaced unless ``overwrite``."""
    if not overwrite:
        for path in (private_path, public_path):
            if os.path.lexists(path):
                raise SnapshotError(f"{path} exists: refusing to replace a key (--force does)")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(private_path, flags, 0o600), "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(pem)
    public_path.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def load_private_key(path: Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as e:
        raise KeyError_(f"cannot load signing key {path}: {e}") from e
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyError_(f"signing key {path} is not an Ed25519 private key")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except (OSError, ValueError, TypeError) as e:
        raise KeyError_(f"cannot load verification key {path}: {e}") from e
    if not isinstance(key, Ed25519PublicKey):
        raise KeyError_(f"verification key {path} is not an Ed25519 public key")
    return key


def local_signer(path: Path) -> Callable[[bytes], bytes]:
    """A signer from a private key file on this machine (snapshotctl, a one-machine setup);
    a cluster's nodes ask the signer instead, and never hold the key."""
    key = load_private_key(path)
    return key.sign


def signature_valid(manifest_bytes: bytes, signature: bytes, key: Ed25519PublicKey) -> bool:
    try:
        key.verify(signature, manifest_bytes)
    except InvalidSignature:
        return False
    return True


def public_pem(key: Ed25519PrivateKey) -> bytes:
    """The public half of ``key`` as PEM (what nodes hold)."""
    from cryptography.hazmat.primitives import serialization

    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
