from __future__ import annotations

import base64
import contextlib
import time

import pytest

from devnode import chart
from devnode.webhook import TlsServer, webhook_process


@pytest.fixture(scope="module")
def webhook(control_plane, tmp_path_factory):
    with webhook_process(tmp_path_factory.mktemp("webhook"), control_plane.kubeconfig) as w:
        yield w


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
    time.sleep(1)  # the API server picks up webhook configurations asynchronously
    try:
        yield
    finally:
        with control_plane.client() as c:
            c.delete(f"{path}/{name}")
