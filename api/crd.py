"""PodSnapshot and SnapshotJob (group nvidia.com, v1alpha1) as typed models (field names follow
NVIDIA Snapshot). The chart's CRD schemas describe the same fields; tests keep the two in step.

Field names are the Kubernetes camelCase ones (through aliases), so `model_validate(obj)` takes
an object straight from the API server and `model_dump(by_alias=True, exclude_none=True)` gives
one back."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from .host import GpuInfo, HostFingerprint
from .quiesce import Quiesce

GROUP = "nvidia.com"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
POD_SNAPSHOT_PLURAL = "podsnapshots"
SNAPSHOT_JOB_PLURAL = "snapshotjobs"

# Deleting a PodSnapshot waits until its node's agent has deleted the artifact.
ARTIFACT_FINALIZER = "snapshot.nvidia.com/artifact"
# Labels the controller puts on what it creates for a SnapshotJob.
JOB_LABEL = "snapshot.nvidia.com/job"


class _Model(BaseModel):
    # extra="allow": objects from a newer API version or with metadata we do not model survive a
    # round trip instead of being silently dropped.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")

    def to_api(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(_Model):
    type: str
    status: ConditionStatus
    reason: str = ""
    message: str = ""
    last_transition_time: datetime | None = None


def set_condition(
    conditions: list[Condition], type_: str, status: ConditionStatus, reason: str, message: str = ""
) -> list[Condition]:
    """Returns conditions with type_ set; lastTransitionTime moves only when the status changes,
    as in metav1.Condition."""
    old = next((c for c in conditions if c.type == type_), None)
    when = (
        old.last_transition_time
        if old is not None and old.status == status and old.last_transition_time
        else datetime.now(UTC).replace(microsecond=0)
    )
    new = Condition(
        type=type_, status=status, reason=reason, message=message, last_transition_time=when
    )
    return [c for c in conditions if c.type != type_] + [new]


def condition_true(conditions: list[Condition], type_: str) -> bool:
    return any(c.type == type_ and c.status == ConditionStatus.TRUE for c in conditions)


class ObjectMeta(_Model):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str | None = None
    generation: int | None = None
    deletion_timestamp: datetime | None = None
    finalizers: list[str] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


# ---- PodSnapshot ----------------------------------------------------------------------------


class PodRef(_Model):
    name: str
    uid: str | None = None


class SnapshotSource(_Model):
    pod_ref: PodRef
    # v1alpha1 captures exactly one container; the schema enforces maxItems 1.
    containers: list[str] = Field(default_factory=list)


class PodSnapshotSpec(_Model):
    source: SnapshotSource
    keep_source_running: bool = False
    #: how the source is quiesced before its dump (api/quiesce.py); the handshake by default
    quiesce: Quiesce = Field(default_factory=Quiesce)


class ArtifactRef(_Model):
    uri: str
    manifest_digest: str
    size_bytes: int = 0


class SourceInfo(_Model):
    """The source node and its fingerprint (api/host.py), under the CRD's field names
    (``kernelVersion``; ``cudaDriverVersion`` a string). Written and read through
    ``of`` and ``fingerprint`` only."""

    node_name: str = ""
    arch: str | None = None
    kernel_version: str | None = None
    image_digest: str | None = None
    criu_version: str | None = None
    gpus: list[GpuInfo] = Field(default_factory=list)
    driver_version: str | None = None
    cuda_driver_version: str | None = None

    @classmethod
    def of(cls, node_name: str, host: HostFingerprint) -> SourceInfo:
        cuda = str(host.cuda_driver_version) if host.cuda_driver_version else None
        return cls(
            node_name=node_name,
            arch=host.arch,
            kernel_version=host.kernel,
            image_digest=host.image_digest,
            criu_version=host.criu_version,
            driver_version=host.driver_version,
            cuda_driver_version=cuda,
            gpus=list(host.gpus),
        )

    def fingerprint(self) -> HostFingerprint | None:
        """None until the capture recorded one (a status written only with the node)."""
        if not (self.arch and self.kernel_version and self.criu_version):
            return None
        cuda = self.cuda_driver_version
        return HostFingerprint(
            arch=self.arch,
            kernel=self.kernel_version,
            criu_version=self.criu_version,
            driver_version=self.driver_version,
            cuda_driver_version=int(cuda) if cuda and cuda.isdigit() else None,
            gpus=self.gpus,
            image_digest=self.image_digest,
        )


class PodSnapshotStatus(_Model):
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    artifact: ArtifactRef | None = None
    checkpoint_seconds: float | None = None
    source: SourceInfo | None = None

    def not_ready(self, reason: str, message: str) -> PodSnapshotStatus:
        """This status with Ready=False for `reason` (waiting, pending, checkpointing)."""
        conds = set_condition(
            self.conditions, PodSnapshotConditions.READY, ConditionStatus.FALSE, reason, message
        )
        return self.model_copy(update={"conditions": conds})

    def failed(self, reason: str, message: str) -> PodSnapshotStatus:
        """This status with Ready=False and Failed=True, both for `reason`."""
        conds = self.not_ready(reason, message).conditions
        conds = set_condition(
            conds, PodSnapshotConditions.FAILED, ConditionStatus.TRUE, reason, message
        )
        return self.model_copy(update={"conditions": conds})


class PodSnapshotConditions(StrEnum):
    READY = "Ready"
    FAILED = "Failed"


class PodSnapshotReasons(StrEnum):
    """Reasons of the Ready/Failed conditions; the hand-over between the controller and the
    node agent is Ready=False with CHECKPOINT_PENDING and status.source.nodeName set."""

    WAITING_FOR_SOURCE = "WaitingForSource"  # controller: pod not scheduled or not running yet
    CHECKPOINT_PENDING = "CheckpointPending"  # controller -> the agent on the node
    CHECKPOINTING = "Checkpointing"  # agent: at work
    CAPTURED = "Captured"  # agent: Ready
    INVALID_SOURCE = "InvalidSource"  # controller: Failed, the source cannot be captured
    CHECKPOINT_FAILED = "CheckpointFailed"  # agent: Failed, with the engine's error


class PodSnapshot(_Model):
    api_version: str = API_VERSION
    kind: str = "PodSnapshot"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: PodSnapshotSpec
    status: PodSnapshotStatus = Field(default_factory=PodSnapshotStatus)

    @property
    def ready(self) -> bool:
        return self.status.artifact is not None and condition_true(
            self.status.conditions, PodSnapshotConditions.READY
        )

    @property
    def container(self) -> str | None:
        return self.spec.source.containers[0] if self.spec.source.containers else None

    @property
    def ready_reason(self) -> str | None:
        """The Ready condition's reason: where the capture stands (PodSnapshotReasons)."""
        return next(
            (c.reason for c in self.status.conditions if c.type == PodSnapshotConditions.READY),
            None,
        )

    @property
    def node_name(self) -> str | None:
        """The node the controller handed the capture to."""
        return self.status.source.node_name if self.status.source else None


