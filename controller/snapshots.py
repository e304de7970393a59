"""What the controller does with one PodSnapshot, decided from the snapshot and its source pod.

The controller never checkpoints: it validates the source, records the node, and leaves the
snapshot `Ready=False/CheckpointPending` for that node's agent, which does the checkpoint and
sets `Ready` or `Failed`. Deletion is the agent's too (the artifact may be on the node's disk);
the controller removes the finalizer only when no node ever took the snapshot."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from api.crd import (
    ARTIFACT_FINALIZER,
    PodSnapshot,
    PodSnapshotConditions,
    PodSnapshotReasons,
    PodSnapshotStatus,
    SourceInfo,
    condition_true,
)
from api.podspec import container_status, is_running

READY, FAILED = PodSnapshotConditions.READY, PodSnapshotConditions.FAILED
R = PodSnapshotReasons


@dataclass
class SnapshotActions:
    add_finalizer: bool = False
    remove_finalizer: bool = False
    status: PodSnapshotStatus | None = None  # the new status, when it changes
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)


def finished(snap: PodSnapshot) -> bool:
    return condition_true(snap.status.conditions, READY) or condition_true(
        snap.status.conditions, FAILED
    )


def _node(snap: PodSnapshot) -> str:
    return snap.status.source.node_name if snap.status.source else ""


def needs_source(snap: PodSnapshot) -> bool:
    """Whether the decision reads the source pod: only before a node takes the snapshot. A
    pass over finished (or handed-over, or deleted) snapshots then costs no API call each,
    which keeps an idle controller's load flat in the number of snapshots."""
    return snap.metadata.deletion_timestamp is None and not finished(snap) and not _node(snap)


def reconcile(snap: PodSnapshot, pod: dict[str, Any] | None) -> SnapshotActions:
    """pod: the source pod (None when it does not exist, or when ``needs_source`` is
    false)."""
    out = SnapshotActions()
    node = _node(snap)
    if snap.metadata.deletion_timestamp is not None:
        # The agent deletes the artifact and drops the finalizer; with no node, nothing to delete.
        out.remove_finalizer = ARTIFACT_FINALIZER in snap.metadata.finalizers and not node
        return out
    out.add_finalizer = ARTIFACT_FINALIZER not in snap.metadata.finalizers
    if finished(snap) or node:
        return out  # captured, failed, or in the agent's hands

    problem, waiting = source_problem(snap, pod)
    if problem and not waiting:
        out.status = snap.status.failed(R.INVALID_SOURCE, problem)
        out.events.append(("Warning", R.INVALID_SOURCE, problem))
    elif problem:
        out.status = snap.status.not_ready(R.WAITING_FOR_SOURCE, problem)
    else:
        assert pod is not None
        node = pod["spec"]["nodeName"]
        out.status = snap.status.not_ready(
            R.CHECKPOINT_PENDING, f"waiting for the snapshot agent on node {node}"
        )
        out.status.source = SourceInfo(node_name=node)
        out.events.append(("Normal", R.CHECKPOINT_PENDING, f"checkpoint handed to node {node}"))
    if out.status is not None and out.status == snap.status:
        out.status = None
    return out


def source_problem(snap: PodSnapshot, pod: dict[str, Any] | None) -> tuple[str | None, bool]:
    """(what is wrong with the source, whether waiting may fix it)."""
    ref = snap.spec.source.pod_ref
    if pod is None:
        return f"source pod {ref.name} not found", False
    if ref.uid and pod["metadata"].get("uid") != ref.uid:
        return f"source pod {ref.name} has uid {pod['metadata'].get('uid')}, not {ref.uid}", False
    name = snap.container
    containers = [c["name"] for c in pod["spec"].get("containers", [])]
    if name not in containers:
        return f"source pod {ref.name} has no container {name!r} (has {containers})", False
    phase = (pod.get("status") or {}).get("phase", "Pending")
    if phase in ("Succeeded", "Failed"):
        return f"source pod {ref.name} has finished ({phase})", False
    if not pod["spec"].get("nodeName"):
        return f"source pod {ref.name} is not scheduled yet", True
    if phase != "Running" or not is_running(container_status(pod, name)):
        return f"container {name!r} of source pod {ref.name} is not running yet", True
    return None, False
