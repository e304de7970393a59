from __future__ import annotations

import base64
import contextlib
import uuid

import pytest

from api.annotations import RESTORE_FROM
from devnode import chart, wait_until
from devnode.webhook import TlsServer, webhook_process


@pytest.fixture(scope="module")
def webhook(control_plane, tmp_path_factory):
    with webhook_process(tmp_path_factory.mktemp("webhook"), control_plane.kubeconfig) as w:
        yield w


def _webhook_answers(control_plane) -> bool:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "webhook-probe",
            "annotations": {RESTORE_FROM: f"absent-{uuid.uuid4().hex[:6]}"},
        },
        "spec": {"containers": [{"name": "main", "image": "registry.local/x:1"}]},
    }
    with control_plane.client() as c:
        r = c.post("/api/v1/namespaces/default/pods", params={"dryRun": "All"}, json=pod)
    return "starting without restore" in r.headers.get("warning", "")


@contextlib.contextmanager
def chart_webhook_registered(control_plane, webhook: TlsServer, name: str):
    """The chart's MutatingWebhookConfiguration (rules, namespaceSelector, matchConditions,
    failurePolicy), pointed at a local webhook by URL instead of through a Service."""
    why = chart.missing()
    if why:
        pytest.skip(why)
    (cfg,) = [o for o in chart.render() if o["kind"] == "MutatingWebhookConfiguration"]
    cfg["metadata"] = {"name": name}
    cfg["webhooks"][0]["clientConfig"] = {
        "url": f"{webhook.url}/mutate",
        "caBundle": base64.b64encode(webhook.ca.read_bytes()).decode(),
    }
    path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
    with control_plane.client() as c:
        r = c.post(path, json=cfg)
        assert r.status_code == 201, r.text
    # the API server picks up webhook configurations asynchronously: until it calls this
    # one, a dry-run restore pod of a missing PodSnapshot comes back without its warning
    wait_until(
        lambda: _webhook_answers(control_plane),
        what=f"the webhook {name} called",
        timeout=30,
        poll=0.1,
    )
    try:
        yield
    finally:
        with control_plane.client() as c:
            c.delete(f"{path}/{name}")
