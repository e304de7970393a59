"""A restore, from end to end: ``restore(request, restorer)`` runs every phase in order and
returns the report.

    verify    the artifact's binding, manifest, signature, core files (hashed once, used
              from the work directory), credentials
    setup     compat gates, staged images, rootfs diff, network rebinding, host name
    criu      the restorer restores the tree, left stopped: ``criu restore`` (snapshotctl)
              or ``runc restore`` (the shim), tree_access.py
    fill      the memory file written into the tree by many threads, hashed as written
    cuda      the GPU state restored onto the GPUs this container was given
    wake      the workload told (its engine API, or the control directory)

A failure anywhere kills what was restored, has the restorer discard what it made, and
leaves no work directory behind. The engine never calls back into its caller but through the
restorer.

Nothing from the artifact runs before verification passes. Everything CRIU parses (and the
memory index, and the rootfs diff) is read once into the work directory, hashed there, and
used from there. To keep verification off the critical path, the page images (raw memory,
never parsed by CRIU) are hashed while CRIU restores with the tree left stopped, and the
memory file as it is filled in. The tree continues only once every digest matched.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from api.annotations import RestoreOutcome
from api.host import HostFingerprint
from api.manifest import CRIU_DIR, MANIFEST_NAME, FileEntry, Manifest
from api.memory import MEMORY_PAGES, MemoryIndex
from api.report import RestoreReport

from .. import control_files, engine_api, memfill, mounts, procs
from ..artifact import binding
from ..artifact.rootfs import apply_rootfs_diff
from ..artifact.verify import check_digests, copy_verified, plan
from ..compat import allocated_gpus, check, gpu_pairs, host_info
from ..criu import creds, images, memfile, runner
from ..cuda.driver import CudaDriver, proc_gpu_minors
from ..errors import IncompatibleError, SnapshotError, VerificationError
from ..fill_ledger import Ledger
from ..netns import global_addresses, hostname_of, netns_path, rebind_map
from ..progress import Progress
from ..timing import PhaseTimer
from . import workdir
from .restore_request import RestoreRequest
from .tree_access import CriuRestorer, TreeRestorer

log = logging.getLogger(__name__)

#: Memory contents: copied into the process as they are, never interpreted by CRIU.
_PAGE_IMAGE = re.compile(rf"^{CRIU_DIR}/pages-\d+\.img$")
#: How long close() waits for a killed tree's PIDs to be free again.
_REAP_TIMEOUT_S = 10.0


class Restore:
    """One restore: the verified manifest, the staged images, the restored tree."""

    def __init__(
        self, req: RestoreRequest, restorer: TreeRestorer, progress: Progress | None = None
    ) -> None:
        self.req = req
        self.restorer = restorer
        self.progress = progress or Progress(enabled=False)
        self.artifact = req.artifact.absolute()
        self.timer = PhaseTimer(self.progress.phase)
        self.work = workdir.make(req.work_dir)
        self._pool = ThreadPoolExecutor(3)
        self._late: Future | None = None
        self._index: Future[MemoryIndex] | None = None
        self._cuda: Future | None = None
        self.manifest: Manifest | None = None
        self.digest: str | None = None
        self.host: HostFingerprint | None = None
        self.new_ips: list[str] = []
        #: the CRIU images to restore from (a private view of the artifact's)
        self.images: Path = self.work / "images"
        #: the artifact's files but the pages, as they were hashed (copy_verified)
        self.verified: Path = self.work / "verified"
        #: the network namespace the tree is restored into, when it had one of its own
        self.netns: str | None = None
        self.pid: int | None = None
        #: the memory file's manifest entry and its checked index, when the artifact has one
        #: (the index is checked while CRIU restores)
        self.memory: FileEntry | None = None
        self.memory_index: MemoryIndex | None = None
        self.filled: int | None = None  # bytes of the memory file written into the tree
        self._ok = False
        self._restoring = False  # the restorer was called: it may have made something

    def phase(self, name: str) -> contextlib.AbstractContextManager[None]:
        return self.timer.phase(name)

    def run(self) -> RestoreReport:
        """Every phase, in order; close() follows, whatever happened."""
        with self.phase("verify"):
            manifest, pages = self._verify()
        with self.phase("setup"):
            self._gate(manifest)
            # the images rewritten among the verified copies, before the view over the
            # store is made: nothing is written where the store's names show
            self._rebind(manifest)
            self._rename_host()
            self._stage(manifest)
        self._verify_the_rest_meanwhile(manifest, pages)
        with self.phase("criu"):
            self._restoring = True
            try:
                pid = self.restorer.restore(self.images, self.work, self.netns)
            except SnapshotError as e:
                raise self._restore_failed(e) from None
        self._log_criu_share()
        return self._finish(pid)

    # -- before the tree is restored ------------------------------------------------------

    def _verify(self) -> tuple[Manifest, list]:
        """The artifact's binding, manifest and signature, then every file CRIU parses
        copied into the work directory and hashed there, then the credentials its images
        ask for. Returns the manifest and the page images' jobs (hashed later)."""
        req, node = self.req, self.req.node
        # Nothing under a path the pod named is read before it is known to lie in the store
        # (a FIFO there would hang the read).
        bound, store = node.bound, node.settings.store_root
        if bound:
            self.artifact = binding.in_store(self.artifact, store)
            binding.root_only(self.artifact, store)
        # read once: the digest admitted and the manifest planned are of the same bytes
        raw = _read_manifest(self.artifact)
        self.digest = "sha256:" + hashlib.sha256(raw).hexdigest() if raw else "unreadable"
        if bound:
            binding.admitted(self.digest, req.admitted_digest)
        key = node.verify_key()
        if node.settings.signing_required and key is None:
            raise SnapshotError(
                "signed artifacts are required, but no verify key is set "
                "(the node's SNAPSHOT_VERIFY_KEY)"
            )
        with self.timer.step("plan"):  # manifest, signature, paths, sizes
            manifest, problems, jobs = plan(self.artifact, key, raw)
        if problems or manifest is None:
            raise VerificationError(problems)
        if bound:
            binding.for_namespace(manifest, req.namespace or "")
        pages = [j for j in jobs if _PAGE_IMAGE.match(j.entry.path)]
        # the memory file is hashed as it is filled into the tree (memfill.py)
        self.memory = next((j.entry for j in jobs if j.entry.path == MEMORY_PAGES), None)
        # everything but the pages is read once, into the work directory, and used from
        # there: CRIU's core images, the memory index, the rootfs diff
        core = [j for j in jobs if j not in pages and j.entry is not self.memory]
        with self.timer.step("hash-core"):
            problems = copy_verified(core, self.artifact, self.verified, manifest.file_digest)
        if problems:
            raise VerificationError(problems)
        if req.oci_spec is not None:
            # before the page hashing starts: its threads would slow this Python work
            with self.timer.step("creds"):
                why = creds.check(creds.load(self.verified / CRIU_DIR), req.oci_spec)
            if why:
                raise SnapshotError(
                    "the images ask for more privilege than the container's "
                    "spec grants:\n  " + "\n  ".join(why)
                )
        self.manifest = manifest
        return manifest, pages

    def _gate(self, manifest: Manifest) -> None:
        """This host against the one the artifact was made on: CRIU, kernel, GPUs (only
        those the container was given), driver. Opening the CUDA driver starts here and
        overlaps the rest of the restore."""
        req, step = self.req, self.timer.step
        criu = runner.require_version(self.restorer.criu_version())
        with step("host"):  # the GPUs from /proc: no cuInit on the critical path
            host = host_info(None, req.image_digest, manifest.uses_cuda, criu)
        if manifest.uses_cuda:
            # after the host step: cuInit beside it slows its reads of the driver's files
            self._cuda = self._pool.submit(_open_cuda)
            if not host.gpus:  # no /proc inventory: ask CUDA
                with step("host-cuda"):
                    host = host_info(self._driver(), req.image_digest, criu=criu)
        with step("compat"):
            if manifest.uses_cuda:  # only onto the GPUs this container was given
                host.gpus = allocated_gpus(req.oci_spec, host.gpus, proc_gpu_minors())
            if not req.skip_compat and (reasons := check(manifest.compat, host)):
                raise IncompatibleError(reasons)
        self.host = host

    def _stage(self, manifest: Manifest) -> None:
        """CRIU's images in their private view, and the artifact's rootfs diff applied to
        the new container's root."""
        with self.timer.step("stage"):
            pages = [Path(e.path).name for e in manifest.files if _PAGE_IMAGE.match(e.path)]
            workdir.stage_images(
                self.artifact / CRIU_DIR, self.verified / CRIU_DIR, self.work, pages
            )
        if self.req.rootfs is not None:
            with self.timer.step("rootfs"):
                apply_rootfs_diff(self.verified, self.req.rootfs)

    def _rebind(self, manifest: Manifest) -> None:
        """The sockets the source bound to its pod IPs, rewritten in the images to this
        pod's addresses, and CRIU's network lock skipped."""
        req = self.req
        target_ns = netns_path(req.netns) if req.netns else "/proc/self/ns/net"
        if manifest.network.external_netns:
            self.netns = target_ns
            with self.timer.step("addresses"):
                self.new_ips = global_addresses(target_ns)
        mapping = rebind_map(manifest.network.pod_ips, self.new_ips)
        if mapping:
            with self.timer.step("rebind"):
                n = images.rebind(self.verified / CRIU_DIR, self.verified / CRIU_DIR, mapping)
            log.info("rebound %d socket address(es): %s", n, mapping)
        elif req.netns and not manifest.network.external_netns:
            raise SnapshotError(
                "the source shared the host's network namespace; it cannot be restored "
                f"into {req.netns}"
            )
        with self.timer.step("network-lock"):  # no connection comes back: nothing to shield
            images.skip_network_lock(self.verified / CRIU_DIR, self.verified / CRIU_DIR)

    def _rename_host(self) -> None:
        """The images given the host name of the UTS namespace the tree restores into: CRIU
        sets the source's there, and a pod's containers share their sandbox's."""
        if self.req.oci_spec is None:
            return
        with self.timer.step("hostname"):
            hostname = hostname_of(self.req.oci_spec)
            verified = self.verified / CRIU_DIR
            old = hostname and images.rename_host(verified, verified, hostname)
        if old:
            log.info("host name %s given as %s", old, hostname)

    def _verify_the_rest_meanwhile(self, manifest: Manifest, pages: list) -> None:
        """The page images hashed, and the memory index checked, while CRIU restores the
        tree (left stopped): started only now, because their threads take the GIL back after
        every chunk and slowed the Python work above several-fold when they ran beside it.
        The tree continues only once every digest matched (finish)."""
        self._late = self._pool.submit(
            check_digests, pages, manifest.file_digest, None, self.progress.add_bytes
        )
        # the index is first needed by the fill; a range that does not fit the restored
        # mappings kills the tree there
        if self.memory is not None:
            self._index = self._pool.submit(memfile.load_index, self.verified, self.memory.size)

    def _log_criu_share(self) -> None:
        """After the criu phase: how much of it CRIU itself ran (its log's last stamp); the
        rest is the caller's (through runc: its start, cgroups, mounts, the RPC)."""
        own = runner.own_seconds(self.work / "restore.log")
        phase = self.timer.result().get("criu")
        if own is not None and phase is not None:
            log.info("  CRIU itself ran %.3fs of the criu phase's %.3fs", own, phase)

    def _restore_failed(self, e: SnapshotError) -> SnapshotError:
        """The error to report for a failed CRIU restore: when the artifact's pages also fail
        verification, that is the cause worth naming."""
        if self._late is not None and (problems := self._late.result()):
            return VerificationError(problems)
        return e

    # -- after the tree is restored (stopped) ---------------------------------------------
    def _finish(self, pid: int) -> RestoreReport:
        """Continue the restored tree (root ``pid``) once every page verified; restore its
        GPU state; tell the workload. Raises SnapshotError naming the failed phase."""
        assert self.manifest is not None and self._late is not None and self.host is not None
        self.pid = pid
        manifest = self.manifest
        if self.memory is not None and self._index is not None:
            with self.phase("index-wait"):
                self.memory_index = self._index.result()
            with self.phase("fill"):
                filled = self._fill(pid)
            self.filled = filled.bytes
            log.info(
                "filled %.2f GB of memory in %.2fs with %d thread(s) (%d chunk(s) "
                "hashed, %d verified before on this node)",
                filled.bytes / 1e9,
                self.timer.result()["fill"],
                filled.threads,
                filled.hashed,
                filled.trusted,
            )
        with self.phase("verify-wait"):
            if problems := self._late.result():
                raise VerificationError(problems)
            procs.continue_tree(pid)
        if manifest.uses_cuda:
            with self.phase("cuda"):
                pairs = gpu_pairs(manifest.compat, self.host)
                _restore_gpu(self._driver(), manifest, pid, pairs)
        pod_ip = self.new_ips[0] if self.new_ips else (manifest.network.pod_ips or [None])[0]
        with self.phase("wake"):
            if manifest.quiesce is not None and manifest.quiesce.over_http:
                engine_api.wake(manifest.quiesce, f"/proc/{pid}/ns/net")
            elif self.req.control_dir:
                control_files.complete_restore(self.req.control_dir, pod_ip, self.timer.result())
        if self.req.pidfile:
            self.req.pidfile.write_text(f"{pid}\n")
        self._ok = True
        self.progress.done()
        return RestoreReport(
            outcome=RestoreOutcome.RESTORED,
            artifact=str(self.artifact),
            manifestDigest=self.digest,
            pid=pid,
            podIP=pod_ip,
            timings=self.timer.result(),
            fillBytes=self.filled,
        )

    def _fill(self, pid: int) -> memfill.FillResult:
        """The memory file written into the stopped tree by many threads, each chunk hashed
        as it is written (or trusted from this node's ledger)."""
        assert self.manifest is not None and self.memory is not None
        assert self.memory_index is not None
        manifest = self.manifest
        # one descriptor for the ledger's identity and every chunk's read: a swapped parent
        # directory cannot put other bytes behind a trusted mark
        fd = os.open(self.artifact / MEMORY_PAGES, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            ledger = None
            if (ledger_dir := self.req.node.fill_ledger_dir) is not None:
                ledger = Ledger.open(ledger_dir, fd, manifest.file_digest, self.memory.digests)
            return memfill.fill(
                fd,
                manifest.chunk_size,
                self.memory.digests,
                manifest.file_digest,
                self.memory_index.ranges,
                procs.host_pids_by_ns_pid(pid),
                self.req.node.settings.fill_threads or memfill.default_workers(),
                ledger,
            )
        finally:
            os.close(fd)

    def close(self) -> None:
        """Release everything; after a failure, kill the restored tree and return only once
        its PIDs are free again (a retry must not meet CRIU's "Can't fork for PID")."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        if not self._ok and self.pid is not None:
            procs.kill_tree(self.pid, _REAP_TIMEOUT_S)
        if not self._ok and self._restoring:
            try:
                self.restorer.discard()
            except Exception as e:  # the restore's own error is the one to report
                log.error("discarding a failed restore: %s: %s", type(e).__name__, e)
        with contextlib.suppress(OSError):
            mounts.unmount(str(self.images))
        if not self._ok:
            workdir.keep_log(self.work, self.req.log_dir)
        shutil.rmtree(self.work, ignore_errors=True)

    def _driver(self) -> CudaDriver:
        """The CUDA driver opened in the background, or its own error when it could not be."""
        return (self._cuda.result() if self._cuda else None) or CudaDriver()


def restore(
    req: RestoreRequest, restorer: TreeRestorer | None = None, progress: Progress | None = None
) -> RestoreReport:
    """Restore ``req.artifact`` with ``restorer`` (default: ``criu restore`` of a plain
    process tree), every phase in order. Raises SnapshotError naming the failed phase,
    having left nothing behind: no restored process, nothing the restorer made, no work
    directory."""
    r = Restore(req, restorer or CriuRestorer(), progress)
    try:
        return r.run()
    finally:
        r.close()


def _read_manifest(artifact: Path) -> bytes | None:
    try:
        return (artifact / MANIFEST_NAME).read_bytes()
    except OSError:
        return None  # plan reports it


def _open_cuda() -> CudaDriver | None:
    try:
        return CudaDriver()
    except SnapshotError:
        return None  # the CUDA phase reports it, through _driver


def _restore_gpu(
    drv: CudaDriver, manifest: Manifest, root_pid: int, pairs: list[tuple[str, str]]
) -> None:
    by_ns = procs.host_pids_by_ns_pid(root_pid)
    missing = [p for p in manifest.cuda.ns_pids if p not in by_ns]
    if missing:
        raise SnapshotError(f"restored tree lacks the CUDA process(es) {missing}")
    host_pids = [by_ns[p] for p in manifest.cuda.ns_pids]
    for p in host_pids:
        drv.restore(p, pairs)
    for p in host_pids:
        drv.unlock(p)
