"""The agent's writes stay on its node: the chart's agent RBAC (which cannot name a node) plus
its ValidatingAdmissionPolicy (which can: the node a pod-bound service-account token carries),
in a real kube-apiserver, with a real token bound to an agent pod on node-a.

Cases: the agent patches the status of a pod on node-a (allowed) and on node-b (denied); it
patches a PodSnapshot handed to node-a (allowed) and one handed to node-b (denied); a token
not bound to a pod is denied outright."""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from devnode import chart, wait_until
from tests.controller.objects import bound_pod
from tests.helpers import client_as

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(chart.missing() is not None, reason=chart.missing() or ""),
]
SYSTEM, NS = "snapshot-system", "agent-policy"
AGENT = "snap-snapshot-agent"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
SNAPS = f"/apis/nvidia.com/v1alpha1/namespaces/{NS}/podsnapshots"
MERGE = {"Content-Type": "application/merge-patch+json"}
STRATEGIC = {"Content-Type": "application/strategic-merge-patch+json"}
CHANGED = "2026-12-03T00:00:00Z"


def _install(admin, policy: str, account: str) -> list[tuple[str, dict]]:
    """The chart's ValidatingAdmissionPolicy ``policy`` and its binding, and service account
    ``account`` in SYSTEM with the chart's ClusterRole and binding of that name, created in
    the API server; returns what to delete afterwards (the service account aside)."""
    objs = {(o["kind"], o["metadata"]["name"]): o for o in chart.render()}
    created = [
        (f"{ADMISSION}/validatingadmissionpolicies", objs[("ValidatingAdmissionPolicy", policy)]),
        (f"{ADMISSION}/validatingadmissionpolicybindings",
         objs[("ValidatingAdmissionPolicyBinding", policy)]),
        (f"{RBAC}/clusterroles", objs[("ClusterRole", account)]),
        (f"{RBAC}/clusterrolebindings", objs[("ClusterRoleBinding", account)]),
    ]  # fmt: skip
    admin.post(f"/api/v1/namespaces/{SYSTEM}/serviceaccounts",
               json={"metadata": {"name": account}})  # fmt: skip
    for path, obj in created:
        r = admin.post(path, json=obj)
        assert r.status_code in (201, 409), r.text
    return created


@pytest.fixture(scope="module")
def agent_client(control_plane):
    """(admin client, a client authenticated as node-a's agent, a client with an unbound
    token of the same service account)."""
    with control_plane.client() as admin:
        for ns in (SYSTEM, NS):
            admin.post("/api/v1/namespaces", json={"metadata": {"name": ns}})
        created = _install(admin, "snap-snapshot-agent-node", AGENT)
        agent_pod = admin.post(f"/api/v1/namespaces/{SYSTEM}/pods",
                               json=bound_pod("agent-a", "node-a", AGENT)).json()  # fmt: skip
        for name, node in (("mine", "node-a"), ("theirs", "node-b")):
            admin.post(f"/api/v1/namespaces/{NS}/pods", json=bound_pod(name, node))
            spec = {"source": {"podRef": {"name": name}, "containers": ["main"]}}
            admin.post(SNAPS, json={"apiVersion": "nvidia.com/v1alpha1", "kind": "PodSnapshot",
                                    "metadata": {"name": name}, "spec": spec})  # fmt: skip
            r = admin.patch(f"{SNAPS}/{name}/status", headers=MERGE,
                            json={"status": {"source": {"nodeName": node}}})  # fmt: skip
            assert r.status_code == 200, r.text

        def token(bound: bool) -> str:
            spec: dict = {"expirationSeconds": 600}
            if bound:
                spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": "agent-a",
                                          "uid": agent_pod["metadata"]["uid"]}  # fmt: skip
            r = admin.post(f"/api/v1/namespaces/{SYSTEM}/serviceaccounts/{AGENT}/token",
                           json={"apiVersion": "authentication.k8s.io/v1",
                                 "kind": "TokenRequest", "spec": spec})  # fmt: skip
            assert r.status_code == 201, r.text
            return r.json()["status"]["token"]

        bound, unbound = control_plane.client(), control_plane.client()
        bound.headers["Authorization"] = f"Bearer {token(True)}"
        unbound.headers["Authorization"] = f"Bearer {token(False)}"
        _wait_until_enforced(bound)
        yield admin, bound, unbound
        bound.close()
        unbound.close()
        for path, obj in created:
            admin.delete(f"{path}/{obj['metadata']['name']}")
        # the chart test dry-runs the same names in this API server
        admin.delete(f"/api/v1/namespaces/{SYSTEM}/pods/agent-a", params={"gracePeriodSeconds": 0})
        admin.delete(f"/api/v1/namespaces/{SYSTEM}/serviceaccounts/{AGENT}")


