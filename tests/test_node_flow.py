"""The whole Kubernetes flow on one node: PodSnapshot -> controller -> node agent checkpoint ->
webhook-admitted restore pod -> shim restore -> agent reports `nvidia.com/Restored` -> deleting
the PodSnapshot deletes its artifact.

Every component is real: kube-apiserver + etcd, the controller, the agent, the webhook process
registered through the chart's configuration, containerd's CRI plugin with CNI networking,
runc, CRIU and our shim. Except the kubelet, which does not run here. The test does its part
the way the kubelet does: it binds API pods to the node, starts them through CRI (crictl with
the pod's runtime class and annotations, and the control volume at the kubelet's emptyDir
path), and writes the pod status back through pods/status."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from agent import decisions
from agent.loop import Agent, AgentConfig
from agent.signer_client import RemoteSigner
from api import annotations as ann
from api.handshake import DEFAULT_CONTROL_DIR
from api.signer import SIGNER_AUDIENCE
from controller.loop import Controller
from devnode import oci_registry, workloads
from devnode.cri import Crictl
from devnode.webhook import signer_process, webhook_process
from kubeclient import api as kube
from restore_runtime.artifact import oci
from restore_runtime.artifact.oci import OciError, OciRef, RegistryAccess
from tests.admission_policy import installed_policy
from tests.conftest import CRI_NODE
from tests.controller.objects import bound_pod, conditions
from tests.helpers import ROOT, ask, get_json
from tests.kube_support import resync, settle
from tests.webhook.conftest import chart_webhook_registered

pytestmark = CRI_NODE

NODE = "node-e2e"
IMAGE = "localhost/snapshot/busybox:1"
PORT = 8080
COUNTER = workloads.command(["tests/workloads/counter_server.py"], PORT)
#: a stand-in for vLLM's server (not vLLM: its sleep-mode endpoints and their answers), on
#: every address of the pod: the agent and the shim call it on the pod's loopback
STANDIN_VLLM = ["sh", "-c", f"cd {ROOT} && exec {workloads.VENV_PYTHON} "
                f"tests/workloads/standin_engine.py 0.0.0.0 {PORT}"]  # fmt: skip


def snaps(ns: str) -> str:
    return f"/apis/nvidia.com/v1alpha1/namespaces/{ns}/podsnapshots"


class Kubelet:
    """The kubelet's part, done through the same APIs it uses (see the module docstring)."""

    def __init__(self, api, crictl: Crictl, root, ns: str) -> None:
        self.api, self.crictl, self.root, self.ns = api, crictl, root, ns
        self.sandboxes: list[str] = []

    def start(self, pod: dict, command: list[str] = COUNTER,
              ready: Callable[[str], object] | None = None) -> tuple[str, str]:  # fmt: skip
        """Runs an API pod through CRI (busybox with the host's Python mounted stands in for
        its image; `command` for its command), reports it Running, and Ready once ``ready``
        (pod IP) passes, by default once its port answers, as a tcpSocket readiness probe
        would. Returns (sandbox id, container id)."""
        name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
        r = self.api.post(f"/api/v1/namespaces/{self.ns}/pods/{name}/binding", json={
            "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}})  # fmt: skip
        assert r.status_code == 201, r.text
        handler = "runc"
        if rc := pod["spec"].get("runtimeClassName"):
            handler = self.api.get(f"/apis/node.k8s.io/v1/runtimeclasses/{rc}").json()["handler"]
        control = decisions.control_dir(self.root, uid)
        control.mkdir(parents=True)
        # named as the kubelet names it: the agent checks the container's CRI labels
        sandbox, cfg = self.crictl.run_pod(name, handler, pod["metadata"].get("annotations") or {},
                                           namespace=pod["metadata"]["namespace"],
                                           uid=uid)  # fmt: skip
        self.sandboxes.append(sandbox)
        spec_ctr = pod["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in spec_ctr.get("env", []) if "value" in e}
        mounts = (*workloads.mounts(), (str(control), DEFAULT_CONTROL_DIR, False))
        ctr = self.crictl.create(sandbox, cfg, spec_ctr["name"], IMAGE, command, mounts, env)
        self.crictl.run("start", ctr)
        ip = self.crictl.pod_ip(sandbox)
        (ready or (lambda ip: ask(ip, PORT, timeout=120)))(ip)  # the readiness probe
        status = {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{
                "name": spec_ctr["name"], "ready": True, "restartCount": 0, "image": IMAGE,
                "imageID": IMAGE, "containerID": f"containerd://{ctr}",
                "state": {"running": {"startedAt": "2026-12-02T10:00:00Z"}}}],
        }  # fmt: skip
        r = self.api.patch(
            f"/api/v1/namespaces/{self.ns}/pods/{name}/status", json={"status": status},
            headers={"Content-Type": "application/strategic-merge-patch+json"},
        )  # fmt: skip
        assert r.status_code == 200, r.text
        return sandbox, ctr


@pytest.fixture
def kubelet(control_plane, containerd, tmp_path):
    """The kubelet's part, in a namespace of this containerd's own (both containerd versions
    share the API server)."""
    ns = f"flow-{containerd.major}"
    with control_plane.client() as api:
        api.post("/api/v1/namespaces", json={"metadata": {"name": ns}})
        api.post("/apis/node.k8s.io/v1/runtimeclasses", json={
            "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
            "metadata": {"name": "snapshot"}, "handler": "snapshot"})  # fmt: skip
        k = Kubelet(api, Crictl(containerd.address, tmp_path), tmp_path / "kubelet", ns)
        yield k
        for sandbox in k.sandboxes:
            k.crictl.remove_pod(sandbox)


@pytest.fixture
def cluster_signer(control_plane, containerd, kubelet, tmp_path):
    """The signer as the chart runs it, off the node: its own process with the node's
    signing key (the shim verifies with its public half), serving the agent through a
    token bound to an agent pod on NODE. Yields the agent's RemoteSigner."""
    sa, system = "snapshot-agent", f"{kubelet.ns}-system"
    api = kubelet.api
    api.post("/api/v1/namespaces", json={"metadata": {"name": system}})
    api.post(f"/api/v1/namespaces/{system}/serviceaccounts", json={"metadata": {"name": sa}})
    name = f"agent-{uuid.uuid4().hex[:6]}"
    pod = api.post(f"/api/v1/namespaces/{system}/pods", json=bound_pod(name, NODE, sa)).json()
    r = api.post(f"/api/v1/namespaces/{system}/serviceaccounts/{sa}/token", json={
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"audiences": [SIGNER_AUDIENCE], "expirationSeconds": 3600,
                 "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": name,
                                    "uid": pod["metadata"]["uid"]}}})  # fmt: skip
    assert r.status_code == 201, r.text
    token = tmp_path / "agent-token"
    token.write_text(r.json()["status"]["token"])
    with signer_process(tmp_path, control_plane.kubeconfig, containerd.sign_key,
                        f"{system}:{sa}") as signer:  # fmt: skip
        yield RemoteSigner(signer.url, signer.ca, token)
    api.delete(f"/api/v1/namespaces/{system}/pods/{name}", params={"gracePeriodSeconds": 0})


