"""What the controller does with one SnapshotJob, decided from the job, its source pod and its
PodSnapshot (each None while it does not exist) and the time.

The flow: start (Running) -> create the source pod from the template, with the control volume
-> the pod is Ready (its readiness probe says the engine is warm) -> create the PodSnapshot; the
node agent then writes `checkpoint-requested` and dumps once the workload answers
`ready-for-snapshot` -> the PodSnapshot is Ready (Captured) -> delete the source pod
(Completed). A failed source pod or PodSnapshot, or the deadline, ends it Failed; the source
pod is deleted then too."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from api.crd import (
    API_VERSION,
    JOB_LABEL,
    ConditionStatus,
    ObjectMeta,
    PodRef,
    PodSnapshot,
    PodSnapshotConditions,
    PodSnapshotSpec,
    SnapshotJob,
    SnapshotJobConditions,
    SnapshotJobStatus,
    SnapshotSource,
    condition_true,
    set_condition,
)
from api.podspec import add_control_dir

C = SnapshotJobConditions
T, F = ConditionStatus.TRUE, ConditionStatus.FALSE


@dataclass
class JobActions:
    create_pod: dict[str, Any] | None = None
    create_snapshot: PodSnapshot | None = None
    delete_pod: bool = False
    status: SnapshotJobStatus | None = None
    events: list[tuple[str, str, str]] = field(default_factory=list)


def source_pod_name(job: SnapshotJob) -> str:
    return f"{job.metadata.name}-source"


def owner_reference(job: SnapshotJob) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "SnapshotJob",
        "name": job.metadata.name,
        "uid": job.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def owned_by(pod: dict[str, Any], job: SnapshotJob) -> bool:
    """Whether ``pod`` is the one this job created (its controller reference, by uid)."""
    refs = (pod.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("uid") == job.metadata.uid and r.get("controller") for r in refs)


def source_pod(job: SnapshotJob) -> dict[str, Any]:
    """The source pod: the template, named after the job, owned by it, with the control
    volume in the target container."""
    template = copy.deepcopy(job.spec.pod_template)
    meta = template.get("metadata") or {}
    spec = template["spec"]
    add_control_dir(spec, job.spec.target_container)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": source_pod_name(job),
            "namespace": job.metadata.namespace,
            "labels": {**(meta.get("labels") or {}), JOB_LABEL: job.metadata.name},
            "annotations": meta.get("annotations") or {},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": spec,
    }


def pod_snapshot(job: SnapshotJob, pod: dict[str, Any]) -> PodSnapshot:
    return PodSnapshot(
        metadata=ObjectMeta.model_validate(
            {
                "name": job.metadata.name,
                "namespace": job.metadata.namespace,
                "labels": {JOB_LABEL: job.metadata.name},
                "ownerReferences": [owner_reference(job)],
            }
        ),
        spec=PodSnapshotSpec(
            source=SnapshotSource(
                pod_ref=PodRef(name=pod["metadata"]["name"], uid=pod["metadata"].get("uid")),
                containers=[job.spec.target_container],
            ),
            quiesce=job.spec.pod_snapshot_template.quiesce,
        ),
    )


def pod_ready(pod: dict[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def _fail(
    out: JobActions, st: SnapshotJobStatus, has_pod: bool, reason: str, message: str, now: datetime
) -> JobActions:
    st.conditions = set_condition(st.conditions, C.RUNNING, F, reason, message)
    st.conditions = set_condition(st.conditions, C.FAILED, T, reason, message)
    st.completed_at = now
    out.status, out.delete_pod = st, has_pod
    out.events.append(("Warning", reason, message))
    return out


def template_refused(
    job: SnapshotJob, status: SnapshotJobStatus | None, why: str, now: datetime
) -> JobActions:
    """The API server refused the source pod (created with strict field validation: a typo
    such as ``resource:`` is an error, not a field silently dropped): the job fails with the
    server's words. ``status``: what this pass had decided so far, if anything."""
    st = (status or job.status).model_copy(deep=True)
    st.started_at = st.started_at or now
    return _fail(
        JobActions(),
        st,
        False,
        "InvalidPodTemplate",
        f"spec.podTemplate is not a valid pod: {why}",
        now,
    )


def reconcile(
    job: SnapshotJob, pod: dict[str, Any] | None, snap: PodSnapshot | None, now: datetime
) -> JobActions:
    out = JobActions()
    st = job.status.model_copy(deep=True)
    conds = st.conditions
    # a pod of that name the job does not own is someone else's: never deleted, never taken
    foreign = pod is not None and not owned_by(pod, job)
    if foreign:
        pod = None
    if condition_true(conds, C.COMPLETED) or condition_true(conds, C.FAILED):
        out.delete_pod = pod is not None and pod["metadata"].get("deletionTimestamp") is None
        return out

    def fail(reason: str, message: str) -> JobActions:
        return _fail(out, st, pod is not None, reason, message, now)

    if foreign:
        return fail(
            "SourcePodConflict",
            f"pod {source_pod_name(job)} exists and is not owned "
            "by this SnapshotJob: rename the job or delete that pod",
        )
    if st.started_at is None:
        st.started_at = now
        st.conditions = set_condition(conds, C.RUNNING, T, "Started", "creating the source pod")
        out.status = st
    elapsed = (now - st.started_at).total_seconds()
    if elapsed > job.spec.active_deadline_seconds:
        return fail(
            "DeadlineExceeded",
            f"not captured within activeDeadlineSeconds={job.spec.active_deadline_seconds}",
        )

    if snap is not None:
        if condition_true(snap.status.conditions, PodSnapshotConditions.FAILED):
            failed = next(c for c in snap.status.conditions if c.type == "Failed")
            return fail("SnapshotFailed", f"PodSnapshot {snap.metadata.name}: {failed.message}")
        if snap.ready:
            st.conditions = set_condition(
                st.conditions,
                C.CAPTURED,
                T,
                "Captured",
                f"PodSnapshot {snap.metadata.name} is Ready",
            )
            st.conditions = set_condition(st.conditions, C.RUNNING, F, "Completed", "")
            st.conditions = set_condition(
                st.conditions, C.COMPLETED, T, "Completed", "captured; source pod deleted"
            )
            st.completed_at = now
            out.status, out.delete_pod = st, pod is not None
            out.events.append(("Normal", "Completed", f"PodSnapshot {snap.metadata.name} Ready"))
        return out  # the agent is checkpointing

    if pod is None:
        out.create_pod = source_pod(job)
        return out
    phase = (pod.get("status") or {}).get("phase")
    if phase in ("Failed", "Succeeded"):
        return fail("SourcePodFinished", f"source pod {pod['metadata']['name']} is {phase}")
    if pod_ready(pod):
        out.create_snapshot = pod_snapshot(job, pod)
        st.pod_snapshot_name = job.metadata.name
        st.conditions = set_condition(
            st.conditions, C.RUNNING, T, "Capturing", "source pod Ready; PodSnapshot created"
        )
        out.status = st
        out.events.append(("Normal", "Capturing", f"PodSnapshot {job.metadata.name} created"))
    return out
