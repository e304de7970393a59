"""The controller against a real kube-apiserver + etcd: it reads and writes real objects and
the assertions are what the API server stores.

Nothing runs pods here (no kubelet, no scheduler), so the tests play those parts through the
API exactly as they would: binding a pod to a node through pods/binding, and writing the pod
status through pods/status. Those are stand-ins for a kubelet, not for the code under test."""

from __future__ import annotations

import pytest

from api.crd import ARTIFACT_FINALIZER, JOB_LABEL
from controller.loop import Controller
from kubeclient import api as kube
from tests.controller.objects import conditions
from tests.kube_support import resync

pytestmark = pytest.mark.slow
GROUP = "/apis/nvidia.com/v1alpha1"
MAIN = [{"name": "main", "image": "img:1"}]


@pytest.fixture
async def controller(control_plane):
    async with await kube.api_client(str(control_plane.kubeconfig)) as api:
        yield Controller(api)


def kubelet_runs(c, ns: str, pod: str, node: str = "node-a", ready: bool = True) -> None:
    """What the scheduler and the kubelet would write for a pod that started."""
    r = c.post(
        f"/api/v1/namespaces/{ns}/pods/{pod}/binding",
        json={
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        },
    )
    assert r.status_code == 201, r.text
    status = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        "containerStatuses": [
            {
                "name": "main",
                "ready": ready,
                "restartCount": 0,
                "image": "img:1",
                "imageID": "img@sha256:" + "e" * 64,
                "containerID": "containerd://abc",
                "state": {"running": {"startedAt": "2026-12-02T10:00:00Z"}},
            }
        ],
    }
    r = c.patch(
        f"/api/v1/namespaces/{ns}/pods/{pod}/status",
        json={"status": status},
        headers={"Content-Type": "application/strategic-merge-patch+json"},
    )
    assert r.status_code == 200, r.text


def create(c, ns: str, plural: str, body: dict) -> dict:
    r = c.post(f"{GROUP}/namespaces/{ns}/{plural}", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def snapshot_body(name: str, pod: str = "src") -> dict:
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "PodSnapshot",
        "metadata": {"name": name},
        "spec": {"source": {"podRef": {"name": pod}, "containers": ["main"]}},
    }


async def test_pod_snapshot_is_handed_to_the_source_node(control_plane, controller, ns):
    with control_plane.client() as c:
        body = {"metadata": {"name": "src"}, "spec": {"containers": MAIN}}
        r = c.post(f"/api/v1/namespaces/{ns}/pods", json=body)
        assert r.status_code == 201
        kubelet_runs(c, ns, "src")
        create(c, ns, "podsnapshots", snapshot_body("snap"))
        await resync(controller)  # adds the finalizer
        await resync(controller)
        snap = c.get(f"{GROUP}/namespaces/{ns}/podsnapshots/snap").json()
        events = c.get(f"/api/v1/namespaces/{ns}/events").json()["items"]
    assert ARTIFACT_FINALIZER in snap["metadata"]["finalizers"]
    assert conditions(snap)["Ready"] == ("False", "CheckpointPending")
    assert snap["status"]["source"]["nodeName"] == "node-a"
    assert any(
        e["reason"] == "CheckpointPending" and e["involvedObject"]["name"] == "snap" for e in events
    )
    sample = controller.metrics.registry.get_sample_value
    assert (
        sample("snapshot_controller_reconciles_total", {"kind": "PodSnapshot", "result": "ok"}) >= 2
    )
    assert sample("snapshot_controller_api_requests_total", {"verb": "get", "outcome": "ok"}) > 0
    assert sample("snapshot_controller_api_requests_total", {"verb": "patch", "outcome": "ok"}) > 0


async def test_missing_source_fails_and_deletion_is_not_blocked(control_plane, controller, ns):
    with control_plane.client() as c:
        create(c, ns, "podsnapshots", snapshot_body("orphan", pod="nope"))
        await resync(controller)
        await resync(controller)
        snap = c.get(f"{GROUP}/namespaces/{ns}/podsnapshots/orphan").json()
        assert conditions(snap)["Failed"] == ("True", "InvalidSource")
        assert "source pod nope not found" in str(snap["status"]["conditions"])
        # no node ever took it, so the controller itself lets it go
        assert c.delete(f"{GROUP}/namespaces/{ns}/podsnapshots/orphan").status_code == 200
        await resync(controller)
        assert c.get(f"{GROUP}/namespaces/{ns}/podsnapshots/orphan").status_code == 404