def node_agent(client, containerd, kubelet, **settings) -> Agent:
    """The node's agent: its store and signing key are the node's (the shim checks both)."""
    settings = {"sign_key": containerd.sign_key, **settings}
    return Agent(client, AgentConfig(node=NODE, store=containerd.store, kubelet_root=kubelet.root,
                                     runc=containerd.runc, **settings))  # fmt: skip


def bind_with_status(api, ns: str, name: str, node: str, container_id: str) -> None:
    """What a compromised node can write about its own pod: bound to ``node``, running
    "container" ``container_id``."""
    r = api.post(f"/api/v1/namespaces/{ns}/pods/{name}/binding", json={
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node}})  # fmt: skip
    assert r.status_code == 201, r.text
    status = {"phase": "Running", "containerStatuses": [{
        "name": "main", "ready": True, "restartCount": 0, "image": IMAGE, "imageID": IMAGE,
        "containerID": f"containerd://{container_id}",
        "state": {"running": {"startedAt": "2026-12-02T10:00:00Z"}}}]}  # fmt: skip
    r = api.patch(f"/api/v1/namespaces/{ns}/pods/{name}/status", json={"status": status},
                  headers={"Content-Type": "application/strategic-merge-patch+json"})  # fmt: skip
    assert r.status_code == 200, r.text