def _wait_until_enforced(agent) -> None:
    wait_until(lambda: patch_pod_status(agent, "theirs").status_code == 403,
               what="the agent's node policy", poll=0.5)  # fmt: skip


def patch_pod_status(client, name: str):
    cond = {"type": "nvidia.com/Restored", "status": "True", "reason": "RestoreSucceeded",
            "message": "", "lastTransitionTime": CHANGED}  # fmt: skip
    return client.patch(f"/api/v1/namespaces/{NS}/pods/{name}/status",
                        json={"status": {"conditions": [cond]}}, headers=STRATEGIC)  # fmt: skip


def patch_snapshot_status(client, name: str):
    cond = {"type": "Ready", "status": "False", "reason": "Checkpointing", "message": "",
            "lastTransitionTime": CHANGED}  # fmt: skip
    return client.patch(f"{SNAPS}/{name}/status", headers=MERGE,
                        json={"status": {"conditions": [cond]}})  # fmt: skip


def test_the_agent_writes_pods_of_its_node_only(agent_client):
    _, agent, _ = agent_client
    assert patch_pod_status(agent, "mine").status_code == 200
    r = patch_pod_status(agent, "theirs")
    assert r.status_code == 403 and "its own pods only" in r.json()["message"]


def test_the_agent_writes_podsnapshots_of_its_node_only(agent_client):
    _, agent, _ = agent_client
    assert patch_snapshot_status(agent, "mine").status_code == 200
    r = patch_snapshot_status(agent, "theirs")
    assert r.status_code == 403 and "handed to its node only" in r.json()["message"]


def test_a_token_not_bound_to_a_node_is_refused(agent_client):
    _, _, unbound = agent_client
    r = patch_pod_status(unbound, "mine")
    assert r.status_code == 403 and "not bound to a node" in r.json()["message"]


def test_the_agent_cannot_hand_a_podsnapshot_to_another_node(agent_client):
    """Attack 2 of isolation round 2: node-a's agent redirects its PodSnapshot to node-b,
    whose agent would then checkpoint what node-a's forged pod status points at."""
    admin, agent, _ = agent_client
    r = agent.patch(f"{SNAPS}/mine/status", headers=MERGE,
                    json={"status": {"source": {"nodeName": "node-b"}}})  # fmt: skip
    assert r.status_code == 403 and "another node" in r.json()["message"], r.text
    assert admin.get(f"{SNAPS}/mine").json()["status"]["source"]["nodeName"] == "node-a"


