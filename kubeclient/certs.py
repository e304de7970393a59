"""Self-signed serving certificates for clusters without cert-manager: a CA and a serving
certificate for the webhook's (or the signer's) Service, made with `cryptography`; and
serving an app over TLS. Kept across restarts (the
API server holds the CA in the webhook configuration's caBundle) and renewed when they are
missing, unreadable, expire within 30 days or do not cover the wanted names."""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from api.handshake import atomic_write

log = logging.getLogger("snapshot.webhook")
VALIDITY = dt.timedelta(days=365)
RENEW_BEFORE = dt.timedelta(days=30)
_SPKI = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


@dataclass(frozen=True)
class ServingCert:
    ca: Path
    cert: Path
    key: Path

    @property
    def ca_pem(self) -> bytes:
        return self.ca.read_bytes()


def service_names(service: str, namespace: str) -> list[str]:
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


FILES = ("ca.crt", "tls.crt", "tls.key")


def ensure(directory: Path, names: list[str]) -> ServingCert:
    """The CA and serving certificate in directory, created or renewed as needed."""
    out = ServingCert(*(directory / f for f in FILES))
    try:
        have = {f: (directory / f).read_bytes() for f in FILES}
    except OSError:
        have = {}
    if have and usable(have, names):
        return out
    directory.mkdir(parents=True, exist_ok=True)
    _write(directory, make(names))
    log.info("wrote a self-signed CA and serving certificate for %s to %s", names, directory)
    return out


async def from_secret(api, namespace: str, secret: str, names: list[str]) -> ServingCert:
    """The CA and serving certificate kept in Secret ``namespace/secret`` (made there once by
    whichever replica starts first, renewed as ``ensure`` would), as files in a directory of
    this process's own for the TLS server."""
    import tempfile

    from .owned import ensure_secret

    data = await ensure_secret(
        api, namespace, secret, lambda: make(names), lambda d: usable(d, names)
    )
    directory = Path(tempfile.mkdtemp(prefix="snapshot-tls-"))
    _write(directory, data)
    return ServingCert(*(directory / f for f in FILES))


async def made_for(
    api,
    namespace: str,
    service: str,
    extra_san: list[str],
    secret: str | None,
    directory: Path | None,
) -> ServingCert | None:
    """The webhook's or the signer's own CA and certificate for ``service``: kept in Secret
    ``secret``, else in ``directory``; None when neither is given (the admin's files)."""
    names = [*service_names(service, namespace), *extra_san]
    if secret is not None:
        return await from_secret(api, namespace, secret, names)
    if directory is not None:
        return ensure(directory, names)
    return None


def _write(directory: Path, data: dict[str, bytes]) -> None:
    atomic_write(directory / "tls.key", data["tls.key"])
    os.chmod(directory / "tls.key", 0o600)
    atomic_write(directory / "tls.crt", data["tls.crt"])
    atomic_write(directory / "ca.crt", data["ca.crt"])


def make(names: list[str]) -> dict[str, bytes]:
    """A new CA and a serving certificate it signs for ``names`` (DNS names or IPs), PEM, as
    ``ca.crt``, ``tls.crt`` and ``tls.key``."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "snapshot-webhook-ca")])
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key(), ca_key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    alt: list[x509.GeneralName] = []
    for n in names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            alt.append(x509.DNSName(n))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    cert = (
        _builder(subject, ca_name, key.public_key(), ca_key.public_key(), now)
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    pem = serialization.Encoding.PEM
    return {"ca.crt": ca.public_bytes(pem), "tls.crt": cert.public_bytes(pem), "tls.key": key_pem}


def _builder(subject, issuer, public_key, issuer_key, now: dt.datetime) -> x509.CertificateBuilder:
    # the key identifiers: RFC 5280 asks for them, and strict verifiers (Python >= 3.13's
    # default VERIFY_X509_STRICT) refuse a chain without the Authority Key Identifier
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key), critical=False
        )
    )


def _key_usage(cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=not cert_sign,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def usable(data: dict[str, bytes], names: list[str]) -> bool:
    """Whether a CA and certificate (``make``'s keys) can still serve ``names``."""
    try:
        cert = x509.load_pem_x509_certificate(data["tls.crt"])
        ca = x509.load_pem_x509_certificate(data["ca.crt"])
        key = serialization.load_pem_private_key(data["tls.key"], password=None)
        # a Secret another holder of create rights made first must hold a certificate that
        # its CA signed (what clients are told to trust) and that its key serves
        cert.verify_directly_issued_by(ca)
    except (KeyError, ValueError, TypeError, InvalidSignature):
        return False
    if key.public_key().public_bytes(*_SPKI) != cert.public_key().public_bytes(*_SPKI):
        return False
    if cert.not_valid_after_utc - dt.datetime.now(dt.UTC) < RENEW_BEFORE:
        return False
    try:  # made before the key identifiers were added: strict clients refuse it
        cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier)
    except x509.ExtensionNotFound:
        return False
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    have = {str(v) for v in san.get_values_for_type(x509.IPAddress)} | set(
        san.get_values_for_type(x509.DNSName)
    )
    return set(names) <= have


async def serve_tls(app, host: str, port: int, cert: Path, key: Path, log_level: str) -> None:
    """Serve an ASGI app (the webhook's, the signer's) over TLS until stopped."""
    import uvicorn

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        ssl_certfile=str(cert),
        ssl_keyfile=str(key),
        log_level=log_level,
        access_log=False,
    )
    await uvicorn.Server(config).serve()


def run_server(serve, args) -> int:
    """A TLS server's ``main``: its log format, then ``serve(args)`` until SIGINT/SIGTERM."""
    import asyncio
    import contextlib

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(args))
    except Exception as e:  # one line that says why (a bad key, no API server), no traceback
        log.critical("cannot serve: %s", e, exc_info=log.isEnabledFor(logging.DEBUG))
        return 1
    return 0