async def test_an_agent_checkpoints_only_its_nodes_pods_own_containers(
    control_plane, containerd, kubelet
):
    """Isolation round 2, attack 2: a pod status (written by a node) names another
    tenant's container on this node, and a PodSnapshot of a pod on another node is handed
    to this node (as the admission policy now forbids a node to do; the admin's client
    stands in for the policy's bypass). The agent refuses both, and writes nothing."""
    api, snap_url = kubelet.api, snaps(kubelet.ns)
    victim = api.post(f"/api/v1/namespaces/{kubelet.ns}/pods", json={
        "metadata": {"name": "victim"},
        "spec": {"containers": [{"name": "main", "image": IMAGE}]}}).json()  # fmt: skip
    _, victim_ctr = kubelet.start(victim)
    for name, node in (("forger", NODE), ("elsewhere", "node-b")):
        r = api.post(f"/api/v1/namespaces/{kubelet.ns}/pods", json={
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "main", "image": IMAGE}]}})  # fmt: skip
        assert r.status_code == 201, r.text
        bind_with_status(api, kubelet.ns, name, node, victim_ctr)
        r = api.post(snap_url, json={"apiVersion": "nvidia.com/v1alpha1", "kind": "PodSnapshot",
                                  "metadata": {"name": f"steal-{name}"},
                                  "spec": {"source": {"podRef": {"name": name},
                                                      "containers": ["main"]}}})  # fmt: skip
        assert r.status_code == 201, r.text
    async with await kube.api_client(str(control_plane.kubeconfig)) as client:
        controller = Controller(client)
        await resync(controller)
        await resync(controller)
        r = api.patch(f"{snap_url}/steal-elsewhere/status",
                      headers={"Content-Type": "application/merge-patch+json"},
                      json={"status": {"source": {"nodeName": NODE}}})  # fmt: skip
        assert r.status_code == 200, r.text
        agent = node_agent(client, containerd, kubelet)
        await resync(agent)
        await settle(agent)
    for name, why in (("forger", "sandbox-name 'victim' (want 'forger')"),
                      ("elsewhere", "runs on node 'node-b'")):  # fmt: skip
        snap = api.get(f"{snap_url}/steal-{name}").json()
        failed = next(c for c in snap["status"]["conditions"] if c["type"] == "Failed")
        assert failed["status"] == "True" and why in failed["message"], snap["status"]
        assert "artifact" not in snap["status"]
    assert not list((containerd.store / kubelet.ns).glob("steal-*"))


@pytest.fixture(params=["volume", "oci"])
def storage(request, tmp_path):
    """The agent's settings for an artifact store: the node's volume, or a loopback OCI
    registry (then also the registry, to look into)."""
    if request.param == "volume":
        yield "", {}, None
        return
    if missing := oci_registry.missing():
        pytest.skip(missing)
    with oci_registry.docker_registry(tmp_path / "registry") as reg:
        yield (
            "-oci",
            {
                "oci_repository": OciRef.parse(f"oci://{reg.address}/snapshots/flow"),
                "registry": RegistryAccess(plain_http=frozenset({"127.0.0.1"})),
            },
            reg,
        )


async def test_snapshot_checkpoint_restore_report_delete(
    control_plane, containerd, kubelet, tmp_path, storage, cluster_signer
):
    """With the OCI store, the replica restores on a node whose cache is empty (the source
    node's cached copy is dropped first), and deleting the PodSnapshot deletes the
    registry's copy; the chart's admission policy, rendered for that registry, is in force
    and admits the replica as the webhook writes it (isolation round 2, attack 7). The
    agent holds no key: the signer signs for it, as in the chart (isolation round 3)."""
    sfx, settings, reg = storage
    settings = {**settings, "signer": cluster_signer, "sign_key": None}
    policy = contextlib.nullcontext()
    if reg is not None:
        values = {"storage.type": "oci",
                  "storage.oci.repository": f"oci://{reg.address}/snapshots/flow"}  # fmt: skip
        policy = installed_policy(control_plane, kubelet.ns, values, "-flow", webhook=False)
    with policy:
        await _flow(control_plane, containerd, kubelet, tmp_path, sfx, settings, reg)


