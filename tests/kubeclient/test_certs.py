"""kubeclient.certs: the self-signed CA and serving certificate pass a strict TLS client."""

from __future__ import annotations

import contextlib
import ssl

import pytest

from kubeclient import certs


def _handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext, name: str) -> None:
    """A TLS handshake in memory (no sockets): raises what the client's verification raises."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname=name)
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        for side, peer_in, out in ((client, s_in, c_out), (server, c_in, s_out)):
            with contextlib.suppress(ssl.SSLWantReadError):
                side.do_handshake()
            peer_in.write(out.read())
        if client.version() and server.version():
            return
    raise AssertionError("handshake did not finish")


def test_the_chain_passes_strict_x509_verification(tmp_path):
    """Python >= 3.13 verifies with VERIFY_X509_STRICT by default: without key identifiers
    the in-cluster controller could not reach an API server serving these certificates."""
    tls = certs.ensure(tmp_path, ["snapshot-webhook.ns.svc", "10.96.0.1"])
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tls.cert, tls.key)
    client = ssl.create_default_context(cafile=str(tls.ca))
    client.verify_flags |= ssl.VERIFY_X509_STRICT
    _handshake(server, client, "snapshot-webhook.ns.svc")


def test_a_certificate_without_key_identifiers_is_renewed(tmp_path, monkeypatch):
    real = certs._builder

    def without_ids(subject, issuer, public_key, issuer_key, now):
        b = real(subject, issuer, public_key, issuer_key, now)
        b._extensions = []  # what certs.ensure wrote before the identifiers were added
        return b

    monkeypatch.setattr(certs, "_builder", without_ids)
    old = certs.ensure(tmp_path, ["a.svc"])
    before = old.cert.read_bytes()
    client = ssl.create_default_context(cafile=str(old.ca))
    client.verify_flags |= ssl.VERIFY_X509_STRICT
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(old.cert, old.key)
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(server, client, "a.svc")
    monkeypatch.setattr(certs, "_builder", real)
    assert certs.ensure(tmp_path, ["a.svc"]).cert.read_bytes() != before


@pytest.mark.parametrize("mix", ["another-ca", "another-key", "both-swapped"])
def test_a_secret_whose_certificate_does_not_chain_or_match_its_key_is_not_used(mix):
    """Isolation round 4 (read): a holder of ``create`` on Secrets in the release namespace
    (the webhook's token, the signer's) could make the other component's TLS Secret first,
    with a certificate its CA did not sign or a key that is not the certificate's; such a
    Secret is not usable, so it is replaced, not served."""
    names = ["snapshot-signer.ns.svc"]
    good, other = certs.make(names), certs.make(names)
    assert certs.usable(good, names)
    bad = {
        "another-ca": {**good, "ca.crt": other["ca.crt"]},
        "another-key": {**good, "tls.key": other["tls.key"]},
        "both-swapped": {**good, "tls.crt": other["tls.crt"], "tls.key": good["tls.key"]},
    }[mix]
    assert not certs.usable(bad, names)
