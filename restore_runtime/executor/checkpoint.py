"""Checkpoint: quiesce -> CUDA lock + checkpoint -> CRIU dump -> pack, into one artifact.

Failure at any step leaves no artifact (the staging directory is removed) and leaves the
source running: CRIU resumes the tree when a dump fails, and the GPU state is given back.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # cryptography costs ~0.1s to import; only signing needs it
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


from .. import handshake, procs
from ..artifact.pack import Staging, describe_files, write_manifest
from ..artifact.rootfs_pack import DEFAULT_MAX_BYTES
from ..compat import host_info
from ..contracts.manifest import CHUNK_SIZE, CRIU_DIR, Compat, Cuda, Manifest, Network, Source
from ..criu import runner
from ..criu.sparse import elide_zero_pages
from ..errors import CudaError, SnapshotError
from ..netns import global_addresses
from ..progress import Progress
from ..timing import PhaseTimer
from .runners import CriuDumper, Dumper, RuncContainer, RuncDumper

log = logging.getLogger(__name__)


@dataclass
class CheckpointRequest:
    output: Path
    #: root of the process tree; for a container, taken from runc when not given
    pid: int = 0
    #: a container to checkpoint through runc (else the tree is dumped with CRIU directly)
    runc_container: RuncContainer | None = None
    leave_running: bool = False
    sign_key: Ed25519PrivateKey | None = None
    control_dir: Path | None = None
    handshake_timeout_s: float = 300.0
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


@dataclass
class CheckpointResult:
    path: Path
    manifest: Manifest
    digest: str


class _GpuState:
    """The CUDA processes of the tree, and how far their checkpoint got, so a failure can
    hand the GPU state back to a source that keeps running."""

    def __init__(self) -> None:
        self.pids: list[int] = []
        self.locked: list[int] = []
        self.checkpointed: list[int] = []
        self._drv = None

    @property
    def drv(self):
        if self._drv is None:
            from ..cuda.driver import CudaDriver

            self._drv = CudaDriver()
        return self._drv

    def classify(self, root: int) -> None:
        """Find the tree's CUDA processes. Run after the quiesce, which may end helpers.
        Only processes holding NVIDIA device files can be CUDA processes: ask the driver
        about those alone, so a CPU-only tree never touches it."""
        candidates = procs.cuda_pids(root)
        self.pids = [p for p in candidates if self.drv.is_cuda_process(p)]
        stray = [p for p in candidates if p not in self.pids and procs.maps_nvidia_device(p)]
        if stray:
            raise CudaError(
                f"process(es) {stray} map NVIDIA device memory without a CUDA context of "
                "their own (children forked after CUDA initialisation, such as torch.compile's "
                "worker pool); CRIU cannot dump them. End them when the workload quiesces "
                "(torch: torch._inductor.async_compile.shutdown_compile_workers()) or start "
                "them before CUDA is initialised."
            )

    def suspend(self) -> None:
        for p in self.pids:
            self.drv.lock(p)
            self.locked.append(p)
        for p in self.pids:
            self.drv.checkpoint(p)
            self.checkpointed.append(p)

    def resume(self) -> None:
        for p in self.checkpointed:
            self.drv.restore(p)
        for p in self.locked:
            self.drv.unlock(p)
        self.checkpointed, self.locked = [], []


def checkpoint(req: CheckpointRequest, progress: Progress | None = None) -> CheckpointResult:
    progress = progress or Progress(enabled=False)
    timer = PhaseTimer(progress.phase)
    with timer.phase("setup"):
        if req.runc_container is not None and not req.pid:
            req.pid = req.runc_container.init_pid()
        dumper: Dumper = (RuncDumper(req.runc_container, req.max_rootfs_diff_bytes)
                          if req.runc_container else CriuDumper())  # fmt: skip
        procs.require(req.pid)
        runner.require_version()
        gpu = _GpuState()
        maybe_cuda = bool(procs.cuda_pids(req.pid))
        own_netns = procs.netns_inode(req.pid) != procs.netns_inode("self")
        pod_ips = global_addresses(f"/proc/{req.pid}/ns/net") if own_netns else []
        host = host_info(gpu.drv if maybe_cuda else None, image_digest=req.image_digest)
        command = procs.cmdline(req.pid)
        staging = Staging(req.output)
    log.info("checkpoint of PID %d: own netns=%s, pod IPs %s", req.pid, own_netns, pod_ips)

    quiesced = False
    cuda_ns_pids: list[int] = []
    # CRIU's work files (dump.log, stats) go with the dump, failed or not: a failure's error
    # lines travel in its exception
    scratch = tempfile.TemporaryDirectory(prefix="snapshot-dump-", ignore_cleanup_errors=True)
    with staging, scratch as work_dir:
        work = Path(work_dir)
        try:
            if req.control_dir:
                with timer.phase("quiesce"):
                    handshake.request_checkpoint(req.control_dir, req.handshake_timeout_s)
                quiesced = True
            if maybe_cuda:
                with timer.phase("cuda"):
                    gpu.classify(req.pid)
                    # PIDs inside the namespace survive the restore; host PIDs do not.
                    cuda_ns_pids = [procs.ns_pid(p) for p in gpu.pids]
                    gpu.suspend()
                log.info("CUDA processes checkpointed: %s", gpu.pids)
            images = staging.dir / CRIU_DIR
            images.mkdir()
            with timer.phase("criu"):
                stop_watch = progress.watch_dir(images)
                try:
                    dumper.dump(req.pid, images, work, req.leave_running,
                                procs.netns_inode(req.pid) if own_netns else None)  # fmt: skip
                finally:
                    stop_watch()
        except BaseException:
            _give_back(req, gpu, quiesced)
            raise
        if req.leave_running:
            with timer.phase("resume"):
                _give_back(req, gpu, quiesced)
        with timer.phase("pack"):
            if not req.keep_zero_pages:
                with timer.step("sparse"):
                    sparse = elide_zero_pages(images)
                log.info("left out %d of %d dumped pages: zero pages of private anonymous "
                         "memory", sparse.dropped, sparse.pages)  # fmt: skip
            dumper.pack_extra(staging.dir)
            files = describe_files(staging.dir, CHUNK_SIZE, progress=progress.add_bytes)
        manifest = Manifest(
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
            compat=Compat(
                arch=host.arch,
                kernel=host.kernel,
                criuVersion=host.criu_version,
                driverVersion=host.driver_version,
                cudaDriverVersion=host.cuda_driver_version,
                gpus=_used_gpus(host.gpus, gpu.pids),
                imageDigest=req.image_digest,
            ),
            network=Network(podIPs=pod_ips, hostname=socket.gethostname(), externalNetns=own_netns),
            cuda=Cuda(nsPids=cuda_ns_pids),
            files=files,
            timings=timer.result(),
        )
        digest = write_manifest(staging.dir, manifest, req.sign_key)
        path = staging.commit()
    progress.done()
    return CheckpointResult(path=path, manifest=manifest, digest=digest)


def _used_gpus(gpus, cuda_pids):
    # Every visible GPU is recorded: the CUDA checkpoint API does not say which devices a
    # process touched, and CUDA_VISIBLE_DEVICES already narrows what a container sees.
    return gpus if cuda_pids else []


def _give_back(req: CheckpointRequest, gpu: _GpuState, quiesced: bool) -> None:
    """Let a source that is still alive continue: GPU state back, workload resumed."""
    if not procs.exists(req.pid):
        return
    try:
        gpu.resume()
    except SnapshotError as e:
        log.error("could not hand GPU state back to PID %d: %s", req.pid, e)
    if quiesced and req.control_dir:
        pod_ips = []
        with contextlib.suppress(Exception):
            pod_ips = global_addresses(f"/proc/{req.pid}/ns/net")
        handshake.complete_restore(
            req.control_dir, pod_ips[0] if pod_ips else None, {}, mode="resumed-in-place"
        )