async def _flow(control_plane, containerd, kubelet, tmp_path, sfx, settings, reg) -> None:
    api, snap_url = kubelet.api, snaps(kubelet.ns)
    src = api.post(f"/api/v1/namespaces/{kubelet.ns}/pods", json={
        "metadata": {"name": f"src{sfx}"},
        "spec": {"containers": [{"name": "main", "image": IMAGE}]}}).json()  # fmt: skip
    sandbox_a, _ = kubelet.start(src)
    ip_a = kubelet.crictl.pod_ip(sandbox_a)
    for _ in range(3):
        before = ask(ip_a, PORT, timeout=30)
    assert before["count"] == "4"  # the readiness probe's request, then ours

    r = api.post(snap_url, json={"apiVersion": "nvidia.com/v1alpha1", "kind": "PodSnapshot",
                              "metadata": {"name": f"warm{sfx}"},
                              "spec": {"source": {"podRef": {"name": f"src{sfx}"},
                                                  "containers": ["main"]}}})  # fmt: skip
    assert r.status_code == 201, r.text

    store = containerd.store
    async with await kube.api_client(str(control_plane.kubeconfig)) as client:
        controller = Controller(client)
        agent = node_agent(client, containerd, kubelet, **settings)
        await resync(controller)
        await resync(controller)
        pending = conditions(api.get(f"{snap_url}/warm{sfx}").json())["Ready"]
        assert pending == ("False", "CheckpointPending")
        await resync(agent)
        await settle(agent)
        snap = api.get(f"{snap_url}/warm{sfx}").json()
        assert conditions(snap)["Ready"] == ("True", "Captured"), snap["status"]
        artifact = snap["status"]["artifact"]
        if reg is None:
            assert artifact["uri"].startswith(f"file://{store}/{kubelet.ns}/warm-")
        else:
            assert artifact["uri"].startswith(f"oci://{reg.address}/snapshots/flow:")
            assert OciRef.parse(artifact["uri"]).digest
            agent.cache.remove(artifact["manifestDigest"])  # as on another node
        assert artifact["manifestDigest"].startswith("sha256:") and artifact["sizeBytes"] > 0
        assert snap["status"]["source"]["nodeName"] == NODE
        assert snap["status"]["source"]["criuVersion"]
        assert snap["status"]["checkpointSeconds"] > 0

        # a replica that asks for the snapshot is rewritten by the webhook ...
        with (
            webhook_process(tmp_path, control_plane.kubeconfig) as w,
            chart_webhook_registered(control_plane, w, "snapshot-flow"),
        ):
            r = api.post(f"/api/v1/namespaces/{kubelet.ns}/pods", json={
                "metadata": {"name": f"replica{sfx}",
                             "annotations": {ann.RESTORE_FROM: f"warm{sfx}"}},
                "spec": {"containers": [{"name": "main", "image": IMAGE}]}})  # fmt: skip
        assert r.status_code == 201, r.text
        replica = r.json()
        assert replica["spec"]["runtimeClassName"] == "snapshot"
        assert replica["metadata"]["annotations"][ann.MANIFEST_DIGEST] == artifact["manifestDigest"]

        # ... comes up restored, with the source's memory, on its own IP ...
        sandbox_b, _ = kubelet.start(replica)
        ip_b = kubelet.crictl.pod_ip(sandbox_b)
        assert ip_b != ip_a
        after = ask(ip_b, PORT, timeout=30)
        # A's count carried over: +1 for B's readiness probe, +1 for this request
        assert after["count"] == "6" and after["digest"] == before["digest"]
        assert after["addr"] == f"{ip_b}:{PORT}"

        # ... and the agent reports how the restore went.
        await resync(agent)
        stored = api.get(f"/api/v1/namespaces/{kubelet.ns}/pods/replica{sfx}").json()
        restored = next(c for c in stored["status"]["conditions"]
                        if c["type"] == ann.RESTORED_CONDITION)  # fmt: skip
        assert (restored["status"], restored["reason"]) == ("True", "RestoreSucceeded")
        assert "criu" in restored["message"]
        assert ("pull" in restored["message"]) is (reg is not None)
        sample = agent.metrics.registry.get_sample_value
        assert sample("snapshot_agent_checkpoints_total", {"result": "captured"}) == 1
        assert sample("snapshot_agent_restores_reported_total", {"outcome": "restored"}) == 1
        assert sample("snapshot_agent_restore_seconds_count", {"outcome": "restored"}) == 1
        assert 0 < sample("snapshot_agent_restore_seconds_sum", {"outcome": "restored"}) < 300
        assert sample("snapshot_agent_artifact_bytes_total") == artifact["sizeBytes"]
        events = api.get(f"/api/v1/namespaces/{kubelet.ns}/events").json()["items"]
        reasons = {(e["involvedObject"]["name"], e["reason"]) for e in events}
        assert {(f"warm{sfx}", "Captured"), (f"replica{sfx}", "RestoreSucceeded")} <= reasons

        if reg is not None:  # an agent that pre-pulls warms another node's cache
            agent.cache.remove(artifact["manifestDigest"])
            other = Agent(client, AgentConfig(node="node-other", store=containerd.store,
                                              pre_pull=True, **settings))  # fmt: skip
            await resync(other)
            await settle(other)
            assert agent.cache.entry(artifact["manifestDigest"]).is_dir()
            assert other.metrics.registry.get_sample_value(
                "snapshot_agent_pre_pulls_total", {"result": "pulled"}) == 1  # fmt: skip

        # Deleting the PodSnapshot deletes its artifact, then the object.
        artifact_dir = artifact["uri"].removeprefix("file://")
        assert api.delete(f"{snap_url}/warm{sfx}").status_code == 200
        await resync(controller)
        await resync(agent)
        assert api.get(f"{snap_url}/warm{sfx}").status_code == 404
        if reg is None:
            assert not Path(artifact_dir).exists()
        else:
            ref = OciRef.parse(artifact["uri"])
            with pytest.raises(OciError, match="404"):
                oci.pull(ref, tmp_path / "gone", agent.cfg.registry, max_bytes=1 << 30)
            assert not agent.cache.entry(artifact["manifestDigest"]).exists()


