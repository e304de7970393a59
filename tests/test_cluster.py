"""The user story through a real kubelet (devnode/cluster.py: kube-apiserver, controller-manager,
scheduler, containerd 2.x, kubelet): a pod scheduled by the scheduler and started by the kubelet
through containerd and our shim; a PodSnapshot of it captured by the controller and the node
agent; a replica that asks for it, rewritten by the webhook (the chart's registration),
scheduled, started by the kubelet and restored by the shim, with the source's memory on its
own pod IP; the agent's report on the pod; `kubectl logs` and `kubectl exec` on the restored
container.

The controller and the agent run in this process (the chart's image is not built here yet);
the webhook runs as its own process over TLS."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from agent.run import Agent, AgentConfig
from controller.loop import Controller
from devnode import cluster, workloads
from devnode.webhook import webhook_process
from kubeclient import api as kube
from restore_runtime.contracts import annotations as ann
from tests.conftest import CONTAINERD2_PROBLEM, VENV_BIN, requires_containerd
from tests.helpers import ask
from tests.webhook.conftest import chart_webhook_registered

pytestmark = [
    requires_containerd,
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.skipif(cluster.missing() is not None, reason=cluster.missing() or ""),
    pytest.mark.skipif(CONTAINERD2_PROBLEM is not None, reason=CONTAINERD2_PROBLEM or ""),
]
NS = "story"
PORT = 8080
IMAGE = "localhost/snapshot/busybox:1"


@pytest.fixture(scope="module")
def k8s(tmp_path_factory):
    with cluster.cluster(tmp_path_factory.mktemp("cluster"), [VENV_BIN]) as c:
        c.kubectl("create", "namespace", NS)
        c.kubectl("apply", "-f", "-", input=yaml.safe_dump({
            "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
            "metadata": {"name": "snapshot"}, "handler": "snapshot"}))  # fmt: skip
        yield c


def counter_pod(name: str, annotations: dict | None = None) -> dict:
    """The counter workload in busybox, with the host's Python mounted (devnode's workloads),
    Ready once its port answers."""
    mounts = workloads.mounts()
    vols = [{"name": f"host{i}", "hostPath": {"path": src}} for i, (src, _, _) in enumerate(mounts)]
    vmounts = [{"name": f"host{i}", "mountPath": dst, "readOnly": ro}
               for i, (_, dst, ro) in enumerate(mounts)]  # fmt: skip
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "annotations": annotations or {}},
        "spec": {
            "runtimeClassName": "snapshot", "volumes": vols,
            "containers": [{
                "name": "main", "image": IMAGE, "imagePullPolicy": "Never",
                "command": workloads.command(["tests/workloads/counter_server.py"], PORT),
                "volumeMounts": vmounts,
                "readinessProbe": {"tcpSocket": {"port": PORT}, "periodSeconds": 1},
            }],
        },
    }  # fmt: skip


def pod_ip(c, name: str) -> str:
    c.kubectl("-n", NS, "wait", "--for=condition=Ready", f"pod/{name}", "--timeout=90s")
    return json.loads(c.kubectl("-n", NS, "get", "pod", name, "-o", "json").stdout)["status"][
        "podIP"
    ]


async def test_snapshot_and_restore_through_a_real_kubelet(k8s, tmp_path):
    c = k8s
    c.kubectl("apply", "-f", "-", input=yaml.safe_dump(counter_pod("src")))
    ip_a = pod_ip(c, "src")
    for _ in range(3):
        before = ask(ip_a, PORT, timeout=30)

    c.kubectl("apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "nvidia.com/v1alpha1", "kind": "PodSnapshot",
        "metadata": {"name": "warm", "namespace": NS},
        "spec": {"source": {"podRef": {"name": "src"}, "containers": ["main"]}}}))  # fmt: skip
    async with await kube.api_client(str(c.api.kubeconfig)) as client:
        controller = Controller(client)
        agent = Agent(client, AgentConfig(node=cluster.NODE, store=c.node.store,
                                          kubelet_root=c.kubelet_root,
                                          sign_key=c.node.sign_key))  # fmt: skip
        for _ in range(30):
            await controller.reconcile_all()
            await agent.pass_once()
            await agent.drain()
            snap = json.loads(c.kubectl("-n", NS, "get", "podsnapshot", "warm", "-o",
                                        "json").stdout)  # fmt: skip
            if snap.get("status", {}).get("artifact"):
                break
            time.sleep(0.5)
        assert snap["status"]["artifact"]["manifestDigest"].startswith("sha256:"), snap

        with (
            webhook_process(tmp_path, c.api.kubeconfig) as w,
            chart_webhook_registered(c.api, w, "snapshot-story"),
        ):
            replica = counter_pod("replica", {ann.RESTORE_FROM: "warm"})
            c.kubectl("apply", "-f", "-", input=yaml.safe_dump(replica))
        ip_b = pod_ip(c, "replica")
        assert ip_b != ip_a
        after = ask(ip_b, PORT, timeout=30)
        assert int(after["count"]) > int(before["count"]), "the source's count carried over"
        assert after["digest"] == before["digest"] and after["addr"] == f"{ip_b}:{PORT}"

        await agent.pass_once()
        replica = json.loads(c.kubectl("-n", NS, "get", "pod", "replica", "-o", "json").stdout)
        restored = next(x for x in replica["status"]["conditions"]
                        if x["type"] == ann.RESTORED_CONDITION)  # fmt: skip
        assert (restored["status"], restored["reason"]) == ("True", "RestoreSucceeded")

    # the restored container is an ordinary one to kubectl
    assert c.kubectl("-n", NS, "exec", "replica", "--", "echo", "alive").stdout.strip() == "alive"
    c.kubectl("-n", NS, "logs", "replica")
    describe = c.kubectl("-n", NS, "describe", "pod", "replica").stdout
    assert "RestoreSucceeded" in describe
