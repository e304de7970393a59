"""Restore: verify -> compat gates -> network rebinding -> CRIU restore -> CUDA restore +
unlock -> restore-complete.

Nothing from the artifact runs before verification passes. To keep verification off the
critical path, the page images (raw memory, by far the largest files and never parsed by
CRIU) are hashed while CRIU restores with the tree left stopped; everything CRIU parses is
verified before it starts. The tree continues only once every digest matched. A failure after
CRIU restored the tree kills it, so no half-restored process keeps running.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # cryptography costs ~0.1s to import; only signing needs it
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey


from .. import handshake, mounts, procs
from ..artifact.verify import check_digests, load_manifest, manifest_digest, plan
from ..compat import check, gpu_pairs, host_info
from ..contracts.annotations import RestoreOutcome
from ..contracts.manifest import CRIU_DIR, Manifest
from ..contracts.report import RestoreReport
from ..criu import images, runner
from ..cuda.driver import CudaDriver
from ..errors import IncompatibleError, SnapshotError, VerificationError
from ..netns import global_addresses, netns_path, rebind_map
from ..progress import Progress
from ..timing import PhaseTimer
from .runners import CriuRestorer, Restorer

log = logging.getLogger(__name__)

#: Memory contents: copied into the process as they are, never interpreted by CRIU.
_PAGE_IMAGE = re.compile(rf"^{CRIU_DIR}/pages-\d+\.img$")


@dataclass
class RestoreRequest:
    artifact: Path
    pidfile: Path | None = None
    verify_key: Ed25519PublicKey | None = None
    control_dir: Path | None = None
    #: network namespace to restore into (name under /run/netns or a path); default: ours
    netns: str | None = None
    skip_compat: bool = False
    image_digest: str | None = None
    #: how the tree is restored: CRIU directly, or runc for a container (the shim)
    restorer: Restorer = field(default_factory=CriuRestorer)


def restore(req: RestoreRequest, progress: Progress | None = None) -> RestoreReport:
    """Restore the artifact; return the report (outcome ``restored``) or raise a
    SnapshotError naming the failed phase."""
    progress = progress or Progress(enabled=False)
    timer = PhaseTimer(progress.phase)
    artifact = req.artifact.absolute()
    pool = ThreadPoolExecutor(2)
    work = Path(tempfile.mkdtemp(prefix="snapshot-restore-"))
    pid: int | None = None
    ok = False
    try:
        with timer.phase("verify"):
            # Opening the CUDA driver (cuInit, ~0.2s) overlaps hashing and CRIU. The unverified
            # manifest only decides whether to open it; nothing else is taken from it.
            cuda = pool.submit(_open_cuda, artifact)
            manifest, problems, jobs = plan(artifact, req.verify_key)
            if problems or manifest is None:
                raise VerificationError(problems)
            pages = [j for j in jobs if _PAGE_IMAGE.match(j.entry.path)]
            if problems := check_digests([j for j in jobs if j not in pages]):
                raise VerificationError(problems)
            late: Future = pool.submit(check_digests, pages, None, progress.add_bytes)
            digest = manifest_digest(artifact)
        with timer.phase("setup"):
            runner.require_version()
            # cuInit (in ``cuda``) goes on meanwhile; the gates read the GPUs from /proc
            host = host_info(None, req.image_digest, with_gpus=manifest.uses_cuda)
            if manifest.uses_cuda and not host.gpus:  # no /proc inventory: ask CUDA
                host = host_info(_driver(cuda), image_digest=req.image_digest)
            if not req.skip_compat and (reasons := check(manifest.compat, host)):
                raise IncompatibleError(reasons)
            req.restorer.prepare(artifact, manifest)
            image_dir = _stage_images(artifact / CRIU_DIR, work)
            target_ns = netns_path(req.netns) if req.netns else "/proc/self/ns/net"
            new_ips = global_addresses(target_ns) if manifest.network.external_netns else []
            mapping = rebind_map(manifest.network.pod_ips, new_ips)
            if mapping:
                n = images.rebind(artifact / CRIU_DIR, image_dir, mapping)
                log.info("rebound %d socket address(es): %s", n, mapping)
            elif req.netns and not manifest.network.external_netns:
                raise SnapshotError(
                    "the source shared the host's network namespace; it cannot be restored "
                    f"into {req.netns}"
                )
        with timer.phase("criu"):
            pid = _run_restorer(req.restorer, manifest, image_dir, work, target_ns, late)
        with timer.phase("verify-wait"):
            if problems := late.result():
                raise VerificationError(problems)
            for p in procs.tree(pid):
                os.kill(p, signal.SIGCONT)
        if manifest.uses_cuda:
            with timer.phase("cuda"):
                _restore_gpu(_driver(cuda), manifest, pid, gpu_pairs(manifest.compat, host))
        pod_ip = new_ips[0] if new_ips else (manifest.network.pod_ips or [None])[0]
        with timer.phase("wake"):
            if req.control_dir:
                handshake.complete_restore(req.control_dir, pod_ip, timer.result())
        if req.pidfile:
            req.pidfile.write_text(f"{pid}\n")
        ok = True
    except BaseException:
        if pid is not None:
            _kill_tree(pid)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        _unstage_images(work)
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log.error("restore failed; CRIU work directory kept at %s", work)
    progress.done()
    return RestoreReport(
        outcome=RestoreOutcome.RESTORED,
        artifact=str(artifact),
        manifestDigest=digest,
        pid=pid,
        podIP=pod_ip,
        timings=timer.result(),
    )


def _run_restorer(
    restorer: Restorer, manifest: Manifest, image_dir: Path, work: Path, target_ns: str,
    late: Future,
) -> int:  # fmt: skip
    """Restore with the tree left stopped; return the root's host PID. When restoring fails
    on an artifact whose pages also fail verification, the verification error is the cause
    worth reporting."""
    try:
        return restorer.restore(
            image_dir, work, target_ns if manifest.network.external_netns else None
        )
    except SnapshotError:
        if problems := late.result():
            raise VerificationError(problems) from None
        raise


def _stage_images(src: Path, work: Path) -> Path:
    """A private, writable view of the artifact's images: an overlay mount with the artifact
    as its read-only lower layer. CRIU writes its stats there and rebinding replaces
    files.img, without touching the artifact or copying it. The view holds real files, not
    symlinks: runc's CRIU opens images after entering the container's root, where a symlink
    to the artifact's host path would not resolve. Hard links are the fallback where overlay
    is unavailable."""
    view, upper, scratch = work / "images", work / "upper", work / "ovl-work"
    for d in (view, upper, scratch):
        d.mkdir(parents=True)
    try:
        mounts.mount("overlay", "overlay", str(view),
                     [f"lowerdir={src}", f"upperdir={upper}", f"workdir={scratch}"])  # fmt: skip
    except OSError as e:
        log.warning("overlay over %s failed (%s); linking the images instead", src, e)
        for f in src.iterdir():
            try:
                os.link(f, view / f.name)
            except OSError:
                shutil.copyfile(f, view / f.name)
    return view


def _unstage_images(work: Path) -> None:
    with contextlib.suppress(OSError):
        mounts.unmount(str(work / "images"))


def _driver(cuda: Future) -> CudaDriver:
    """The CUDA driver opened in the background, or its own error when it could not be."""
    return cuda.result() or CudaDriver()


def _open_cuda(artifact: Path) -> CudaDriver | None:
    try:
        return CudaDriver() if load_manifest(artifact).uses_cuda else None
    except SnapshotError:
        return None  # verification or the setup phase reports it properly


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


def _kill_tree(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
