from __future__ import annotations

import base64
import contextlib
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from devnode import chart, free_port


@dataclass
class WebhookServer:
    url: str
    ca: Path
    log: Path

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, verify=ssl.create_default_context(cafile=self.ca), timeout=30
        )


@contextlib.contextmanager
def webhook_process(tmp: Path, kubeconfig: Path, *extra: str) -> Iterator[WebhookServer]:
    """`snapshot-webhook` as its own process, serving TLS on loopback with a self-signed CA."""
    port = free_port()
    log = tmp / f"webhook-{port}.log"
    certs = tmp / f"certs-{port}"
    cmd = [sys.executable, "-m", "webhook.cli", "--host", "127.0.0.1", "--port", str(port),
           "--self-signed", str(certs), "--extra-san", "127.0.0.1",
           "--kubeconfig", str(kubeconfig), *extra]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    server = WebhookServer(f"https://127.0.0.1:{port}", certs / "ca.crt", log)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                pytest.fail(f"snapshot-webhook exited {proc.returncode}:\n{log.read_text()}")
            with contextlib.suppress(httpx.HTTPError, OSError):
                if server.ca.exists():
                    with server.client() as c:
                        if c.get("/healthz").status_code == 200:
                            break
            if time.monotonic() > deadline:
                pytest.fail(f"snapshot-webhook not serving after 30s:\n{log.read_text()}")
            time.sleep(0.2)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def webhook(control_plane, tmp_path_factory):
    with webhook_process(tmp_path_factory.mktemp("webhook"), control_plane.kubeconfig) as w:
        yield w


@contextlib.contextmanager
def chart_webhook_registered(control_plane, webhook: WebhookServer, name: str):
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
