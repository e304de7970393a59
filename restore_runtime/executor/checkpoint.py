"""Checkpoint: quiesce -> CUDA lock + checkpoint -> CRIU dump -> pack, into one artifact.

Failure at any step leaves no artifact (the staging directory is removed) and leaves the
source running: the dump always leaves the tree running, the GPU state and the workload are
given back, and a source that is not to keep running is ended only after the commit. Death
at any step leaves a journal that executor/recovery.py acts on.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path

from api.handshake import DEFAULT_HANDSHAKE_TIMEOUT_S
from api.host import HostFingerprint
from api.manifest import (
    CHUNK_SIZE,
    CRIU_DIR,
    Cuda,
    Manifest,
    Network,
    Source,
)
from api.memory import MEMORY_PAGES
from api.quiesce import Engine, Quiesce

from .. import control_files, engine_api, procs
from ..artifact.follow import PageFollower, still_valid
from ..artifact.pack import Signer, Staging, describe_files, write_manifest
from ..artifact.rootfs_pack import DEFAULT_MAX_BYTES
from ..compat import host_info
from ..criu import memfile, runner
from ..criu.sparse import elide_zero_pages
from ..errors import SnapshotError
from ..netns import global_addresses
from ..progress import Progress
from ..timing import PhaseTimer
from .recovery import Journal
from .source import GpuState, HeldSource, give_back
from .tree_access import CriuDumper, Dumper, RuncContainer, RuncDumper

log = logging.getLogger(__name__)


@dataclass
class CheckpointRequest:
    output: Path
    #: root of the process tree; for a container, taken from runc when not given
    pid: int = 0
    #: a container to checkpoint through runc (else the tree is dumped with CRIU directly)
    runc_container: RuncContainer | None = None
    leave_running: bool = False
    #: signs manifest.json (artifact/pack.py: Signer); unsigned when None
    signer: Signer | None = None
    control_dir: Path | None = None
    handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S
    #: how the source is quiesced: through its engine's HTTP API, not at all, or (None, or
    #: engine "handshake") the handshake files in ``control_dir``
    quiesce: Quiesce | None = None
    #: optional identity of the source when it is a pod (filled in by the node agent)
    pod: str | None = None
    namespace: str | None = None
    #: the PodSnapshot being captured (recorded in the manifest, for binding)
    pod_snapshot: str | None = None
    pod_snapshot_uid: str | None = None
    container: str | None = None
    image_digest: str | None = None
    #: keep the zero pages CRIU dumped (criu/sparse.py drops them by default)
    keep_zero_pages: bool = False
    #: the most bytes of file content the container's rootfs changes may add to the artifact
    max_rootfs_diff_bytes: int = DEFAULT_MAX_BYTES
    #: move large private anonymous memory out of CRIU's images into the artifact's memory
    #: file, which a restore fills with many threads (criu/memfile.py)
    split_memory: bool = True
    #: hash the page files' chunks while CRIU still writes them (artifact/follow.py)
    follow_pages: bool = True
    #: without ``leave_running``: end the source once the artifact is committed (snapshotctl),
    #: or (False) leave it quiesced and held by the result (``CheckpointResult.held``) until
    #: the caller knows the artifact is durable where the user asked for it (the agent: after
    #: the push and the status write), then ends it or gives it back
    end_at_commit: bool = True

    @property
    def http_quiesce(self) -> Quiesce | None:
        """The profile, when the source is quiesced and woken through its engine's API."""
        return self.quiesce if self.quiesce is not None and self.quiesce.over_http else None


@dataclass
class CheckpointResult:
    path: Path
    manifest: Manifest
    digest: str
    #: the source, quiesced, when the request asked to end it later (``end_at_commit``)
    held: HeldSource | None = None
    #: what could not be given back to a source that keeps running (a wake that failed)
    problems: list[str] = field(default_factory=list)


