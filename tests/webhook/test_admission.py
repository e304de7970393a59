"""The webhook as a process, over real TLS, against a real kube-apiserver + etcd: first with
AdmissionReview v1 payloads posted to it directly, then registered in the API server through a
MutatingWebhookConfiguration, where the assertion is the pod the API server stores."""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid

import jsonpatch
import pytest

from api import annotations as ann
from devnode.webhook import webhook_process
from tests.helpers import hung_api_server
from tests.webhook import objects
from tests.webhook.conftest import chart_webhook_registered

pytestmark = pytest.mark.slow
NS = "webhook-test"
SNAPS = f"/apis/nvidia.com/v1alpha1/namespaces/{NS}/podsnapshots"
DIGEST = "sha256:" + "cd" * 32


def snapshot_status(ready: bool = True) -> dict:
    status = {
        "conditions": [
            {
                "type": "Ready",
                "status": "True" if ready else "False",
                "reason": "Captured" if ready else "CheckpointPending",
                "message": "",
                "lastTransitionTime": "2026-12-02T10:00:00Z",
            }
        ],
        "source": {
            "nodeName": "node-a",
            "arch": "x86_64",
            "driverVersion": "570.133.20",
            "gpus": [{"uuid": "GPU-1", "product": "NVIDIA H200", "memoryMiB": 143771}],
        },
    }
    if ready:
        status["artifact"] = {
            "uri": f"file:///var/lib/snapshot/{NS}/ready",
            "sizeBytes": 4096,
            "manifestDigest": DIGEST,
        }
    return status


@pytest.fixture(scope="module")
def cluster(control_plane):
    with control_plane.client() as c:
        c.post("/api/v1/namespaces", json={"metadata": {"name": NS}})
        c.post(
            "/apis/node.k8s.io/v1/runtimeclasses",
            json={
                "apiVersion": "node.k8s.io/v1",
                "kind": "RuntimeClass",
                "metadata": {"name": "snapshot"},
                "handler": "snapshot",
            },
        )
        for name, ready in (("ready", True), ("pending", False)):
            source = {"podRef": {"name": "src"}, "containers": ["main"]}
            body = {
                "apiVersion": "nvidia.com/v1alpha1",
                "kind": "PodSnapshot",
                "metadata": {"name": name},
                "spec": {"source": source},
            }
            r = c.post(SNAPS, json=body)
            assert r.status_code in (201, 409), r.text
            r = c.patch(
                f"{SNAPS}/{name}/status",
                json={"status": snapshot_status(ready)},
                headers={"Content-Type": "application/merge-patch+json"},
            )
            assert r.status_code == 200, r.text
    return control_plane


def pod(snapshot: str | None = "ready", **annotations: str) -> dict:
    return objects.pod(snapshot, NS, **annotations)


def review(obj: dict, kind: str = "Pod") -> dict:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": NS,
            "object": obj,
            "userInfo": {"username": "test"},
        },
    }


def post(webhook, body) -> dict:
    with webhook.client() as c:
        r = (
            c.post("/mutate", json=body)
            if not isinstance(body, bytes)
            else c.post("/mutate", content=body, headers={"Content-Type": "application/json"})
        )
    assert r.status_code == 200, r.text
    return r.json()


# ---- AdmissionReview payloads posted straight to the webhook over TLS ----------------------


def test_ready_snapshot_gives_a_patch_that_yields_the_restore_pod(cluster, webhook):
    rev = review(pod())
    out = post(webhook, rev)
    resp = out["response"]
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    assert resp["uid"] == rev["request"]["uid"] and resp["allowed"] is True
    assert resp["patchType"] == "JSONPatch"
    patched = jsonpatch.apply_patch(
        rev["request"]["object"], json.loads(base64.b64decode(resp["patch"]))
    )
    a = patched["metadata"]["annotations"]
    assert a[ann.ARTIFACT] == f"file:///var/lib/snapshot/{NS}/ready"
    assert a[ann.MANIFEST_DIGEST] == DIGEST and a[ann.CONTAINER] == "main"
    assert patched["spec"]["runtimeClassName"] == "snapshot"
    # admitting the result again changes nothing
    again = post(webhook, review(patched))["response"]
    assert again["allowed"] and "patch" not in again


