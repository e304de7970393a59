"""Keys and certificates that survive GitOps: the signer makes its signing key, its serving
CA and certificate once, in Secrets of its namespace, and publishes the CA for agents in a
ConfigMap; every later start (another replica, a new pod after an upgrade) uses the same
ones. A rotation keeps the retired public key served, and an agent's refresh writes the
ring the node verifies with. `snapshot-signer` as its own process, against a real
kube-apiserver."""

from __future__ import annotations

import base64
import subprocess
import sys

import pytest

from agent.keys import refresh
from agent.signer_client import RemoteSigner
from api.signer import KEY_PATH
from devnode import chart
from devnode.webhook import signer_process
from restore_runtime.artifact import signing

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(chart.missing() is not None, reason=chart.missing() or ""),
]
NS = "signer-keeps"
KEY, TLS, CA = "the-signing-key", "the-signer-tls", "the-signer-ca"
ARGS = (
    "--key-secret",
    KEY,
    "--tls-secret",
    TLS,
    "--ca-configmap",
    CA,
    "--namespace",
    NS,
    "--service",
    "the-signer",
)


@pytest.fixture(scope="module")
def admin(control_plane):
    with control_plane.client() as c:
        c.post("/api/v1/namespaces", json={"metadata": {"name": NS}})
        yield c
        c.delete(f"/api/v1/namespaces/{NS}")


def secret(admin, name: str) -> dict[str, bytes]:
    r = admin.get(f"/api/v1/namespaces/{NS}/secrets/{name}")
    assert r.status_code == 200, r.text
    return {k: base64.b64decode(v) for k, v in r.json()["data"].items()}


def start(tmp, control_plane):
    return signer_process(tmp, control_plane.kubeconfig, None, f"{NS}:agent", *ARGS, own_ca=True)


def served(server, admin) -> tuple[bytes, bytes]:
    """(the CA the ConfigMap publishes, the keys served over TLS checked against it)."""
    r = admin.get(f"/api/v1/namespaces/{NS}/configmaps/{CA}")
    assert r.status_code == 200, r.text
    server.ca.parent.mkdir(parents=True, exist_ok=True)
    server.ca.write_text(r.json()["data"]["ca.crt"])
    with server.client() as c:
        return server.ca.read_bytes(), c.get(KEY_PATH).content


def test_made_once_kept_after_and_rotated_on_purpose(control_plane, admin, tmp_path):
    with start(tmp_path, control_plane) as first:
        ca, pem = served(first, admin)
    key = secret(admin, KEY)
    private = signing.private_key_from_pem(key["private.pem"], "the Secret")
    assert pem == signing.public_pem(private), "it serves the key it made"
    assert secret(admin, TLS)["ca.crt"] == ca

    with start(tmp_path, control_plane) as again:  # a new pod: same key, same CA
        assert served(again, admin) == (ca, pem)
    assert secret(admin, KEY) == key

    # the rotation docs/operations.md describes: a new private key, the old public one
    # kept as retired.pem, then a restart
    new = signing.new_private_pem()
    data = {"private.pem": new, "retired.pem": pem}
    r = admin.put(
        f"/api/v1/namespaces/{NS}/secrets/{KEY}",
        json={
            "metadata": {"name": KEY},
            "type": "Opaque",
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        },
    )
    assert r.status_code == 200, r.text
    with start(tmp_path, control_plane) as rotated:
        _, ring = served(rotated, admin)
        assert ring == signing.public_pem(signing.private_key_from_pem(new, "new")) + pem
        # an agent's refresh puts the ring on the node; what the old key signed verifies
        node_keys = tmp_path / "verify.pem"
        node_keys.write_bytes(pem)
        token = tmp_path / "token"
        token.write_text("unused")
        remote = RemoteSigner(rotated.url, rotated.ca, token)
        assert refresh(remote, node_keys) and node_keys.read_bytes() == ring
        assert not refresh(remote, node_keys), "unchanged: not written again"
    keys = signing.load_public_key(node_keys)
    assert signing.signature_valid(b"manifest", private.sign(b"manifest"), keys)


def test_an_unusable_key_secret_is_refused_not_replaced(control_plane, admin, tmp_path):
    """A Secret the admin made with something other than an Ed25519 key: the signer stops
    with the reason, and the Secret is left as it was (never overwritten with a new key)."""
    name = "not-a-key"
    r = admin.post(
        f"/api/v1/namespaces/{NS}/secrets",
        json={
            "metadata": {"name": name},
            "data": {"private.pem": base64.b64encode(b"junk").decode()},
        },
    )
    assert r.status_code == 201, r.text
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "signer.cli",
            "--key-secret",
            name,
            "--namespace",
            NS,
            "--self-signed",
            str(tmp_path / "c"),
            "--agent-service-account",
            f"{NS}:agent",
            "--kubeconfig",
            str(control_plane.kubeconfig),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode != 0
    assert f"signing key Secret {NS}/{name}" in p.stderr, p.stderr
    assert secret(admin, name) == {"private.pem": b"junk"}