def checkpoint(req: CheckpointRequest, progress: Progress | None = None) -> CheckpointResult:
    """Any failure, an I/O error of the store included, is one SnapshotError, and the source
    keeps running: the dump always leaves it running, and it is ended (without
    ``leave_running``) only once the artifact is committed."""
    try:
        return _checkpoint(req, progress or Progress(enabled=False))
    except OSError as e:
        where = e.filename or req.output.parent
        raise SnapshotError(
            f"checkpoint failed: {e.strerror or e} ({where}); the source keeps running"
        ) from e


@dataclass
class _Source:
    """The source as found before anything is done to it. Whether it uses CUDA is asked
    only once it is quiesced (``_suspend_cuda``): a workload still starting when the
    checkpoint began (the handshake waits for it) opens the GPU during the quiesce."""

    dumper: Dumper
    gpu: GpuState
    own_netns: bool
    pod_ips: list[str]
    command: list[str]


def _checkpoint(req: CheckpointRequest, progress: Progress) -> CheckpointResult:
    timer = PhaseTimer(progress.phase)
    if req.quiesce is not None and req.quiesce.timeout_seconds > req.handshake_timeout_s:
        # the admin's bound wins over the tenant's profile: slots are held no longer
        bound = max(1, int(req.handshake_timeout_s))
        req.quiesce = req.quiesce.model_copy(update={"timeout_seconds": bound})
    with timer.phase("setup"):
        src = _find_source(req)
        staging = Staging(req.output)
    log.info("checkpoint of PID %d: own netns=%s, pod IPs %s", req.pid, src.own_netns, src.pod_ips)
    problems: list[str] = []
    held: HeldSource | None = None
    with staging, _InFlight(req, staging.dir) as inflight:
        try:
            _quiesce(req, timer, inflight)
            cuda_ns_pids, host = _suspend_cuda(req, src, timer, inflight)
            early = _dump(req, src, staging.dir / CRIU_DIR, inflight.work, timer, progress)
            if req.leave_running:
                with timer.phase("resume"):
                    problems += give_back(req, src.gpu, inflight.quiesced)
                    inflight.quiesced = False
            with timer.phase("pack"):
                files = _pack(req, staging.dir, src.dumper, timer, progress, early)
            manifest = _manifest(
                req,
                host,
                src.command,
                src.own_netns,
                src.pod_ips,
                cuda_ns_pids,
                src.gpu.pids,
                files,
                timer,
            )
            digest = write_manifest(staging.dir, manifest, req.signer)
            path = staging.commit()
        except BaseException:
            give_back(req, src.gpu, inflight.quiesced)
            raise
        if not req.leave_running:
            held = HeldSource(req, src.dumper, src.gpu, inflight.quiesced, inflight.path)
            if req.end_at_commit:
                problems += held.end()
                held = None
            else:
                inflight.keep_journal = True
    progress.done()
    return CheckpointResult(
        path=path, manifest=manifest, digest=digest, held=held, problems=problems
    )


def _find_source(req: CheckpointRequest) -> _Source:
    """The source's PID, its dumper, its GPU use, network and host (the setup phase)."""
    if req.runc_container is not None and not req.pid:
        req.pid = req.runc_container.init_pid()
    dumper: Dumper = (
        RuncDumper(req.runc_container, req.max_rootfs_diff_bytes)
        if req.runc_container
        else CriuDumper()
    )
    procs.require(req.pid)
    runner.require_version()
    own_netns = procs.netns_inode(req.pid) != procs.netns_inode("self")
    pod_ips = global_addresses(f"/proc/{req.pid}/ns/net") if own_netns else []
    return _Source(dumper, GpuState(), own_netns, pod_ips, procs.cmdline(req.pid))


