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
    pem = new_private_pem()
    key = private_key_from_pem(pem, str(private_path))
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(private_path, flags, 0o600), "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(pem)
    public_path.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def new_private_pem() -> bytes:
    return Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def load_private_key(path: Path) -> Ed25519PrivateKey:
    try:
        pem = path.read_bytes()
    except OSError as e:
        raise KeyError_(f"cannot load signing key {path}: {e}") from e
    return private_key_from_pem(pem, str(path))


def private_key_from_pem(pem: bytes, where: str) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as e:
        raise KeyError_(f"cannot load signing key {where}: {e}") from e
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyError_(f"signing key {where} is not an Ed25519 private key")
    return key


class KeyRing:
    """Several public keys, any of which may have signed a manifest: the current key and the
    retired ones kept for the artifacts they signed (a rotation's overlap). Verifies like an
    ``Ed25519PublicKey``."""

    def __init__(self, keys: list[Ed25519PublicKey]) -> None:
        self.keys = keys

    def verify(self, signature: bytes, data: bytes) -> None:
        for key in self.keys:
            try:
                key.verify(signature, data)
            except InvalidSignature:
                continue
            return
        raise InvalidSignature


VerifyKey = Ed25519PublicKey | KeyRing
_PEM_END = b"-----END PUBLIC KEY-----"


def load_public_key(path: Path) -> VerifyKey:
    """The public key in ``path``, or a ``KeyRing`` when it holds several (PEM blocks one
    after the other, the current key first)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise KeyError_(f"cannot load verification key {path}: {e}") from e
    keys = public_keys_from_pem(data, str(path))
    return keys[0] if len(keys) == 1 else KeyRing(keys)


def public_keys_from_pem(data: bytes, where: str) -> list[Ed25519PublicKey]:
    blocks = [b + _PEM_END for b in data.split(_PEM_END) if b.strip()]
    keys = []
    for block in blocks:
        try:
            key = serialization.load_pem_public_key(block.strip())
        except (ValueError, TypeError) as e:
            raise KeyError_(f"cannot load verification key {where}: {e}") from e
        if not isinstance(key, Ed25519PublicKey):
            raise KeyError_(f"verification key {where} is not an Ed25519 public key")
        keys.append(key)
    if not keys:
        raise KeyError_(f"cannot load verification key {where}: no PEM public key in it")
    return keys


def local_signer(path: Path) -> Callable[[bytes], bytes]:
    """A signer from a private key file on this machine (snapshotctl, a one-machine setup);
    a cluster's nodes ask the signer instead, and never hold the key."""
    key = load_private_key(path)
    return key.sign


def signature_valid(manifest_bytes: bytes, signature: bytes, key: VerifyKey) -> bool:
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