def example(path: str) -> dict:
    return yaml.safe_load((ROOT / "examples" / path).read_text())


async def test_cpu_example_snapshot_job_to_restored_replica(
    control_plane, containerd, kubelet, tmp_path
):
    """examples/cpu_demo/k8s as a user would apply it: the SnapshotJob captures the
    scikit-learn server once it serves, and a pod from the Deployment's template comes up
    restored, answering with the source's predictions."""
    api, snap_url = kubelet.api, snaps(kubelet.ns)
    demo = workloads.command(["-m", "examples.cpu_demo.workload"], PORT, "digits")
    jobs = f"/apis/nvidia.com/v1alpha1/namespaces/{kubelet.ns}/snapshotjobs"
    r = api.post(jobs, json=example("cpu_demo/k8s/snapshotjob.yaml"))
    assert r.status_code == 201, r.text
    async with await kube.api_client(str(control_plane.kubeconfig)) as client:
        controller = Controller(client)
        agent = node_agent(client, containerd, kubelet)
        await resync(controller)  # creates the source pod
        source = api.get(f"/api/v1/namespaces/{kubelet.ns}/pods/cpu-demo-source").json()
        sandbox, _ = kubelet.start(source, demo)
        reference = ask(kubelet.crictl.pod_ip(sandbox), PORT)["digest"]
        await resync(controller)  # the source is Ready: creates the PodSnapshot
        await resync(controller)  # hands it to the node
        await resync(agent)  # quiesce handshake with the workload, then the dump
        await settle(agent)
        await resync(controller)  # Captured: completes the job
        job = api.get(
            f"/apis/nvidia.com/v1alpha1/namespaces/{kubelet.ns}/snapshotjobs/cpu-demo"
        ).json()
        assert conditions(job)["Completed"] == ("True", "Completed"), job["status"]
        assert conditions(api.get(f"{snap_url}/cpu-demo").json())["Ready"] == (
            "True",
            "Captured",
        )

        template = example("cpu_demo/k8s/deployment.yaml")["spec"]["template"]
        replica = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {**template["metadata"], "name": "cpu-demo-replica"},
                   "spec": template["spec"]}  # fmt: skip
        with (
            webhook_process(tmp_path, control_plane.kubeconfig) as w,
            chart_webhook_registered(control_plane, w, "snapshot-cpu-example"),
        ):
            r = api.post(f"/api/v1/namespaces/{kubelet.ns}/pods", json=replica)
        assert r.status_code == 201, r.text
        assert r.json()["spec"]["runtimeClassName"] == "snapshot"
        sandbox_b, _ = kubelet.start(r.json(), demo)
        assert ask(kubelet.crictl.pod_ip(sandbox_b), PORT)["digest"] == reference
        await resync(agent)
        stored = api.get(f"/api/v1/namespaces/{kubelet.ns}/pods/cpu-demo-replica").json()
        restored = next(c for c in stored["status"]["conditions"]
                        if c["type"] == ann.RESTORED_CONDITION)  # fmt: skip
        assert (restored["status"], restored["reason"]) == ("True", "RestoreSucceeded")


