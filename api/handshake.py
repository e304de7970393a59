"""The workload handshake: file names in the control directory and the restore-complete
payload. Standard library only, because workloads import it (through
``restore_runtime.workload``) and must not pay for pydantic or CUDA bindings."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

CONTROL_DIR_ENV = "SNAPSHOT_CONTROL_DIR"
DEFAULT_CONTROL_DIR = "/snapshot-control"

#: where the kubelet keeps a pod's emptyDir volumes, under its root directory
EMPTY_DIR_PLUGIN = "kubernetes.io~empty-dir"


def pod_empty_dir(kubelet_root: Path, pod_uid: str, volume: str) -> Path:
    """The host path of emptyDir ``volume`` of pod ``pod_uid``, as the kubelet lays it out."""
    return kubelet_root / "pods" / pod_uid / "volumes" / EMPTY_DIR_PLUGIN / volume


def is_pod_empty_dir(path: Path, pod_uid: str) -> bool:
    """Whether ``path`` is one of pod ``pod_uid``'s own emptyDir volumes."""
    parts = Path(os.path.normpath(path)).parts
    return len(parts) >= 6 and list(parts[-5:-1]) == ["pods", pod_uid, "volumes", EMPTY_DIR_PLUGIN]


CHECKPOINT_REQUESTED = "checkpoint-requested"  # agent -> workload: quiesce now
READY_FOR_SNAPSHOT = "ready-for-snapshot"  # workload -> agent: quiesced
RESTORE_COMPLETE = "restore-complete"  # shim/agent -> workload: resume
RESTORE_REPORT = "restore-report.json"  # shim/agent -> operators: what happened
#: how long a checkpoint waits for the workload to quiesce (the chart's
#: agent.handshakeTimeoutSeconds)
DEFAULT_HANDSHAKE_TIMEOUT_S = 300.0


@dataclass
class RestoreComplete:
    pod_ip: str | None
    hostname: str
    restored_at: str
    timings: dict[str, float] = field(default_factory=dict)
    #: "restored" after a restore; "resumed-in-place" for a source left running
    mode: str = "restored"

    def to_json(self) -> bytes:
        d = asdict(self)
        return json.dumps(
            {
                "podIP": d["pod_ip"],
                "hostname": d["hostname"],
                "restoredAt": d["restored_at"],
                "timings": d["timings"],
                "mode": d["mode"],
            }
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> RestoreComplete:
        d = json.loads(data)
        return cls(
            pod_ip=d.get("podIP"),
            hostname=d.get("hostname", ""),
            restored_at=d.get("restoredAt", ""),
            timings=d.get("timings", {}),
            mode=d.get("mode", "restored"),
        )


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write via a temporary file in the same directory, then rename: a reader sees either
    nothing or the whole file. Readable by all by default: the workload may run as any user
    (the file holds no secret), while only its writer may change it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def control_dir_from_env() -> Path:
    return Path(os.environ.get(CONTROL_DIR_ENV, DEFAULT_CONTROL_DIR))
