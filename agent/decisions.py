"""The agent's decisions, pure: which PodSnapshots are its work, the statuses it writes, the
pod condition that reports a restore, and where things are on the node."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from api import annotations as ann
from api.annotations import (
    ARTIFACT,
    RESTORED_CONDITION,
    RestoredReason,
    RestoreOutcome,
)
from api.crd import (
    ArtifactRef,
    ConditionStatus,
    PodSnapshot,
    PodSnapshotConditions,
    PodSnapshotReasons,
    PodSnapshotStatus,
    SourceInfo,
    condition_true,
    set_condition,
)
from api.handshake import pod_empty_dir
from api.host import HostFingerprint
from api.manifest import Manifest
from api.podspec import CONTROL_VOLUME, container_status, is_running, source_mismatch
from api.report import RestoreReport
from restore_runtime import compat
from restore_runtime.artifact import oci
from restore_runtime.timing import phases_text

R = PodSnapshotReasons
READY, FAILED = PodSnapshotConditions.READY, PodSnapshotConditions.FAILED


def ready_reason(snap: PodSnapshot) -> str | None:
    return snap.ready_reason


def on_node(snap: PodSnapshot, node: str) -> bool:
    return snap.node_name == node


def to_checkpoint(snap: PodSnapshot, node: str) -> bool:
    return (
        on_node(snap, node)
        and snap.metadata.deletion_timestamp is None
        and not condition_true(snap.status.conditions, FAILED)
        and ready_reason(snap) == R.CHECKPOINT_PENDING
    )


def source_compat(snap: PodSnapshot) -> HostFingerprint | None:
    """What a host must match to restore ``snap``, from its status (the manifest's own compat
    block, as the agent recorded it at capture)."""
    src = snap.status.source
    return src.fingerprint() if src is not None else None


def to_pre_pull(snap: PodSnapshot, node: str, host: HostFingerprint) -> str | None:
    """The oci:// URI to pull ahead of any restore: a Ready PodSnapshot pushed to a
    registry, made on another node, that this node could restore (the shim's own gates)."""
    art = snap.status.artifact
    if (
        not snap.ready
        or art is None
        or not art.uri.startswith("oci://")
        or on_node(snap, node)
        or snap.metadata.deletion_timestamp is not None
    ):
        return None
    wanted = source_compat(snap)
    return art.uri if wanted is not None and not compat.check(wanted, host) else None


def interrupted(snap: PodSnapshot, node: str) -> bool:
    """Left Checkpointing with no checkpoint running (an agent that stopped mid-way, or an
    API server that was down at the end): finished from its committed artifact when there
    is one, else failed; never retried, as the source may have been frozen or quiesced."""
    return (
        on_node(snap, node)
        and snap.metadata.deletion_timestamp is None
        and ready_reason(snap) == R.CHECKPOINTING
    )


def to_delete(snap: PodSnapshot, node: str) -> bool:
    return on_node(snap, node) and snap.metadata.deletion_timestamp is not None


def artifact_dir(store: Path, snap: PodSnapshot) -> Path:
    # The uid keeps a re-created PodSnapshot of the same name from meeting the old artifact.
    return store / snap.metadata.namespace / f"{snap.metadata.name}-{snap.metadata.uid[:8]}"


def oci_tag(snap: PodSnapshot) -> str:
    """The tag a PodSnapshot's artifact is pushed under (readable; pulls go by digest)."""
    m = snap.metadata
    return f"{m.namespace}.{m.name}"[:119] + f"-{m.uid[:8]}"


def oci_annotations(snap: PodSnapshot, manifest_digest: str) -> dict[str, str]:
    """The OCI manifest's annotations: the artifact's digest, and the KEP-2008 checkpoint
    image keys where they mean the same."""
    return {
        oci.MANIFEST_DIGEST_KEY: manifest_digest,
        oci.KEP2008_NAMESPACE: snap.metadata.namespace,
        oci.KEP2008_POD: snap.spec.source.pod_ref.name,
        oci.KEP2008_CONTAINER: snap.container or "",
        "org.opencontainers.image.created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def control_dir(kubelet_root: Path, pod_uid: str) -> Path:
    """The host path of a pod's control volume (an emptyDir, as kubelet lays them out)."""
    return pod_empty_dir(kubelet_root, pod_uid, CONTROL_VOLUME)


def container_id(pod: dict[str, Any], name: str) -> str | None:
    """The runtime's id of a running container from the pod status ("containerd://<id>")."""
    status = container_status(pod, name)
    if not is_running(status):
        return None
    return (status.get("containerID") or "").split("://", 1)[-1] or None


def image_digest(pod: dict[str, Any], name: str) -> str | None:
    image_id = (container_status(pod, name) or {}).get("imageID") or ""
    return image_id.rsplit("@", 1)[-1] if "@" in image_id else None


def checkpointing(snap: PodSnapshot) -> PodSnapshotStatus:
    return snap.status.not_ready(R.CHECKPOINTING, "dumping")


def captured(
    snap: PodSnapshot, manifest: Manifest, uri: str, digest: str, seconds: float
) -> PodSnapshotStatus:
    conds = set_condition(
        snap.status.conditions,
        READY,
        ConditionStatus.TRUE,
        R.CAPTURED,
        f"{manifest.size_bytes / 1e9:.2f} GB in {seconds:.1f}s",
    )
    node = snap.status.source.node_name if snap.status.source else ""
    return PodSnapshotStatus(
        conditions=conds,
        artifact=ArtifactRef(uri=uri, manifest_digest=digest, size_bytes=manifest.size_bytes),
        checkpoint_seconds=round(seconds, 3),
        source=SourceInfo.of(node, manifest.compat),
    )


def failed(snap: PodSnapshot, reason: str, message: str) -> PodSnapshotStatus:
    return snap.status.failed(reason, message)


@dataclass(frozen=True)
class RestoredCondition:
    status: str
    reason: str
    message: str

    def to_api(self, now: str) -> dict[str, str]:
        return {
            "type": RESTORED_CONDITION,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
            "lastTransitionTime": now,
        }


def restored_condition(report: RestoreReport) -> RestoredCondition:
    status = (
        ConditionStatus.TRUE if report.outcome is RestoreOutcome.RESTORED else ConditionStatus.FALSE
    )
    reason = RestoredReason.of(report.outcome)
    timings = phases_text(report.timings)
    parts = [
        p
        for p in (
            report.reason,
            f"phase {report.failed_phase}" if report.failed_phase else None,
            timings,
            report.fill_text,
        )
        if p
    ]
    return RestoredCondition(status.value, reason.value, "; ".join(parts) or report.outcome.value)


def needs_restore_report(pod: dict[str, Any], node: str) -> bool:
    """A restore pod on this node whose outcome is not reported yet."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    if spec.get("nodeName") != node or ARTIFACT not in (meta.get("annotations") or {}):
        return False
    conds = (pod.get("status") or {}).get("conditions") or []
    return not any(c.get("type") == RESTORED_CONDITION for c in conds)


def source_problem(pod: dict[str, Any], snap: PodSnapshot, node: str) -> str | None:
    """Why this node's agent must not checkpoint ``pod`` for ``snap``: a pod's status is
    written by its node, so a container id there is only believed from a pod of this node,
    and only from the very pod the PodSnapshot names."""
    name = (pod.get("metadata") or {}).get("name")
    match source_mismatch(pod, node, snap.spec.source.pod_ref.uid):
        case ("node", where, _):
            return (
                f"source pod {name} runs on node {where!r}, not on {node!r}: an agent "
                "checkpoints containers of its own node only"
            )
        case ("uid", got, want):
            return f"source pod {name} has uid {got}, not {want} (recreated?)"
    return None


@dataclass(frozen=True)
class CheckpointTarget:
    """What a checkpoint of a PodSnapshot acts on: the container the pod's status names,
    once the pod was found to be this node's and the named one."""

    container_id: str
    pod_uid: str
    image_digest: str | None


def checkpoint_target(
    pod: dict[str, Any] | None, snap: PodSnapshot, node: str
) -> CheckpointTarget | str:
    """The container to checkpoint for ``snap``, or why not (the PodSnapshot's failure
    message). The container's own labels are checked once runc's state is read
    (``container_problem``)."""
    name, container = snap.spec.source.pod_ref.name, snap.container or ""
    if pod is None:
        return f"source pod {name} no longer exists"
    cid = container_id(pod, container)
    if cid is None:
        return f"container {container!r} of {name} is not running"
    if why := source_problem(pod, snap, node):
        return why
    return CheckpointTarget(cid, pod["metadata"]["uid"], image_digest(pod, container))


def container_problem(annotations: dict[str, str], pod: dict[str, Any], name: str) -> str | None:
    """Why the runtime's container (its CRI annotations, from runc state) is not container
    ``name`` of ``pod``: a forged ``containerID`` in a pod status would otherwise point the
    agent at another tenant's container."""
    meta = pod.get("metadata") or {}
    status = container_status(pod, name) or {}
    # what containerd's CRI plugin writes into every container's OCI spec (runc state
    # shows it), from the kubelet's sandbox metadata
    want = {
        ann.CONTAINER_TYPE: "container",
        ann.SANDBOX_NAMESPACE: meta.get("namespace"),
        ann.SANDBOX_NAME: meta.get("name"),
        ann.SANDBOX_UID: meta.get("uid"),
        ann.CONTAINER_NAME: status.get("name", name),
    }
    wrong = [
        f"{k.rsplit('.', 1)[-1]} {annotations.get(k)!r} (want {v!r})"
        for k, v in want.items()
        if annotations.get(k) != v
    ]
    if wrong:
        return (
            f"the runtime's container is not {meta.get('namespace')}/{meta.get('name')} "
            f"container {name!r}: {', '.join(wrong)}"
        )
    return None