def _handed_to_node_a(admin, name: str, status: dict) -> None:
    spec = {"source": {"podRef": {"name": "mine"}, "containers": ["main"]}}
    r = admin.post(SNAPS, json={"apiVersion": "nvidia.com/v1alpha1", "kind": "PodSnapshot",
                                "metadata": {"name": name, "finalizers": ["x.example/keep"]},
                                "spec": spec})  # fmt: skip
    assert r.status_code == 201, r.text
    r = admin.patch(f"{SNAPS}/{name}/status", headers=MERGE,
                    json={"status": {"source": {"nodeName": "node-a"}, **status}})  # fmt: skip
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("finished", ["Captured", "Failed"])
def test_a_finished_podsnapshot_is_final_for_the_agent(agent_client, finished):
    """Isolation round 3, attack 1: root on node-a, with its agent's token, patched a
    Captured (or Failed) PodSnapshot back to Ready=False/Checkpointing, and the signer then
    signed any manifest for it. The agent-node policy now refuses any change to a finished
    PodSnapshot's status; the cluster admin still may."""
    admin, agent, _ = agent_client
    name = f"done-{finished.lower()}"
    if finished == "Captured":
        conds = [{"type": "Ready", "status": "True", "reason": "Captured", "message": "1 GB",
                  "lastTransitionTime": CHANGED}]  # fmt: skip
        extra = {"artifact": {"uri": "file:///var/lib/snapshot/x", "sizeBytes": 1,
                              "manifestDigest": "sha256:" + "a" * 64}}  # fmt: skip
    else:
        conds = [{"type": "Ready", "status": "False", "reason": "CheckpointFailed",
                  "message": "", "lastTransitionTime": CHANGED},
                 {"type": "Failed", "status": "True", "reason": "CheckpointFailed",
                  "message": "boom", "lastTransitionTime": CHANGED}]  # fmt: skip
        extra = {}
    _handed_to_node_a(admin, name, {"conditions": conds, **extra})
    r = patch_snapshot_status(agent, name)
    assert r.status_code == 403 and "is finished" in r.json()["message"], r.text
    forged = {"uri": "file:///elsewhere", "sizeBytes": 2, "manifestDigest": "sha256:" + "b" * 64}
    r = agent.patch(f"{SNAPS}/{name}/status", headers=MERGE,
                    json={"status": {"artifact": forged}})  # fmt: skip
    assert r.status_code == 403 and "is finished" in r.json()["message"], r.text
    stored = admin.get(f"{SNAPS}/{name}").json()["status"]
    assert stored["conditions"] == conds
    # the agent still drops its finalizer (metadata, not status) when it deletes an artifact
    r = agent.patch(f"{SNAPS}/{name}", headers=MERGE, json={"metadata": {"finalizers": None}})
    assert r.status_code == 200, r.text


def test_the_agent_cannot_change_what_a_podsnapshot_captures(agent_client):
    """By reading (isolation round 3): the agent's RBAC may patch the main resource (for its
    finalizer), so its node could try to rewrite a PodSnapshot's spec (its source pod,
    keepSourceRunning). The CRD's own rule keeps the spec immutable, for everyone."""
    admin, agent, _ = agent_client
    _handed_to_node_a(admin, "spec-kept", {})
    r = agent.patch(f"{SNAPS}/spec-kept", headers=MERGE,
                    json={"spec": {"keepSourceRunning": True}})  # fmt: skip
    assert r.status_code == 422 and "spec is immutable" in r.json()["message"], r.text
    assert not admin.get(f"{SNAPS}/spec-kept").json()["spec"].get("keepSourceRunning")


@pytest.mark.parametrize(
    "metadata",
    [
        {"labels": {"team": "node-a"}},
        {"annotations": {"note": "x"}},
        {"finalizers": ["x.example/keep", "node-a.example/block"]},
    ],
)
def test_the_agent_only_removes_finalizers(agent_client, metadata):
    """By reading (isolation round 3): the agent's RBAC may patch the main resource for its
    finalizer, so its node could add finalizers (blocking deletion), labels or annotations
    to the PodSnapshots handed to it. The agent-node policy lets it remove finalizers only
    (test_a_finished_podsnapshot_is_final_for_the_agent removes one)."""
    admin, agent, _ = agent_client
    name = f"meta-{next(iter(metadata))}"
    _handed_to_node_a(admin, name, {})
    r = agent.patch(f"{SNAPS}/{name}", headers=MERGE, json={"metadata": metadata})
    assert r.status_code == 403 and "may only remove finalizers" in r.text, r.text
    assert admin.get(f"{SNAPS}/{name}").json()["metadata"]["finalizers"] == ["x.example/keep"]


CONTROLLER = "snap-snapshot-controller"


