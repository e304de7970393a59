"""Self-signed serving certificates for clusters without cert-manager: a CA and a serving
certificate for the webhook's (or the signer's) Service, made with `cryptography`; and
serving an app over TLS. Kept across restarts (the
API server holds the CA in the webhook configuration's caBundle) and renewed when they are
missing, unreadable, expire within 30 days or do not cover the wanted names."""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


@dataclass
class FollowedCert:
    """A serving certificate kept in a Secret, which the running server follows: every
    ``refresh`` reads the Secret again (renewing it when due, as the first replica to see it
    due does), so every replica serves what the Secret holds and publishes the same CAs, and
    none writes back an older one. The files are this process's own."""

    api: Any
    namespace: str
    secret: str
    names: list[str]
    files: ServingCert
    data: dict[str, bytes]

    cert = property(lambda self: self.files.cert)
    key = property(lambda self: self.files.key)
    #: the CAs clients are to trust: the Secret's, and the one it replaced (``ca_bundle``)
    ca_pem = property(lambda self: ca_bundle(self.data))

    def forget(self) -> None:
        """The files gone once the server has loaded them: the private key is not left on
        disk (uvicorn ends a SIGTERM by raising it again, so no exit handler would run)."""
        shutil.rmtree(self.files.ca.parent, ignore_errors=True)

    async def refresh(self) -> bool:
        """The Secret read again; True when its certificate changed (then its files are
        written again, for the server to load and ``forget``)."""
        data = await _current(self.api, self.namespace, self.secret, self.names)
        if data == self.data:
            return False
        _write(self.files.ca.parent, data)
        self.data = data
        log.info("Secret %s/%s holds a new certificate: serving it", self.namespace, self.secret)
        return True


async def _current(api, namespace: str, secret: str, names: list[str]) -> dict[str, bytes]:
    from .owned import ensure_secret

    return await ensure_secret(
        api,
        namespace,
        secret,
        lambda: make(names),
        lambda d: usable(d, names),
        renew=lambda old: renewed(old, names),
    )


async def from_secret(api, namespace: str, secret: str, names: list[str]) -> FollowedCert:
    """The CA and serving certificate kept in Secret ``namespace/secret`` (made there once by
    whichever replica starts first, renewed as ``ensure`` would), as files in a directory of
    this process's own for the TLS server, followed from then on (``FollowedCert``)."""
    import tempfile

    data = await _current(api, namespace, secret, names)
    directory = Path(tempfile.mkdtemp(prefix="snapshot-tls-"))
    _write(directory, data)
    files = ServingCert(*(directory / f for f in FILES))
    return FollowedCert(api, namespace, secret, names, files, data)


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
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write(directory / "tls.key", data["tls.key"], mode=0o600)
    atomic_write(directory / "tls.crt", data["tls.crt"])
    atomic_write(directory / "ca.crt", ca_bundle(data))


#: beside a renewed CA in its Secret, the CA it replaced
PREVIOUS_CA = "ca-previous.crt"


def ca_bundle(data: dict[str, bytes]) -> bytes:
    """The CAs a client is to trust: the current one, and the one it replaced, so that a
    replica still serving the certificate before a renewal is trusted until it follows."""
    return b"".join(c if c.endswith(b"\n") else c + b"\n"
                    for c in (data["ca.crt"], data.get(PREVIOUS_CA, b"")) if c)  # fmt: skip


def renewed(old: dict[str, bytes], names: list[str]) -> dict[str, bytes]:
    """A new CA and certificate for ``names``, the CA they replace kept beside them."""
    new = make(names)
    try:
        x509.load_pem_x509_certificate(old["ca.crt"])
    except (KeyError, ValueError):
        return new
    return {**new, PREVIOUS_CA: old["ca.crt"]}


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


#: how often a running server follows its Secret, and republishes its CAs (a caBundle that
#: a GitOps sync blanked is written again within it)
FOLLOW_S = 30.0


async def serve_tls(
    app,
    host: str,
    port: int,
    cert: Path,
    key: Path,
    log_level: str,
    follow: Follow | None = None,
    every_s: float = FOLLOW_S,
    loaded: Callable[[], None] | None = None,
) -> None:
    """Serve an ASGI app (the webhook's, the signer's) over TLS until stopped. ``follow``,
    when given, runs now and every ``every_s``: it reads the certificate's Secret again and
    publishes the CAs; when it says the certificate changed, new connections are served
    with the new files (the listening socket's context reloaded; no restart, no race).
    ``loaded`` runs each time the files were read (FollowedCert.forget)."""
    import asyncio

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
    config.load()  # the files read now, before they are forgotten
    if loaded is not None:
        loaded()
    server = uvicorn.Server(config)
    task = None
    if follow is not None:
        task = asyncio.create_task(_follow(config, cert, key, follow, every_s, loaded))
    try:
        await server.serve()
    finally:
        if task is not None:
            task.cancel()


Follow = Callable[[], Awaitable[bool]]


def following(
    tls: ServingCert | FollowedCert | None,
    publish: Callable[[bytes], Awaitable[object]],
    what: str,
) -> tuple[Follow | None, Callable[[], None] | None]:
    """How a server follows ``tls`` (``serve_tls``'s ``follow`` and ``loaded``; None for the
    admin's own files): its Secret read again, then ``publish`` given the CAs it holds (the
    webhook's caBundle, the agents' CA ConfigMap; a failure there is logged, and a
    certificate that changed is served whatever happens to it); its files forgotten once
    loaded."""
    if tls is None:
        return None, None
    followed = isinstance(tls, FollowedCert)

    async def follow() -> bool:
        changed = followed and await tls.refresh()
        try:  # not there yet (helm applies it beside the Deployment) or an API server away
            await publish(tls.ca_pem)
        except Exception as e:
            log.warning("cannot publish the CA in %s: %s", what, str(e).splitlines()[0])
        return changed

    return follow, tls.forget if followed else None


async def _follow(config, cert: Path, key: Path, follow, every_s: float, loaded) -> None:
    import asyncio

    while True:
        try:
            if await follow() and config.ssl is not None:
                config.ssl.load_cert_chain(str(cert), str(key))
                if loaded is not None:
                    loaded()
        except Exception as e:  # the API server away: serve what we have, ask again
            log.warning("cannot follow the serving certificate: %s", str(e).splitlines()[0])
        await asyncio.sleep(every_s)


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
