"""A checkpoint is a transaction over its source: whatever kills it, the source ends up
serving. A checkpoint that dies (an agent OOM-killed or evicted, ``snapshotctl`` killed) can
leave its source quiesced (waiting for ``restore-complete``), its GPU state locked or
checkpointed, or its cgroup frozen by a CRIU that died mid-dump. Nothing in the source
undoes that by itself.

So each checkpoint writes a journal beside its staging directory before it touches the
source, and removes it once the source is either given back or ended after the commit. The
next start of the agent (or ``snapshotctl recover``) reads what journals remain and gives
their sources back: thaws the container, restores and unlocks its CUDA processes, tells a
quiesced workload it runs again in place. Each step checks what the node shows, so it is
safe at any moment and safe to repeat."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from api.handshake import CHECKPOINT_REQUESTED, READY_FOR_SNAPSHOT, atomic_write
from api.quiesce import Quiesce

from .. import control_files, engine_api, procs
from ..artifact.pack import CACHE_DIR
from ..errors import SnapshotError
from ..netns import global_addresses
from .tree_access import RuncContainer

log = logging.getLogger(__name__)

JOURNAL_GLOB = ".*.inflight-*.json"


@dataclass
class Journal:
    """What a checkpoint in flight holds of its source."""

    pid: int
    #: the source's start time: a PID reused by another process is never touched
    start_time: int
    #: the staging (and scratch) directories of the checkpoint, beside the journal
    staging: str
    runc_root: str | None = None
    runc_binary: str | None = None
    container_id: str | None = None
    control_dir: str | None = None
    #: processes that may hold CUDA state the checkpoint locks or checkpoints
    cuda_pids: list[int] = field(default_factory=list)
    pod_snapshot_uid: str | None = None
    #: an engine profile quiesced through its API (api/quiesce.py, as JSON): woken through it
    quiesce: dict | None = None

    @staticmethod
    def path_for(staging: Path) -> Path:
        # ".NAME.staging-ID" -> ".NAME.inflight-ID.json": never matched by the staging glob
        return staging.with_name(staging.name.replace(".staging-", ".inflight-", 1) + ".json")

    def write(self, path: Path) -> None:
        atomic_write(path, json.dumps(asdict(self)).encode())

    @classmethod
    def read(cls, path: Path) -> Journal:
        data = json.loads(path.read_bytes())
        return cls(**data)


@dataclass
class Recovered:
    journal: Path
    pod_snapshot_uid: str | None
    #: what was done (or could not be), one phrase each
    actions: list[str]

    @property
    def summary(self) -> str:
        return "; ".join(self.actions) or "nothing to give back"


def journals(store: Path) -> list[Path]:
    nested = (p for p in store.glob(f"*/{JOURNAL_GLOB}") if p.parent.name != CACHE_DIR)
    return sorted([*store.glob(JOURNAL_GLOB), *nested])


def recover_interrupted(store: Path) -> list[Recovered]:
    """Give back the sources of every checkpoint that died under ``store``, then remove what
    those checkpoints wrote. Call only while no checkpoint runs (the agent, at start)."""
    out = []
    for path in journals(store):
        try:
            j = Journal.read(path)
        except (OSError, ValueError, TypeError) as e:
            log.error("unreadable checkpoint journal %s (%s): removed", path, e)
            path.unlink(missing_ok=True)
            continue
        actions = give_back(j)
        for d in (path.parent / j.staging, path.parent / f"{j.staging}-work"):
            shutil.rmtree(d, ignore_errors=True)
        path.unlink(missing_ok=True)
        log.warning("interrupted checkpoint of PID %d: %s", j.pid, "; ".join(actions))
        out.append(Recovered(path, j.pod_snapshot_uid, actions))
    return out


def give_back(j: Journal) -> list[str]:
    """Thaw, hand the GPU back, resume the workload; each only where the node shows it is
    needed."""
    if procs.start_time(j.pid) != j.start_time:
        return [f"the source (PID {j.pid}) is gone"]
    actions: list[str] = []
    if j.container_id and j.runc_root:
        actions += _thaw_container(
            RuncContainer(Path(j.runc_root), j.container_id, j.runc_binary or "runc")
        )
    else:
        procs.continue_tree(j.pid)
    actions += _resume_cuda(j.cuda_pids)
    q = Quiesce.model_validate(j.quiesce) if j.quiesce is not None else None
    control = Path(j.control_dir) if j.control_dir else None
    if q is not None or (control is not None and _quiesced(control)):
        try:
            actions.append(resume_in_place(j.pid, q, control))
        except SnapshotError as e:
            actions.append(f"could not wake {q.engine if q else 'it'} through its API: {e}")
    return actions


def resume_in_place(pid: int, quiesce: Quiesce | None, control_dir: Path | None) -> str:
    """Tell a quiesced source, still alive, that it runs again where it is: through its
    engine's API (``quiesce``, a profile over HTTP), else the handshake files in
    ``control_dir``. Says what was done; SnapshotError when the engine will not wake."""
    if quiesce is not None and quiesce.over_http:
        engine_api.wake(quiesce, f"/proc/{pid}/ns/net")
        return f"woke {quiesce.engine} through its API"
    if control_dir is None:
        return "nothing to resume"
    ips: list[str] = []
    with contextlib.suppress(Exception):
        ips = global_addresses(f"/proc/{pid}/ns/net")
    control_files.complete_restore(
        control_dir, ips[0] if ips else None, {}, mode="resumed-in-place"
    )
    return "resumed the quiesced workload in place"


def _thaw_container(c: RuncContainer) -> list[str]:
    # a CRIU killed mid-dump leaves the freezer cgroup frozen: runc reads that as paused
    try:
        if c.state().get("status") != "paused":
            return []
        c.resume()
    except SnapshotError as e:
        return [f"could not thaw container {c.id[:12]}: {e}"]
    return [f"thawed container {c.id[:12]}"]


def _resume_cuda(pids: list[int]) -> list[str]:
    live = [p for p in pids if procs.exists(p)]
    if not live:
        return []
    from ..cuda.driver import CudaDriver

    out = []
    try:
        drv = CudaDriver()
    except SnapshotError as e:
        return [f"could not check CUDA state of {live}: {e}"]
    for p in live:
        try:
            if not drv.is_cuda_process(p):
                continue
            st = drv.state(p)
            if st == "checkpointed":
                drv.restore(p)
                st = "locked"
            if st == "locked":
                drv.unlock(p)
                out.append(f"handed GPU state back to PID {p}")
        except SnapshotError as e:
            out.append(f"could not hand GPU state back to PID {p}: {e}")
    return out


def _quiesced(control: Path) -> bool:
    return any(os.path.lexists(control / n) for n in (CHECKPOINT_REQUESTED, READY_FOR_SNAPSHOT))