def _suspend_cuda(
    req: CheckpointRequest, src: _Source, timer: PhaseTimer, inflight: _InFlight
) -> tuple[list[int], HostFingerprint]:
    """The quiesced tree's CUDA processes, their GPU state moved into their host memory;
    their namespace PIDs (which survive the restore, host PIDs do not), and the host's
    fingerprint (with the driver's, when the tree uses it)."""
    if not procs.cuda_pids(req.pid):
        return [], host_info(None, image_digest=req.image_digest)
    with timer.phase("cuda"):  # the driver's facts too: opening it is this phase's cost
        host = host_info(src.gpu.drv, image_digest=req.image_digest)
        src.gpu.classify(req.pid)
        inflight.note_cuda(src.gpu.pids)
        cuda_ns_pids = [procs.ns_pid(p) for p in src.gpu.pids]
        src.gpu.suspend()
    log.info("CUDA processes checkpointed: %s", src.gpu.pids)
    return cuda_ns_pids, host


def _dump(
    req: CheckpointRequest,
    src: _Source,
    images: Path,
    work: Path,
    timer: PhaseTimer,
    progress: Progress,
) -> dict[str, dict[int, str]]:
    """The tree dumped into ``images``, always left running: the source must outlive any
    failure up to the commit, so the dump never ends it (HeldSource.end does). Returns the
    digests of the page files' chunks hashed as CRIU wrote them (artifact/follow.py)."""
    images.mkdir()
    follower = PageFollower(images, CHUNK_SIZE) if req.split_memory and req.follow_pages else None
    with timer.phase("criu"), follower or contextlib.nullcontext():
        stop_watch = progress.watch_dir(images)
        try:
            src.dumper.dump(
                req.pid, images, work, True, procs.netns_inode(req.pid) if src.own_netns else None
            )
        finally:
            stop_watch()
        return follower.stop() if follower else {}


def _quiesce(req: CheckpointRequest, timer: PhaseTimer, inflight: _InFlight) -> None:
    """The workload quiesced as its profile says: through its engine's API, the handshake
    files, or not at all. From the first call on, it may be quiesced: a failure wakes it."""
    if req.http_quiesce is not None:
        inflight.quiesced = True
        with timer.phase("quiesce"):
            engine_api.quiesce(req.http_quiesce, f"/proc/{req.pid}/ns/net")
    elif req.control_dir and _engine(req) == Engine.HANDSHAKE:
        inflight.quiesced = True
        with timer.phase("quiesce"):
            control_files.request_checkpoint(req.control_dir, req.handshake_timeout_s)


def _pack(
    req: CheckpointRequest,
    root: Path,
    dumper: Dumper,
    timer: PhaseTimer,
    progress: Progress,
    early: dict[str, dict[int, str]],
):
    """The bulk first, by a rename; the zero-page pass then reads only what stays with CRIU,
    and the memory file's zero blocks become holes as it is hashed, on every core, but for
    the chunks hashed during the dump (``early``) that the split left alone. Returns every
    file's digests."""
    images = root / CRIU_DIR
    known: dict[int, str] = {}
    if req.split_memory:
        with timer.step("memfile"):
            moved = memfile.split(images, root)
        known = still_valid(
            early.get(moved.source, {}), CHUNK_SIZE, moved.source_size, moved.changed
        )
        log.info(
            "moved %d range(s), %.2f GB, into the memory file (%d chunk(s) hashed during the dump)",
            moved.ranges,
            moved.bytes / 1e9,
            len(known),
        )
    if not req.keep_zero_pages:
        with timer.step("sparse"):
            sparse = elide_zero_pages(images)
        log.info(
            "left out %d of %d dumped pages: zero pages of private anonymous memory",
            sparse.dropped,
            sparse.pages,
        )
    dumper.pack_extra(root)
    with timer.step("hash"):
        return _describe(root, progress, known)