@pytest.fixture(scope="module")
def controller_client(control_plane, agent_client):
    """(admin, a client with the controller's service-account token), under the chart's
    controller RBAC and its controller-writes policy."""
    admin = agent_client[0]
    created = _install(admin, "snap-snapshot-controller-writes", CONTROLLER)
    controller = client_as(control_plane, admin, SYSTEM, CONTROLLER)
    _handed_to_node_a(admin, "handed", {})

    def enforced() -> bool:  # a dry run: a probe let through before the policy changes nothing
        r = controller.patch(f"{SNAPS}/handed/status", headers=MERGE, params={"dryRun": "All"},
                             json={"status": {"source": {"nodeName": "node-b"}}})  # fmt: skip
        return r.status_code == 403

    wait_until(enforced, what="the controller-writes policy", poll=0.5)
    yield admin, controller
    controller.close()
    for path, obj in created:
        admin.delete(f"{path}/{obj['metadata']['name']}")
    # the chart test creates the same names in this API server
    admin.delete(f"/api/v1/namespaces/{SYSTEM}/serviceaccounts/{CONTROLLER}")


def test_the_controller_hands_a_podsnapshot_over_once_and_writes_nothing_of_the_agents(
    controller_client,
):
    """Isolation round 3, attack 2 (what the controller may write): its token may patch
    any PodSnapshot's status, and status.source.nodeName is what the signer trusts. The
    controller-writes policy keeps it to its own part: waiting, failing an invalid source,
    handing a PodSnapshot to a node once. It cannot re-hand one, write an artifact or the
    agent's reasons, or change a finished one."""
    admin, controller = controller_client
    spec = {"source": {"podRef": {"name": "mine"}, "containers": ["main"]}}
    r = admin.post(SNAPS, json={"apiVersion": "nvidia.com/v1alpha1", "kind": "PodSnapshot",
                                "metadata": {"name": "fresh"}, "spec": spec})  # fmt: skip
    assert r.status_code == 201, r.text
    pending = {"type": "Ready", "status": "False", "reason": "CheckpointPending", "message": "",
               "lastTransitionTime": CHANGED}  # fmt: skip
    r = controller.patch(f"{SNAPS}/fresh/status", headers=MERGE, json={
        "status": {"source": {"nodeName": "node-a"}, "conditions": [pending]}})  # fmt: skip
    assert r.status_code == 200, r.text
    refused = [
        ({"source": {"nodeName": "node-b"}}, "never handed to another"),
        ({"artifact": {"uri": "file:///x", "sizeBytes": 1, "manifestDigest": "sha256:" + "c" * 64}},
         "the artifact is the node agent's"),
        ({"conditions": [{**pending, "reason": "Checkpointing"}]}, "the node agent's to write"),
    ]  # fmt: skip
    for status, why in refused:
        r = controller.patch(f"{SNAPS}/fresh/status", headers=MERGE, json={"status": status})
        assert r.status_code == 403 and why in r.json()["message"], (status, r.text)
    captured = [{"type": "Ready", "status": "True", "reason": "Captured", "message": "",
                 "lastTransitionTime": CHANGED}]  # fmt: skip
    _handed_to_node_a(admin, "done-ctl", {"conditions": captured})
    r = controller.patch(f"{SNAPS}/done-ctl/status", headers=MERGE,
                         json={"status": {"conditions": [pending]}})  # fmt: skip
    assert r.status_code == 403 and "is final" in r.json()["message"], r.text


# ---- the node's readiness label (nodes issue) ------------------------------------------------

READY = "snapshot.nvidia.com/ready"


@pytest.fixture(scope="module")
def nodes(agent_client):
    admin = agent_client[0]
    for name in ("node-a", "node-b"):
        r = admin.post("/api/v1/nodes", json={"metadata": {"name": name,
                                                           "labels": {"zone": "z1"}}})  # fmt: skip
        assert r.status_code in (201, 409), r.text
    yield admin
    for name in ("node-a", "node-b"):
        admin.delete(f"/api/v1/nodes/{name}")


def label(client, node: str, labels: dict, annotations: dict | None = None):
    meta: dict = {"labels": labels}
    if annotations:
        meta["annotations"] = annotations
    return client.patch(f"/api/v1/nodes/{node}", json={"metadata": meta}, headers=STRATEGIC)


