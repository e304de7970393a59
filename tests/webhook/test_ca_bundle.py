"""The webhook's own certificate, GitOps-safe: with --tls-secret it keeps its CA and serving
certificate in a Secret (made by the first replica to start, reused by every later one), and
with --patch-ca-bundle writes the CA into its MutatingWebhookConfiguration, again whenever a
sync of the chart's manifest (which renders no caBundle) blanks it. `snapshot-webhook` as its
own process, called by a real kube-apiserver over that TLS."""

from __future__ import annotations

import base64
import tempfile
from pathlib import Path

import pytest

from devnode import chart, wait_until
from devnode.webhook import webhook_process

from .conftest import _webhook_answers

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(chart.missing() is not None, reason=chart.missing() or ""),
]
NS, SECRET, NAME = "webhook-keeps", "the-webhook-tls", "ca-bundle-kept"
MWC = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


def bundle(admin) -> str | None:
    return admin.get(f"{MWC}/{NAME}").json()["webhooks"][0]["clientConfig"].get("caBundle")


def test_the_ca_bundle_is_written_and_kept(control_plane, tmp_path):
    with control_plane.client() as admin:
        admin.post("/api/v1/namespaces", json={"metadata": {"name": NS}})
        (cfg,) = [o for o in chart.render() if o["kind"] == "MutatingWebhookConfiguration"]
        assert "caBundle" not in cfg["webhooks"][0]["clientConfig"], "the chart renders none"
        cfg["metadata"] = {"name": NAME}
        args = (
            "--tls-secret",
            SECRET,
            "--namespace",
            NS,
            "--service",
            "the-webhook",
            "--patch-ca-bundle",
            NAME,
            "--ca-bundle-recheck",
            "0.5",
        )
        try:
            # started before its configuration exists (helm applies both in no set order)
            with webhook_process(tmp_path, control_plane.kubeconfig, *args, own_ca=True) as w:
                cfg["webhooks"][0]["clientConfig"] = {"url": f"{w.url}/mutate"}
                assert admin.post(MWC, json=cfg).status_code == 201
                r = admin.get(f"/api/v1/namespaces/{NS}/secrets/{SECRET}")
                assert r.status_code == 200, r.text
                ca = r.json()["data"]["ca.crt"]
                wait_until(lambda: bundle(admin) == ca, what="the CA in the caBundle")
                wait_until(
                    lambda: _webhook_answers(control_plane),
                    timeout=30,
                    poll=0.2,
                    what="the API server calling the webhook over that CA",
                )
                # a GitOps sync re-applies the chart's manifest, without a caBundle
                blank = [{"op": "remove", "path": "/webhooks/0/clientConfig/caBundle"}]
                json_patch = {"Content-Type": "application/json-patch+json"}
                r = admin.patch(f"{MWC}/{NAME}", json=blank, headers=json_patch)
                assert r.status_code == 200, r.text
                wait_until(lambda: bundle(admin) == ca, what="the caBundle written again")
            # another replica, or the next pod: the same CA, from the Secret
            before = set(Path(tempfile.gettempdir()).glob("snapshot-tls-*/tls.key"))
            with webhook_process(tmp_path, control_plane.kubeconfig, *args, own_ca=True):
                r = admin.get(f"/api/v1/namespaces/{NS}/secrets/{SECRET}")
                assert r.json()["data"]["ca.crt"] == ca
                assert bundle(admin) == ca
                # isolation round 4 (read): its private key is not left on disk, neither
                # while it serves (the server holds it once loaded) nor after it
                left = set(Path(tempfile.gettempdir()).glob("snapshot-tls-*/tls.key"))
                assert left - before == set(), "the TLS key left on disk"
            left = set(Path(tempfile.gettempdir()).glob("snapshot-tls-*/tls.key"))
            assert left - before == set(), "the TLS key left behind"
        finally:
            admin.delete(f"{MWC}/{NAME}")
            admin.delete(f"/api/v1/namespaces/{NS}")
    assert base64.b64decode(ca).startswith(b"-----BEGIN CERTIFICATE-----")
