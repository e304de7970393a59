"""The chart's alerts read metrics that exist: every metric and label an alert's expression
names is in what the component exporting it serves on /metrics (its real registry and
routes, scraped in process), and the agent's `up` job is the agent's metrics Service. An
alert on a renamed metric would otherwise never fire, silently."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient
from prometheus_client import generate_latest

from agent.metrics import AgentMetrics
from controller.metrics import ControllerMetrics
from devnode import chart
from restore_runtime.artifact import signing
from signer.app import create_app as signer_app
from webhook.app import create_app as webhook_app

pytestmark = pytest.mark.skipif(chart.missing() is not None, reason=chart.missing() or "")
SELECTOR = re.compile(r"\b(snapshot_[a-z_]+|up)(\{[^}]*\})?")


async def _none(*_):
    return None


def families(text: str) -> dict[str, set[str]]:
    """{metric name: its label names} in a Prometheus text exposition."""
    names: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            names.setdefault(line.split()[2], set())
            continue
        m = re.match(r"([a-zA-Z_:]+)(?:\{([^}]*)\})?", line)
        if m and not line.startswith("#"):
            labels = {kv.split("=")[0] for kv in (m.group(2) or "").split(",") if kv}
            names.setdefault(m.group(1), set()).update(labels)
    return names


def exported() -> dict[str, set[str]]:
    """What each component serves on /metrics, from its real registry and routes, with every
    labelled metric touched once (an untouched labelled metric has no sample to show its
    labels). The cluster story scrapes the running components as well."""
    agent, controller = AgentMetrics(), ControllerMetrics()
    agent.restored("restored", 1.0)
    agent.checkpoints.labels("failed").inc()
    texts = [generate_latest(m.registry).decode() for m in (agent, controller)]
    key = signing.private_key_from_pem(signing.new_private_pem(), "test")
    signer = TestClient(signer_app(key, _none, _none, _none, "system:serviceaccount:a:b"))
    signer.post("/v1/sign", headers={"Authorization": "Bearer x", "Content-Length": "2"})
    texts.append(signer.get("/metrics").text)
    webhook = TestClient(webhook_app(_none))
    webhook.post("/mutate", content=b"{}")
    texts.append(webhook.get("/metrics").text)
    return families("\n".join(texts))


def alert_reads(objs: list[dict]) -> list[tuple[str, str, set[str], str]]:
    """(alert, metric, label names, selector) for every metric an alert's expression reads."""
    (rule,) = [o for o in objs if o["kind"] == "PrometheusRule"]
    out = []
    for a in rule["spec"]["groups"][0]["rules"]:
        for name, selector in SELECTOR.findall(a["expr"]):
            labels = {kv.split("=")[0].strip(" !~") for kv in selector.strip("{}").split(",") if kv}
            out.append((a["alert"], name, labels, selector))
    return out


def unknown(reads, have: dict[str, set[str]]) -> list[str]:
    """What the alerts read that ``have`` lacks (``up`` aside: Prometheus makes it)."""
    bad = []
    for alert, name, labels, _ in reads:
        if name == "up":
            continue
        family = name if name in have else re.sub(r"_total$", "", name)
        if family not in have:
            bad.append(f"{alert}: {name} is exported by no component")
        elif name in have and not labels <= have[name] | {"namespace", "instance", "job"}:
            bad.append(f"{alert}: {name} has no label {labels - have[name]}")
    return bad


def test_every_alert_reads_exported_metrics():
    objs = chart.render(set_values={"metrics.prometheusRule": "true"})
    reads = alert_reads(objs)
    assert {r[0] for r in reads} >= {
        "SnapshotRestoresFallingBack",
        "SnapshotCheckpointsFailing",
        "SnapshotAgentDown",
        "SnapshotSignerErrors",
    }
    assert unknown(reads, exported()) == []
    services = {o["metadata"]["name"] for o in objs if o["kind"] == "Service"}
    for alert, name, _, selector in reads:
        if name == "up":
            job = re.search(r'job="([^"]+)"', selector).group(1)
            assert job in services, f"{alert}: no Service {job} to scrape"
    # the check itself can fail: a renamed metric is caught
    assert unknown([("X", "snapshot_agent_checkpoint_total", set(), "")], exported())


def test_the_restore_histogram_drops_forged_figures():
    """The restore report is in the tenant's volume: a duration it forged (negative, huge)
    is counted as an outcome but not put in the histogram."""
    m = AgentMetrics()
    for seconds in (-5.0, 1e9, None, 2.0):
        m.restored("restored", seconds)
    sample = m.registry.get_sample_value
    assert sample("snapshot_agent_restores_reported_total", {"outcome": "restored"}) == 4
    assert sample("snapshot_agent_restore_seconds_count", {"outcome": "restored"}) == 1
    assert sample("snapshot_agent_restore_seconds_sum", {"outcome": "restored"}) == 2.0
