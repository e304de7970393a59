"""Kubernetes objects as the API server returns them, for the reconciler tests."""

from __future__ import annotations

from api.crd import PodSnapshot, SnapshotJob


def pod(
    name="src",
    phase="Running",
    node="node-a",
    running=True,
    ready=True,
    uid="uid-1",
    owner="job-uid",
):
    """``owner``: the uid of the SnapshotJob that controls it (``job()``'s by default)."""
    state = {"running": {"startedAt": "2026-12-02T10:00:00Z"}} if running else {"waiting": {}}
    refs = (
        [
            {
                "apiVersion": "nvidia.com/v1alpha1",
                "kind": "SnapshotJob",
                "name": "warm",
                "uid": owner,
                "controller": True,
            }
        ]
        if owner
        else []
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "ownerReferences": refs},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "img:1"}]},
        "status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [
                {
                    "name": "main",
                    "state": state,
                    "containerID": "containerd://abc123",
                    "imageID": "img@sha256:" + "e" * 64,
                }
            ],
        },
    }


def snapshot(
    conditions=(),
    node="",
    finalizers=("snapshot.nvidia.com/artifact",),
    deleting=False,
    uid=None,
    container="main",
    keep=False,
):
    meta = {
        "name": "snap",
        "namespace": "ns",
        "uid": "0123456789ab",
        "resourceVersion": "7",
        "finalizers": list(finalizers),
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T11:00:00Z"
    status = {"conditions": [dict(type=t, status=s, reason=r) for t, s, r in conditions]}
    if node:
        status["source"] = {"nodeName": node}
    return PodSnapshot.model_validate(
        {
            "metadata": meta,
            "spec": {
                "source": {"podRef": {"name": "src", "uid": uid}, "containers": [container]},
                "keepSourceRunning": keep,
            },
            "status": status,
        }
    )


def job(status=None, deadline=3600):
    return SnapshotJob.model_validate(
        {
            "metadata": {"name": "warm", "namespace": "ns", "uid": "job-uid"},
            "spec": {
                "podTemplate": {
                    "metadata": {"labels": {"app": "llm"}},
                    "spec": {"containers": [{"name": "main", "image": "img:1"}]},
                },
                "activeDeadlineSeconds": deadline,
            },
            "status": status or {},
        }
    )


def conditions(obj: dict) -> dict[str, tuple[str, str]]:
    """An object's conditions as the API server stores them: type -> (status, reason)."""
    return {
        c["type"]: (c["status"], c.get("reason", ""))
        for c in obj.get("status", {}).get("conditions", [])
    }


def bound_pod(name: str, node: str, sa: str | None = None) -> dict:
    """A pod as a client creates it, already bound to ``node`` (no scheduler runs), under
    service account ``sa``: what a pod-bound token is made for."""
    spec = {"nodeName": node, "containers": [{"name": "main", "image": "registry.local/x:1"}]}
    if sa:
        spec["serviceAccountName"] = sa
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