@pytest.mark.parametrize(
    "snapshot, reason", [("missing", "not found"), ("pending", "is not Ready")]
)
def test_fallback_admits_unchanged_with_a_warning(cluster, webhook, snapshot, reason):
    resp = post(webhook, review(pod(snapshot)))["response"]
    assert resp["allowed"] is True and "patch" not in resp
    assert reason in resp["warnings"][0] and f"{NS}/{snapshot}" in resp["warnings"][0]


def test_strict_denies_with_the_reason(cluster, webhook):
    resp = post(webhook, review(pod("missing", **{ann.RESTORE_POLICY: "strict"})))["response"]
    assert resp["allowed"] is False and resp["status"]["code"] == 403
    assert f"PodSnapshot {NS}/missing: not found" in resp["status"]["message"]


def test_non_pod_objects_are_admitted_unchanged(cluster, webhook):
    resp = post(webhook, review({"metadata": {"name": "x"}}, kind="ConfigMap"))["response"]
    assert resp == {"uid": resp["uid"], "allowed": True}


@pytest.mark.parametrize(
    "body, fragment",
    [
        (b"{not json", "malformed AdmissionReview"),
        (b"[]", "malformed AdmissionReview"),
        (
            json.dumps(
                {"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {}}
            ).encode(),
            "apiVersion",
        ),
        (
            json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(),
            "request",
        ),
        (
            json.dumps(
                {
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "request": {
                        "uid": "",
                        "kind": {"version": "v1", "kind": "Pod"},
                        "operation": "CREATE",
                    },
                }
            ).encode(),
            "uid",
        ),
    ],
)
def test_malformed_review_is_a_400_with_a_message(cluster, webhook, body, fragment):
    with webhook.client() as c:
        r = c.post("/mutate", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    assert "malformed AdmissionReview" in r.json()["error"] and fragment in r.json()["error"]


def nested(levels: int) -> list:
    v: list = []
    for _ in range(levels):
        v = [v]
    return v


def _review_of(obj) -> bytes:
    rev = review(pod())
    rev["request"]["object"] = obj
    return json.dumps(rev).encode()


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "malformed AdmissionReview"),
        (_review_of({"metadata": {"a": nested(100)}}), "nested deeper"),
        (_review_of({"metadata": "not an object"}), "metadata"),
        (_review_of({"metadata": {"annotations": ["nvidia.com/restore-from"]}}), "annotations"),
        (_review_of({"metadata": {"annotations": {ann.RESTORE_FROM: 7}}}), "annotations"),
    ],
    ids=["deep-json", "deep-object", "metadata-type", "annotations-type", "annotation-value"],
)
def test_hostile_reviews_are_a_400_not_an_error(cluster, webhook, body, fragment):
    """Deep or wrongly typed reviews used to reach the decision and fail there (a 500, or
    the fail-open error path); they are refused up front."""
    with webhook.client() as c:
        r = c.post("/mutate", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, r.text
        assert fragment in r.json()["error"]
        assert c.get("/healthz").status_code == 200


def test_oversized_body_is_refused_without_buffering_it(cluster, webhook):
    """50 MiB (which took the webhook past its 256 MiB memory limit) is refused once the
    limit is passed, declared or not, and the webhook keeps serving."""
    chunk = b" " * (1 << 20)

    def stream():
        for _ in range(50):
            yield chunk

    with webhook.client() as c:
        r = c.post("/mutate", content=stream(), headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and "over the" in r.json()["error"]
        r = c.post(
            "/mutate", content=b" " * (50 << 20), headers={"Content-Type": "application/json"}
        )
        assert r.status_code == 413
        assert c.get("/healthz").status_code == 200
        assert post(webhook, review(pod()))["response"]["allowed"] is True


@pytest.mark.parametrize("name", ["../ready", "Ready", "a b", "x" * 254])
def test_invalid_snapshot_names_are_denied_before_any_lookup(cluster, webhook, name):
    resp = post(webhook, review(pod(name)))["response"]
    assert resp["allowed"] is False and "is not a PodSnapshot name" in resp["status"]["message"]


def test_health_and_metrics(cluster, webhook):
    with webhook.client() as c:
        assert c.get("/healthz").text == "ok"
        assert c.get("/readyz").text == "ok"
        post(webhook, review(pod()))
        text = c.get("/metrics").text

    def value(series: str) -> float:
        return float(next(ln for ln in text.splitlines() if ln.startswith(series)).split()[-1])

    assert value('snapshot_webhook_admissions_total{result="mutated"}') >= 1
    assert value('snapshot_webhook_snapshot_lookups_total{outcome="found"}') >= 1
    assert value("snapshot_webhook_admission_seconds_count") >= 1
    # every known result is a series from the start (an alert on a rate sees zeros, not gaps)
    assert value('snapshot_webhook_admissions_total{result="error"}') == 0


def test_unreachable_api_server_is_answered_within_the_timeout(cluster, tmp_path):
    """An API server that accepts connections and never answers (a real listening socket that
    reads nothing) must not hang admission: the lookup budget applies the pod's policy."""
    hung = hung_api_server(cluster.kubeconfig, tmp_path / "kubeconfig")
    with hung as kubeconfig, webhook_process(tmp_path, kubeconfig, "--lookup-timeout", "1") as w:
        t0 = time.monotonic()
        fallback = post(w, review(pod()))["response"]
        strict = post(w, review(pod(**{ann.RESTORE_POLICY: "strict"})))["response"]
        elapsed = time.monotonic() - t0
    assert fallback["allowed"] and "no answer within 1s" in fallback["warnings"][0]
    assert not strict["allowed"] and "no answer within 1s" in strict["status"]["message"]
    assert elapsed < 8  # two 1 s budgets, far below the API server's 10 s webhook timeout


# ---- registered in the API server: what gets stored ----------------------------------------


@pytest.fixture(scope="module")
def registered(cluster, webhook):
    with chart_webhook_registered(cluster, webhook, "snapshot-webhook-test"):
        yield cluster


def create_pod(cp, body: dict):
    with cp.client() as c:
        return c.post(f"/api/v1/namespaces/{NS}/pods", json=body)


def test_api_server_stores_the_mutated_pod(registered):
    r = create_pod(registered, pod())
    assert r.status_code == 201, r.text
    stored = (
        registered.client()
        .get(f"/api/v1/namespaces/{NS}/pods/{r.json()['metadata']['name']}")
        .json()
    )
    assert stored["spec"]["runtimeClassName"] == "snapshot"
    assert stored["metadata"]["annotations"][ann.MANIFEST_DIGEST] == DIGEST
    main = stored["spec"]["containers"][0]
    assert {"name": "SNAPSHOT_CONTROL_DIR", "value": "/snapshot-control"} in main["env"]
    exprs = stored["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"][0]["matchExpressions"]
    assert {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H200"]} in exprs
    # shared or OCI storage (this webhook has no --pin-to-source-node): any compatible node
    assert (
        "matchFields"
        not in stored["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"][0]
    )


def test_a_node_local_store_pins_the_restore_to_the_source_node(cluster, tmp_path):
    """Nodes issue: with the default hostPath store only the source's node has the artifact,
    yet restore pods were scheduled anywhere compatible and cold-started there. With
    --pin-to-source-node (the chart's default for a store that is not shared) the pod must
    run on the node the PodSnapshot records (by name: a node's hostname label may differ),
    and the API server accepts the pod so pinned."""
    with webhook_process(tmp_path, cluster.kubeconfig, "--pin-to-source-node") as pinned:
        resp = post(pinned, review(pod()))["response"]
    patched = jsonpatch.apply_patch(pod(), json.loads(base64.b64decode(resp["patch"])))
    (term,) = patched["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert term["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]
    assert {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H200"]} in term[
        "matchExpressions"
    ]
    with cluster.client() as c:
        r = c.post(f"/api/v1/namespaces/{NS}/pods", params={"dryRun": "All"}, json=patched)
    assert r.status_code == 201, r.text


def test_api_server_passes_on_the_fallback_warning(registered):
    r = create_pod(registered, pod("missing"))
    assert r.status_code == 201, r.text
    assert "runtimeClassName" not in r.json()["spec"]
    assert f"PodSnapshot {NS}/missing: not found" in r.headers.get("warning", "")


def test_api_server_rejects_strict_restore_of_a_missing_snapshot(registered):
    r = create_pod(registered, pod("missing", **{ann.RESTORE_POLICY: "strict"}))
    assert r.status_code == 403 and f"PodSnapshot {NS}/missing: not found" in r.json()["message"]


def test_api_server_rejects_user_set_internal_annotations(registered):
    r = create_pod(registered, pod(None, **{ann.ARTIFACT: "file:///etc"}))
    assert r.status_code == 403 and "set by the snapshot webhook only" in r.json()["message"]


def test_concurrent_admissions(registered):
    results: list[int] = []

    def one():
        results.append(create_pod(registered, pod()).status_code)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [201] * 8
