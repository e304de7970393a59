"""SnapshotJob reconciler decisions: every step of the flow and every way it ends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from api.crd import JOB_LABEL, ArtifactRef
from controller.jobs import reconcile
from tests.controller.objects import job, pod, snapshot

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
STARTED = {
    "startedAt": "2026-12-02T11:59:00Z",
    "conditions": [{"type": "Running", "status": "True", "reason": "Started"}],
}


def cond(status, type_):
    return next((c for c in status.conditions if c.type == type_), None)


def test_new_job_starts_and_creates_the_source_pod():
    act = reconcile(job(), None, None, NOW)
    assert act.status.started_at == NOW and cond(act.status, "Running").status == "True"
    p = act.create_pod
    assert p["metadata"]["name"] == "warm-source" and p["metadata"]["namespace"] == "ns"
    assert p["metadata"]["labels"] == {"app": "llm", JOB_LABEL: "warm"}
    owner = p["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "SnapshotJob",
        "warm",
        "job-uid",
        True,
    )
    main = p["spec"]["containers"][0]
    assert {"name": "SNAPSHOT_CONTROL_DIR", "value": "/snapshot-control"} in main["env"]
    assert {"name": "snapshot-control", "emptyDir": {}} in p["spec"]["volumes"]


def test_template_is_not_modified():
    j = job()
    reconcile(j, None, None, NOW)
    assert "volumes" not in j.spec.pod_template["spec"]


def test_source_pod_not_ready_waits():
    act = reconcile(job(STARTED), pod("warm-source", ready=False), None, NOW)
    assert act.create_pod is None and act.create_snapshot is None and act.status is None


def test_ready_source_pod_gets_a_pod_snapshot():
    act = reconcile(job(STARTED), pod("warm-source", uid="pod-uid"), None, NOW)
    s = act.create_snapshot
    assert s.metadata.name == "warm" and s.metadata.namespace == "ns"
    assert s.spec.source.pod_ref.name == "warm-source" and s.spec.source.pod_ref.uid == "pod-uid"
    assert s.spec.source.containers == ["main"]
    assert s.to_api()["metadata"]["ownerReferences"][0]["name"] == "warm"
    assert act.status.pod_snapshot_name == "warm"
    assert cond(act.status, "Running").reason == "Capturing"


def test_snapshot_in_progress_waits():
    act = reconcile(job(STARTED), pod("warm-source"), snapshot(), NOW)
    assert act.status is None and not act.delete_pod and act.create_snapshot is None


def test_ready_snapshot_completes_and_deletes_the_source():
    snap = snapshot([("Ready", "True", "Captured")], node="node-a")
    snap.status.artifact = ArtifactRef(uri="file:///a", manifest_digest="sha256:" + "0" * 64)
    act = reconcile(job(STARTED), pod("warm-source"), snap, NOW)
    assert act.delete_pod
    assert cond(act.status, "Captured").status == "True"
    assert cond(act.status, "Completed").status == "True"
    assert cond(act.status, "Running").status == "False"
    assert act.status.completed_at == NOW


def test_failed_snapshot_fails_the_job():
    snap = snapshot([("Failed", "True", "CheckpointFailed")], node="node-a")
    snap.status.conditions[0].message = "criu dump exited 1"
    act = reconcile(job(STARTED), pod("warm-source"), snap, NOW)
    failed = cond(act.status, "Failed")
    assert failed.reason == "SnapshotFailed" and "criu dump exited 1" in failed.message
    assert act.delete_pod


def test_failed_source_pod_fails_the_job():
    act = reconcile(job(STARTED), pod("warm-source", phase="Failed"), None, NOW)
    assert cond(act.status, "Failed").reason == "SourcePodFinished" and act.delete_pod


def test_deadline():
    late = NOW + timedelta(seconds=61)
    act = reconcile(job(STARTED, deadline=60), pod("warm-source", ready=False), None, late)
    failed = cond(act.status, "Failed")
    assert failed.reason == "DeadlineExceeded" and "60" in failed.message and act.delete_pod
    assert act.create_snapshot is None


def test_finished_job_only_cleans_up_its_pod():
    done = {**STARTED, "conditions": [{"type": "Completed", "status": "True"}]}
    act = reconcile(job(done), pod("warm-source"), None, NOW)
    assert act.delete_pod and act.status is None and act.create_pod is None
    assert not reconcile(job(done), None, None, NOW).delete_pod


def test_a_pod_of_the_source_name_the_job_does_not_own_is_never_deleted_nor_taken():
    """Finding 14 of isolation round 2: a tenant's pod named ``<job>-source`` (or one
    another job owns) was deleted by the controller, or snapshotted as the job's source."""
    for owner in (None, "another-job"):
        theirs = pod("warm-source", owner=owner)
        act = reconcile(job(STARTED), theirs, None, NOW)
        assert not act.delete_pod and act.create_snapshot is None and act.create_pod is None
        assert cond(act.status, "Failed").reason == "SourcePodConflict"
        done = {**STARTED, "conditions": [{"type": "Completed", "status": "True"}]}
        assert not reconcile(job(done), theirs, None, NOW).delete_pod
