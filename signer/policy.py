"""Whether to sign: pure, from who asks (the TokenReview's answer), the PodSnapshot as the API
server has it, and the manifest. A node taken over can have signed only what its own agent
could have made: artifacts of PodSnapshots handed to that node, while they are captured."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from api.crd import PodSnapshot, PodSnapshotConditions, PodSnapshotReasons, condition_true
from api.manifest import Manifest
from api.podspec import source_mismatch
from api.signer import SignRequest


@dataclass(frozen=True)
class Caller:
    """An authenticated token: its user, and the node of the pod it is bound to (None for a
    token not bound to a pod)."""

    username: str
    node: str | None


def refusal(
    caller: Caller,
    agent_user: str,
    req: SignRequest,
    snap: PodSnapshot | None,
    manifest: Manifest,
    pod: dict[str, Any] | None,
) -> str | None:
    """Why not to sign, or None. ``pod``: the PodSnapshot's source pod as the API server has
    it (None when it does not exist)."""
    ref = f"PodSnapshot {req.namespace}/{req.name}"
    if caller.username != agent_user:
        return f"{caller.username} is not the node agent ({agent_user})"
    if not caller.node:
        return "the token is not bound to a pod on a node"
    if snap is None:
        return f"{ref} does not exist"
    if snap.metadata.uid != req.uid:
        return f"{ref} has uid {snap.metadata.uid}, not {req.uid}"
    if snap.metadata.deletion_timestamp is not None:
        return f"{ref} is being deleted"
    if snap.node_name != caller.node:
        return f"{ref} is handed to node {snap.node_name or '(none)'}, not to {caller.node}"
    if snap.status.artifact is not None:  # finished once: never signed for again
        return f"{ref} already has an artifact ({snap.status.artifact.manifest_digest})"
    if why := _source_pod_problem(snap, pod, caller.node):
        return f"{ref}: {why}"
    failed = condition_true(snap.status.conditions, PodSnapshotConditions.FAILED)
    if failed or snap.ready_reason != PodSnapshotReasons.CHECKPOINTING:
        return f"{ref} is not being checkpointed (Ready: {snap.ready_reason or 'unset'})"
    src = manifest.source
    bound = (src.namespace, src.pod_snapshot, src.pod_snapshot_uid)
    if bound != (req.namespace, req.name, req.uid):
        return f"the manifest is bound to {'/'.join(str(b) for b in bound)}, not to {ref}"
    return None


def _source_pod_problem(snap: PodSnapshot, pod: dict[str, Any] | None, node: str) -> str | None:
    """The node a PodSnapshot is handed to is written by the controller: checked here against
    the source pod itself, which only the scheduler binds. A controller's token (or a node
    holding one) that hands a PodSnapshot to a node its pod is not on gets nothing signed."""
    ref = snap.spec.source.pod_ref
    if pod is None:
        return f"its source pod {ref.name} does not exist"
    match source_mismatch(pod, node, ref.uid):
        case ("node", where, _):
            return f"its source pod {ref.name} runs on node {where or '(none)'}, not on {node}"
        case ("uid", got, want):
            return f"its source pod {ref.name} has uid {got}, not {want}"
    return None
