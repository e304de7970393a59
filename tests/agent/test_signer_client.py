"""The agent's signer client when the signer is away (docs/failures.md, "the signer down,
hung or killed mid-sign"): a signature asked of a signer that refuses connections, or that
accepts them and never answers, fails with SignerError within the client's deadline, so the
checkpoint fails and its source is given back instead of waiting. A real TLS listener on
loopback stands for the hung signer."""

from __future__ import annotations

import socket
import ssl
import threading
import time

import pytest

from agent.signer_client import RemoteSigner, SignerError
from kubeclient import certs

TIMEOUT_S = 1.0


@pytest.fixture
def tls(tmp_path):
    return certs.ensure(tmp_path / "tls", ["127.0.0.1"])


def sign(url: str, ca, tmp_path) -> float:
    token = tmp_path / "token"
    token.write_text("t")
    t0 = time.monotonic()
    with pytest.raises(SignerError):
        RemoteSigner(url, ca, token, timeout_s=TIMEOUT_S).sign("ns", "snap", "uid", b"{}")
    return time.monotonic() - t0


def test_a_signer_that_is_down_fails_the_signature_at_once(tls, tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert sign(f"https://127.0.0.1:{port}", tls.ca, tmp_path) < 10 * TIMEOUT_S


@pytest.mark.parametrize("where", ["handshake", "answer"])
def test_a_signer_that_hangs_fails_the_signature_within_the_deadline(tls, tmp_path, where):
    """Accepted and never answered: before the TLS handshake, or after the request."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tls.cert, tls.key)
    held, stop = [], threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        held.append(conn)
        if where == "answer":
            conn = ctx.wrap_socket(conn, server_side=True)
            held.append(conn)
            conn.recv(65536)  # the request, read and never answered
        stop.wait(30)

    threading.Thread(target=serve, daemon=True).start()
    try:
        assert sign(f"https://127.0.0.1:{port}", tls.ca, tmp_path) < 10 * TIMEOUT_S
    finally:
        stop.set()
        for c in held:
            c.close()
        listener.close()