# ---- SnapshotJob ----------------------------------------------------------------------------


class PodSnapshotTemplate(_Model):
    #: left out: the pod template's only container (the CRD refuses it for several)
    target_containers: list[str] | None = None
    quiesce: Quiesce = Field(default_factory=Quiesce)


class SnapshotJobSpec(_Model):
    pod_template: dict[str, Any]
    pod_snapshot_template: PodSnapshotTemplate = Field(default_factory=PodSnapshotTemplate)
    active_deadline_seconds: int = 3600

    @property
    def target_container(self) -> str:
        """The container to capture: the one named, else the template's only one."""
        if self.pod_snapshot_template.target_containers:
            return self.pod_snapshot_template.target_containers[0]
        containers = (self.pod_template.get("spec") or {}).get("containers") or [{}]
        return str(containers[0].get("name", ""))


class SnapshotJobStatus(_Model):
    observed_generation: int | None = None
    pod_snapshot_name: str | None = None
    started_at: datetime | None = None
    completed_at: datetime | None = None
    conditions: list[Condition] = Field(default_factory=list)


class SnapshotJobConditions(StrEnum):
    RUNNING = "Running"
    CAPTURED = "Captured"
    COMPLETED = "Completed"
    FAILED = "Failed"


class SnapshotJob(_Model):
    api_version: str = API_VERSION
    kind: str = "SnapshotJob"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: SnapshotJobSpec
    status: SnapshotJobStatus = Field(default_factory=SnapshotJobStatus)