def generate(ip: str, timeout: float = 120.0) -> dict:
    return get_json(ip, PORT, timeout=timeout)


async def test_a_stock_vllm_sleeps_for_its_checkpoint_and_wakes_restored_with_no_adapter(
    control_plane, containerd, kubelet, tmp_path
):
    """Issue 22: a PodSnapshot with ``quiesce.engine: vllm``. The pod runs the engine alone
    (a stand-in for vLLM's server, not vLLM: nothing of ours, no adapter, no handshake). The
    agent puts it to sleep through its API on the pod's loopback and checkpoints it; the
    replica's shim wakes it the same way once restored, and the restore reports the wake."""
    api, ns = kubelet.api, kubelet.ns
    src = api.post(f"/api/v1/namespaces/{ns}/pods", json={
        "metadata": {"name": "vllm-src"},
        "spec": {"containers": [{"name": "main", "image": IMAGE}]}}).json()  # fmt: skip
    sandbox_a, _ = kubelet.start(src, STANDIN_VLLM, ready=generate)
    before = generate(kubelet.crictl.pod_ip(sandbox_a))
    spec = {
        "source": {"podRef": {"name": "vllm-src"}, "containers": ["main"]},
        "quiesce": {"engine": "vllm", "port": PORT},
    }
    r = api.post(snaps(ns), json={"apiVersion": "nvidia.com/v1alpha1", "kind": "PodSnapshot",
                                  "metadata": {"name": "vllm-warm"}, "spec": spec})  # fmt: skip
    assert r.status_code == 201, r.text
    async with await kube.api_client(str(control_plane.kubeconfig)) as client:
        controller, agent = Controller(client), node_agent(client, containerd, kubelet)
        await resync(controller)
        await resync(controller)
        await resync(agent)
        await settle(agent)
        snap = api.get(f"{snaps(ns)}/vllm-warm").json()
        assert conditions(snap)["Ready"] == ("True", "Captured"), snap["status"]
        with (
            webhook_process(tmp_path, control_plane.kubeconfig) as w,
            chart_webhook_registered(control_plane, w, "snapshot-vllm"),
        ):
            replica = api.post(f"/api/v1/namespaces/{ns}/pods", json={
                "metadata": {"name": "vllm-replica",
                             "annotations": {ann.RESTORE_FROM: "vllm-warm"}},
                "spec": {"containers": [{"name": "main", "image": IMAGE}]}}).json()  # fmt: skip
        sandbox_b, _ = kubelet.start(replica, STANDIN_VLLM, ready=generate)
        after = generate(kubelet.crictl.pod_ip(sandbox_b))
        # awake (it serves), with the source's memory: the count carried over
        assert after["digest"] == before["digest"] and after["count"] > before["count"]
        await resync(agent)
        stored = api.get(f"/api/v1/namespaces/{ns}/pods/vllm-replica").json()
        restored = next(c for c in stored["status"]["conditions"]
                        if c["type"] == ann.RESTORED_CONDITION)  # fmt: skip
        assert (restored["status"], restored["reason"]) == ("True", "RestoreSucceeded")
        assert "wake" in restored["message"], restored["message"]
