"""Serving certificates that every replica follows (faults round 3, cases 3 and 4): the
webhook's and the signer's certificate lives in a Secret that the first replica to see it
due renews; the others read it again while they run, serve the renewed certificate without
a restart, and publish the same CAs (the new one and the one it replaced), so no replica
writes back an older CA and no client meets a certificate it does not trust.

Against a real API server (two replicas as two followers of one Secret, a real
MutatingWebhookConfiguration for the caBundle) and a real TLS server on loopback."""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime as dt
import shutil
import socket
import ssl

import httpx
import pytest

from devnode import chart
from kubeclient import api as kube
from kubeclient import certs
from webhook.cli import patch_ca_bundle

pytestmark = pytest.mark.skipif(chart.missing() is not None, reason=chart.missing() or "")
NS, SECRET = "cert-follow", "the-webhook-tls"
NAMES = certs.service_names("the-webhook", NS)
CONFIG = "cert-follow-webhook"


@pytest.fixture
def webhook_config(control_plane):
    """A MutatingWebhookConfiguration of the chart's shape that no object ever reaches."""
    objs = {(o["kind"], o["metadata"]["name"]): o for o in chart.render()}
    config = copy.deepcopy(objs[("MutatingWebhookConfiguration", "snap-snapshot-webhook")])
    config["metadata"] = {"name": CONFIG}
    config["webhooks"][0]["objectSelector"] = {"matchLabels": {"never": "matched"}}
    path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
    with control_plane.client() as admin:
        admin.post("/api/v1/namespaces", json={"metadata": {"name": NS}})
        assert admin.post(path, json=config).status_code in (201, 409)
        yield admin, f"{path}/{CONFIG}"
        admin.delete(f"{path}/{CONFIG}")
        admin.delete(f"/api/v1/namespaces/{NS}/secrets/{SECRET}")


async def test_replicas_follow_a_renewal_and_publish_the_same_cas(
    control_plane, webhook_config, monkeypatch
):
    admin, config_path = webhook_config
    async with await kube.api_client(str(control_plane.kubeconfig)) as api:
        a = await certs.from_secret(api, NS, SECRET, NAMES)
        b = await certs.from_secret(api, NS, SECRET, NAMES)
        assert a.data == b.data, "the second replica took the first one's Secret"
        old_ca = a.data["ca.crt"]
        assert await patch_ca_bundle(api, CONFIG, a.ca_pem)
        # replica a finds the certificate due and renews it; b has not looked yet
        monkeypatch.setattr(certs, "RENEW_BEFORE", dt.timedelta(days=100_000))
        assert await a.refresh()
        monkeypatch.setattr(certs, "RENEW_BEFORE", dt.timedelta(days=30))
        new_ca = a.data["ca.crt"]
        assert new_ca != old_ca and a.data[certs.PREVIOUS_CA] == old_ca
        assert old_ca in a.ca_pem and new_ca in a.ca_pem, "both CAs trusted in the overlap"
        # b, still on the old certificate, writes the caBundle first: its old CA alone
        # was what flipped the bundle back before; now it reads the Secret again first
        assert await b.refresh(), "b follows the renewal a made"
        assert b.data == a.data and b.cert.read_bytes() == a.data["tls.crt"]
        assert await patch_ca_bundle(api, CONFIG, b.ca_pem)
        for _ in range(3):  # no replica writes anything else from now on
            assert not await a.refresh() and not await b.refresh()
            assert not await patch_ca_bundle(api, CONFIG, a.ca_pem)
            assert not await patch_ca_bundle(api, CONFIG, b.ca_pem)
    bundle = admin.get(config_path).json()["webhooks"][0]["clientConfig"]["caBundle"]
    assert base64.b64decode(bundle) == a.ca_pem


async def test_a_running_server_serves_the_renewed_certificate(tmp_path):
    """New connections get the certificate the follower wrote, without a restart: a client
    that trusts only the new CA fails before the follow and succeeds after it."""
    old, new = tmp_path / "old", tmp_path / "new"
    certs.ensure(old, ["127.0.0.1"])
    certs.ensure(new, ["127.0.0.1"])
    served = tmp_path / "served"
    shutil.copytree(old, served)
    renewed = asyncio.Event()

    async def follow() -> bool:
        if not renewed.is_set():
            return False
        for f in certs.FILES:
            shutil.copyfile(new / f, served / f)
        renewed.clear()
        return True

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = asyncio.create_task(certs.serve_tls(
        app, "127.0.0.1", port, served / "tls.crt", served / "tls.key", "warning",
        follow, every_s=0.1))  # fmt: skip

    async def get() -> int:
        ctx = ssl.create_default_context(cafile=str(new / "ca.crt"))
        async with httpx.AsyncClient(verify=ctx, timeout=5) as c:
            return (await c.get(f"https://127.0.0.1:{port}/")).status_code

    try:
        for _ in range(100):  # the server up
            try:
                await get()
            except httpx.ConnectError as e:
                if "CERTIFICATE_VERIFY_FAILED" in str(e):
                    break
            await asyncio.sleep(0.05)
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await get()
        renewed.set()
        for _ in range(100):
            if not renewed.is_set():
                break
            await asyncio.sleep(0.05)
        assert await get() == 200
    finally:
        server.cancel()
        with pytest.raises(asyncio.CancelledError):
            await server