def test_the_agent_labels_its_own_node_ready_and_nothing_else(agent_client, nodes):
    """The agent's RBAC may patch nodes (to say its node runs restore pods); the agent-node
    policy keeps that to one label, set to "true" or removed, on its own node. Refused: the
    label on another node, another label, another value, an annotation."""
    _, agent, _ = agent_client
    r = label(agent, "node-a", {READY: "true"})
    assert r.status_code == 200, r.text
    assert nodes.get("/api/v1/nodes/node-a").json()["metadata"]["labels"][READY] == "true"
    for node, labels, notes in (("node-b", {READY: "true"}, None),
                                      ("node-a", {"zone": "z2"}, None),
                                      ("node-a", {"nvidia.com/gpu.present": "true"}, None),
                                      ("node-a", {READY: "yes"}, None),
                                      ("node-a", {}, {"note": "x"})):  # fmt: skip
        r = label(agent, node, labels, notes)
        assert r.status_code == 403 and "may only set or remove the label" in r.text, (node, r.text)
    assert nodes.get("/api/v1/nodes/node-a").json()["metadata"]["labels"] == {
        "zone": "z1", READY: "true"}  # fmt: skip
    r = label(agent, "node-a", {READY: None})
    assert r.status_code == 200, r.text
    assert READY not in nodes.get("/api/v1/nodes/node-a").json()["metadata"]["labels"]


async def test_the_label_goes_only_when_the_agents_daemonset_is_gone(control_plane, nodes):
    """agent/node_ready.py against a real API server: at the agent's stop the label stays
    while its DaemonSet exists (a restart, a rolling update), and goes once it is deleted
    (helm uninstall)."""
    from agent import node_ready
    from kubeclient import api as kube

    ds = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent-ds"},
          "spec": {"selector": {"matchLabels": {"app": "a"}}, "template": {
              "metadata": {"labels": {"app": "a"}},
              "spec": {"containers": [{"name": "a", "image": "img:1"}]}}}}  # fmt: skip
    path = f"/apis/apps/v1/namespaces/{SYSTEM}/daemonsets"
    assert nodes.post(path, json=ds).status_code in (201, 409)
    async with await kube.api_client(str(control_plane.kubeconfig)) as api:
        await node_ready.mark(api, "node-b", True)
        assert not await node_ready.unmark_if_uninstalled(api, "node-b", SYSTEM, "agent-ds")
        assert nodes.get("/api/v1/nodes/node-b").json()["metadata"]["labels"][READY] == "true"
        nodes.delete(f"{path}/agent-ds")
        wait_until(lambda: nodes.get(f"{path}/agent-ds").status_code == 404, what="deleted")
        assert await node_ready.unmark_if_uninstalled(api, "node-b", SYSTEM, "agent-ds")
    assert READY not in nodes.get("/api/v1/nodes/node-b").json()["metadata"]["labels"]


async def test_a_node_running_the_control_plane_is_not_made_ready(control_plane, nodes):
    """Isolation: restore pods run tenants' code, so the agent leaves a node unlabelled while
    the signer (or the webhook, or the controller) of its release runs there, and says why
    in an Event on the node; another node is made ready. Against a real API server, with the
    selector the chart passes.

    Isolation round 4, attack 4: a tenant's pod wearing the same labels in its own namespace
    blocks nothing (only the release's namespace is looked at); and the agent checks again
    while it runs, so the label comes back once the signer has left the node."""
    from agent import node_ready
    from kubeclient import api as kube

    selector = (
        "app.kubernetes.io/instance=snap,app.kubernetes.io/component in (signer,webhook,controller)"
    )
    labels = {"app.kubernetes.io/instance": "snap", "app.kubernetes.io/component": "signer"}

    def pod(name: str, node: str) -> dict:
        spec = {"nodeName": node, "containers": [{"name": "s", "image": "i:1"}]}
        return {"metadata": {"name": name, "labels": labels}, "spec": spec}

    path, tenant = f"/api/v1/namespaces/{SYSTEM}/pods", f"/api/v1/namespaces/{NS}/pods"
    assert nodes.post(path, json=pod("snap-signer-0", "node-a")).status_code in (201, 409)
    assert nodes.post(tenant, json=pod("wears-the-labels", "node-b")).status_code in (201, 409)
    try:
        async with await kube.api_client(str(control_plane.kubeconfig)) as api:
            await node_ready.mark(api, "node-a", False)
            assert await node_ready.mark_ready(api, "node-a", SYSTEM, selector) == [
                f"{SYSTEM}/snap-signer-0"]  # fmt: skip
            assert await node_ready.mark_ready(api, "node-b", SYSTEM, selector) == []
            assert READY not in nodes.get("/api/v1/nodes/node-a").json()["metadata"]["labels"]
            assert nodes.get("/api/v1/nodes/node-b").json()["metadata"]["labels"][READY] == "true"
            about_a = {"fieldSelector": "involvedObject.name=node-a"}
            events = nodes.get("/api/v1/namespaces/default/events", params=about_a).json()
            assert any(e["reason"] == "SnapshotNodeNotReady" and "snap-signer-0" in e["message"]
                       for e in events["items"]), events  # fmt: skip
            # the signer leaves node-a while the agent runs: the label follows
            keeping = asyncio.create_task(
                node_ready.keep_marked(api, "node-a", SYSTEM, selector, every_s=0.2)
            )
            try:
                nodes.delete(f"{path}/snap-signer-0", params={"gracePeriodSeconds": 0})

                def labelled() -> bool:
                    got = nodes.get("/api/v1/nodes/node-a").json()["metadata"]["labels"]
                    return got.get(READY) == "true"

                await asyncio.to_thread(wait_until, labelled, what="node-a ready again")
            finally:
                keeping.cancel()
    finally:
        nodes.delete(f"{path}/snap-signer-0", params={"gracePeriodSeconds": 0})
        nodes.delete(f"{tenant}/wears-the-labels", params={"gracePeriodSeconds": 0})