async def test_snapshot_job_runs_the_whole_flow(control_plane, controller, ns):
    job = {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "SnapshotJob",
        "metadata": {"name": "warm"},
        "spec": {
            "podTemplate": {"metadata": {"labels": {"app": "llm"}}, "spec": {"containers": MAIN}}
        },
    }
    with control_plane.client() as c:
        stored = create(c, ns, "snapshotjobs", job)
        # the CRD's defaults were applied by the API server
        assert stored["spec"]["activeDeadlineSeconds"] == 3600
        # no target named: the template's only container is the one captured
        assert "targetContainers" not in stored["spec"]["podSnapshotTemplate"]

        await resync(controller)
        pod = c.get(f"/api/v1/namespaces/{ns}/pods/warm-source").json()
        assert pod["metadata"]["labels"] == {"app": "llm", JOB_LABEL: "warm"}
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "SnapshotJob"
        assert {"name": "snapshot-control", "emptyDir": {}} in pod["spec"]["volumes"]
        j = c.get(f"{GROUP}/namespaces/{ns}/snapshotjobs/warm").json()
        assert conditions(j)["Running"] == ("True", "Started") and j["status"]["startedAt"]

        kubelet_runs(c, ns, "warm-source", ready=False)
        await resync(controller)
        assert c.get(f"{GROUP}/namespaces/{ns}/podsnapshots/warm").status_code == 404

        kubelet_runs_ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
        c.patch(
            f"/api/v1/namespaces/{ns}/pods/warm-source/status",
            json=kubelet_runs_ready,
            headers={"Content-Type": "application/strategic-merge-patch+json"},
        )
        await resync(controller)  # creates the PodSnapshot
        await resync(controller)  # hands it to node-a
        snap = c.get(f"{GROUP}/namespaces/{ns}/podsnapshots/warm").json()
        assert snap["spec"]["source"]["podRef"]["uid"] == pod["metadata"]["uid"]
        assert conditions(snap)["Ready"] == ("False", "CheckpointPending")

        # the node agent's part: the checkpoint succeeded
        status = {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Captured",
                    "lastTransitionTime": "2026-12-02T12:00:00Z",
                }
            ],
            "artifact": {
                "uri": "file:///store/x",
                "manifestDigest": "sha256:" + "a" * 64,
                "sizeBytes": 10,
            },
            "source": {"nodeName": "node-a"},
        }
        r = c.patch(
            f"{GROUP}/namespaces/{ns}/podsnapshots/warm/status",
            json={"status": status},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert r.status_code == 200, r.text
        await resync(controller)
        j = c.get(f"{GROUP}/namespaces/{ns}/snapshotjobs/warm").json()
        assert conditions(j)["Completed"] == ("True", "Completed")
        assert conditions(j)["Captured"][0] == "True" and j["status"]["podSnapshotName"] == "warm"
        src = c.get(f"/api/v1/namespaces/{ns}/pods/warm-source")
        # a bound pod waits for its kubelet to confirm the deletion
        assert src.status_code == 404 or src.json()["metadata"].get("deletionTimestamp")


async def test_snapshot_job_deadline(control_plane, controller, ns):
    job = {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "SnapshotJob",
        "metadata": {"name": "slow"},
        "spec": {
            "activeDeadlineSeconds": 1,
            "podTemplate": {"spec": {"containers": [{"name": "main", "image": "img:1"}]}},
        },
    }
    with control_plane.client() as c:
        create(c, ns, "snapshotjobs", job)
        await resync(controller)
        import asyncio

        await asyncio.sleep(2.1)
        await resync(controller)
        j = c.get(f"{GROUP}/namespaces/{ns}/snapshotjobs/slow").json()
    assert conditions(j)["Failed"] == ("True", "DeadlineExceeded")


async def test_a_pod_template_typo_fails_the_job_with_the_servers_words(
    control_plane, controller, ns
):
    """Operations issue: podTemplate preserves unknown fields, so a typo (``resource:`` for
    ``resources:``) was accepted and silently dropped when the source pod was created: it ran
    without its GPU limit. The controller creates the pod with strict field validation; the
    job fails at once with the API server's words, and no pod is left."""
    typo = [{"name": "main", "image": "img:1", "resource": {"limits": {"nvidia.com/gpu": 1}}}]
    job = {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "SnapshotJob",
        "metadata": {"name": "typo"},
        "spec": {"podTemplate": {"spec": {"containers": typo}}},
    }
    with control_plane.client() as c:
        create(c, ns, "snapshotjobs", job)
        await resync(controller)
        j = c.get(f"{GROUP}/namespaces/{ns}/snapshotjobs/typo").json()
        assert conditions(j)["Failed"] == ("True", "InvalidPodTemplate")
        failed = next(x for x in j["status"]["conditions"] if x["type"] == "Failed")
        assert 'unknown field "spec.containers[0].resource"' in failed["message"], failed
        assert j["status"]["observedGeneration"] == j["metadata"]["generation"]
        assert c.get(f"/api/v1/namespaces/{ns}/pods/typo-source").status_code == 404


@pytest.mark.parametrize(
    "body, fragment",
    [
        (
            {"spec": {"source": {"podRef": {"name": "a"}, "containers": ["x", "y"]}}},
            "at most 1 item",
        ),
        ({"spec": {"source": {"podRef": {"name": "a"}, "containers": []}}}, "at least 1 item"),
        ({"spec": {"source": {"containers": ["x"]}}}, "podRef: Required value"),
        ({}, "spec: Required value"),
    ],
)
def test_invalid_pod_snapshots_are_rejected(control_plane, ns, body, fragment):
    with control_plane.client() as c:
        r = c.post(
            f"{GROUP}/namespaces/{ns}/podsnapshots",
            json={
                "apiVersion": "nvidia.com/v1alpha1",
                "kind": "PodSnapshot",
                "metadata": {"name": "bad"},
                **body,
            },
        )
    assert r.status_code == 422 and fragment in r.json()["message"], r.text


def test_pod_snapshot_spec_is_immutable(control_plane, ns):
    with control_plane.client() as c:
        create(c, ns, "podsnapshots", snapshot_body("fixed"))
        r = c.patch(
            f"{GROUP}/namespaces/{ns}/podsnapshots/fixed",
            json={"spec": {"keepSourceRunning": True}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
    assert r.status_code == 422 and "spec is immutable" in r.json()["message"]


def test_invalid_status_is_rejected(control_plane, ns):
    with control_plane.client() as c:
        create(c, ns, "podsnapshots", snapshot_body("st"))
        r = c.patch(
            f"{GROUP}/namespaces/{ns}/podsnapshots/st/status",
            json={"status": {"artifact": {"uri": "x", "manifestDigest": "md5:1"}}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
    assert r.status_code == 422 and "manifestDigest" in r.json()["message"]


def test_snapshot_job_target_must_name_a_template_container(control_plane, ns):
    """A single container is the target whatever its name (issue 41: the default [main]
    refused a pod whose only container was "app"); with several, one must be named, and
    a name must be one of the template's."""

    def job(name: str, containers: list[str], target: list[str] | None = None):
        spec: dict = {"podTemplate": {"spec": {"containers": [{"name": n} for n in containers]}}}
        if target is not None:
            spec["podSnapshotTemplate"] = {"targetContainers": target}
        with control_plane.client() as c:
            return c.post(
                f"{GROUP}/namespaces/{ns}/snapshotjobs",
                json={
                    "apiVersion": "nvidia.com/v1alpha1",
                    "kind": "SnapshotJob",
                    "metadata": {"name": name},
                    "spec": spec,
                },
            )

    assert job("single", ["app"]).status_code == 201
    for name, containers, target in (("two", ["app", "side"], None), ("wrong", ["app"], ["main"])):
        r = job(name, containers, target)
        assert r.status_code == 422, r.text
        assert "targetContainers must name a container" in r.json()["message"]


def test_printer_columns(control_plane, ns):
    with control_plane.client() as c:
        create(c, ns, "podsnapshots", snapshot_body("cols"))
        r = c.get(
            f"{GROUP}/namespaces/{ns}/podsnapshots",
            headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
        )
    cols = [col["name"] for col in r.json()["columnDefinitions"]]
    # Reason and (-o wide) Message: why a PodSnapshot is not Ready, without -o yaml (issue 41)
    assert cols == ["Name", "Ready", "Reason", "Node", "Size", "Quiesce", "Age", "Message"]
    assert [c["priority"] for c in r.json()["columnDefinitions"]][-1] == 1
    (row,) = [r for r in r.json()["rows"] if r["cells"][0] == "cols"]
    assert row["cells"][5] == "handshake", "the default profile, filled in by the schema"