def _describe(root: Path, progress: Progress, known: dict[int, str]):
    """Every file's digests. The memory file first: its zero blocks become holes as it is
    hashed, and the index then leaves them out (a restore writes only data); the index is
    hashed after that."""
    memory = None
    if (root / MEMORY_PAGES).exists():
        memory = describe_files(
            root,
            CHUNK_SIZE,
            progress=progress.add_bytes,
            holes=frozenset({MEMORY_PAGES}),
            only=frozenset({MEMORY_PAGES}),
            known_chunks={MEMORY_PAGES: known},
        )
        skipped = memfile.drop_holes(root)
        log.info("the memory file's zero blocks: %.2f GB, left out of its index", skipped / 1e9)
    return describe_files(root, CHUNK_SIZE, progress=progress.add_bytes, known=memory)


class _InFlight:
    """The checkpoint's journal (executor/recovery.py) and CRIU's scratch directory, beside
    the staging directory: a checkpoint that dies leaves both where the next agent start
    finds them (the scratch matches the staging glob), never a stray directory in /tmp."""

    def __init__(self, req: CheckpointRequest, staging: Path) -> None:
        self.work = staging.with_name(f"{staging.name}-work")
        self.path = Journal.path_for(staging)
        rc = req.runc_container
        self.journal = Journal(
            pid=req.pid,
            start_time=procs.start_time(req.pid) or 0,
            staging=staging.name,
            runc_root=str(rc.root) if rc else None,
            runc_binary=rc.binary if rc else None,
            container_id=rc.id if rc else None,
            control_dir=str(req.control_dir) if req.control_dir else None,
            pod_snapshot_uid=req.pod_snapshot_uid,
            quiesce=q.model_dump(mode="json") if (q := req.http_quiesce) else None,
        )
        self.quiesced = False
        #: the source is held past the commit (HeldSource): its journal goes with it
        self.keep_journal = False

    def note_cuda(self, pids: list[int]) -> None:
        """The CUDA processes about to be locked: a later agent hands their GPU state back."""
        self.journal.cuda_pids = list(pids)
        self.journal.write(self.path)

    def __enter__(self) -> _InFlight:
        self.journal.write(self.path)
        self.work.mkdir(mode=0o700)
        return self

    def __exit__(self, *exc) -> None:
        # CRIU's work files (dump.log, stats) go with the dump, failed or not: a failure's
        # error lines travel in its exception
        shutil.rmtree(self.work, ignore_errors=True)
        if not self.keep_journal:
            self.path.unlink(missing_ok=True)


def _manifest(
    req: CheckpointRequest,
    host: HostFingerprint,
    command: list[str],
    own_netns: bool,
    pod_ips: list[str],
    cuda_ns_pids: list[int],
    cuda_pids: list[int],
    files,
    timer: PhaseTimer,
) -> Manifest:
    return Manifest(
        source=Source(
            pid=req.pid,
            hostname=socket.gethostname(),
            command=command,
            pod=req.pod,
            namespace=req.namespace,
            podSnapshot=req.pod_snapshot,
            podSnapshotUid=req.pod_snapshot_uid,
            container=req.container,
        ),
        # this host, with the GPUs the tree used (a restore needs those only)
        compat=host.model_copy(
            update={"gpus": _used_gpus(host.gpus, cuda_pids), "image_digest": req.image_digest}
        ),
        network=Network(podIPs=pod_ips, hostname=socket.gethostname(), externalNetns=own_netns),
        cuda=Cuda(nsPids=cuda_ns_pids),
        files=files,
        timings=timer.result(),
        quiesce=req.quiesce if _engine(req) != Engine.HANDSHAKE else None,
    )


def _engine(req: CheckpointRequest) -> Engine:
    return req.quiesce.engine if req.quiesce else Engine.HANDSHAKE


def _used_gpus(gpus, cuda_pids):
    # Every visible GPU is recorded: the CUDA checkpoint API does not say which devices a
    # process touched, and CUDA_VISIBLE_DEVICES already narrows what a container sees.
    return gpus if cuda_pids else []