@pytest.mark.root
def test_a_node_failing_a_prerequisite_loses_the_label_and_says_why(
    control_plane, nodes, tmp_path, monkeypatch
):
    """install-node (the agent's init container) on a node whose bundle cannot run: its
    prefix is on a noexec mount. The label an earlier install left goes, nothing is
    registered, and the node carries an Event that names the reason, against a real API
    server; the agent never starts there, so nothing labels it again."""
    from agent import cli

    assert label(nodes, "node-a", {READY: "true"}).status_code == 200
    prefix = tmp_path / "opt"
    prefix.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "noexec", "tmpfs", str(prefix)], check=True)
    config = tmp_path / "config.toml"
    config.write_text("version = 2\n")
    monkeypatch.setenv("KUBECONFIG", str(control_plane.kubeconfig))
    try:
        rc = cli.main(["install-node", "--host-root=/", f"--prefix={prefix}", "--node=node-a",
                       f"--bin-dir={tmp_path / 'bin'}", f"--containerd-config={config}",
                       "--no-signing-required"])  # fmt: skip
    finally:
        subprocess.run(["umount", str(prefix)], check=True)
    assert rc != 0 and config.read_text() == "version = 2\n"
    assert READY not in nodes.get("/api/v1/nodes/node-a").json()["metadata"]["labels"]
    about_a = {"fieldSelector": "involvedObject.name=node-a"}
    events = nodes.get("/api/v1/namespaces/default/events", params=about_a).json()["items"]
    assert any(e["reason"] == "SnapshotNodeNotReady"
               and "the node bundle does not run on this host" in e["message"]
               for e in events), [e["message"] for e in events]  # fmt: skip


async def test_the_readiness_recheck_ends_each_check_when_the_api_server_hangs(
    control_plane, tmp_path, caplog
):
    """keep_marked against an API server that accepts and never answers: each check ends at
    its deadline and the loop asks again, the label left as it is."""
    import logging

    from agent import node_ready
    from kubeclient import api as kube
    from tests.helpers import hung_api_server

    with hung_api_server(control_plane.kubeconfig, tmp_path / "kubeconfig") as kubeconfig:
        async with await kube.api_client(str(kubeconfig)) as api:
            with caplog.at_level(logging.WARNING, logger="snapshot.agent"):
                task = asyncio.create_task(node_ready.keep_marked(
                    api, "node-a", SYSTEM, "a=b", every_s=0.05, deadline_s=0.3))  # fmt: skip
                await asyncio.sleep(2.0)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
    checks = [r for r in caplog.records if "cannot check what runs beside" in r.message]
    assert len(checks) >= 2, "a check never ended: the loop hangs with the API server"
