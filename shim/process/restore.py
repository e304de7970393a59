"""The restore path of a container whose OCI annotations name an artifact: what its spec
says (``RestoreTarget``), the artifact pulled when it lives in a registry, one call to the
engine (``restore_runtime.executor.restore``, which runs every phase with a runc restorer on
this shim's loop), and the report written.

The fallback/strict decision is the process state's (``states.CreatedFromArtifact``); this
module restores, and reports what happened (control directory and shim log)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from api import annotations as ann
from api.handshake import (
    CONTROL_DIR_ENV,
    DEFAULT_CONTROL_DIR,
    is_pod_empty_dir,
)
from restore_runtime.errors import SnapshotError

if TYPE_CHECKING:  # pydantic costs ~0.1 s to import: a plain pod's shim never needs it
    from api.report import RestoreReport
    from restore_runtime.node import NodeContext

log = logging.getLogger(__name__)


class RestoreFailed(Exception):
    """The restore did not happen; ``phase`` and the message say why."""

    def __init__(self, phase: str, reason: str) -> None:
        self.phase, self.reason = phase, reason
        super().__init__(f"restore failed in {phase}: {reason}")

    @classmethod
    def of(cls, e: BaseException) -> RestoreFailed:
        if isinstance(e, SnapshotError):
            return cls(e.phase, str(e))
        return cls("setup", f"{type(e).__name__}: {e}")


@dataclass(frozen=True)
class RestoreTarget:
    """What a container's OCI spec says about its restore."""

    annotations: ann.RestoreAnnotations
    #: the artifact as admitted: a path in the node's store (file://), or oci://…
    uri: str
    control_dir: Path | None
    netns: str | None
    #: the pod's namespace (from the CRI's OCI annotations): the artifact must be made there
    namespace: str
    spec: dict

    @property
    def policy(self) -> ann.RestorePolicy:
        return self.annotations.policy

    @property
    def image_digest(self) -> str | None:
        """The image's digest when the pod names its image by digest (``name@sha256:…``):
        the artifact must then come from that same image. A tag says nothing for sure."""
        ref = (self.spec.get("annotations") or {}).get(ann.IMAGE_NAME, "")
        return ref.rsplit("@", 1)[-1] if "@" in ref else None

    @classmethod
    def from_spec(cls, spec: dict) -> RestoreTarget | None:
        """None for a container that starts normally (no artifact, the pod's sandbox, or
        another container of a restored pod). AnnotationError for values outside their set:
        the shim follows the same rules as the webhook."""
        a = spec.get("annotations") or {}
        if a.get(ann.CONTAINER_TYPE) == "sandbox" or not a.get(ann.ARTIFACT):
            return None  # nothing to restore: the other annotations do not matter then
        parsed = ann.RestoreAnnotations.parse(a)
        name = a.get(ann.CONTAINER_NAME)
        if parsed.container and name and parsed.container != name:
            return None
        # A restart starts cold under fallback; under strict nothing ever cold-starts, so each
        # restart restores again (and a failure shows in the kubelet's back-off)
        restarted = a.get(ann.RESTART_COUNT, "0") != "0"
        if restarted and parsed.policy is ann.RestorePolicy.FALLBACK:
            log.info("container %s restarted (count %s): a cold start", name, a[ann.RESTART_COUNT])
            return None
        namespace = a.get(ann.SANDBOX_NAMESPACE) or a.get(ann.POD_NAMESPACE) or ""
        return cls(
            parsed, parsed.artifact or "", control_dir(spec), netns_path(spec), namespace, spec
        )

    async def local_artifact(self, node: NodeContext) -> tuple[Path, dict[str, float]]:
        """The artifact's directory on this node: the store path itself, or the node cache's
        copy of an OCI artifact, pulled first on a cache miss (timed as phase ``pull``)."""
        if not self.uri.startswith("oci://"):
            return Path(self.uri.removeprefix("file://")), {}
        from restore_runtime.artifact.oci import OciRef

        digest = self.annotations.manifest_digest
        if digest is None:
            raise RestoreFailed("pull", "no admitted manifest digest to pull the artifact by")
        t0 = time.monotonic()
        try:
            path, pulled = await asyncio.to_thread(
                node.artifact_cache().fetch,
                OciRef.parse(self.uri),
                digest,
                node.settings.oci_pull_timeout_s,
            )
        except (SnapshotError, ValueError, OSError) as e:
            raise RestoreFailed("pull", f"pulling {self.uri}: {e}") from e
        log.info("artifact %s: %s", self.uri, f"pulled into {path}" if pulled else "cached")
        return path, ({"pull": round(time.monotonic() - t0, 3)} if pulled else {})

    def report(self, report: RestoreReport) -> None:
        from restore_runtime import control_files

        log.info("restore report for %s: %s", self.uri, report.to_json().decode())
        if self.control_dir is not None:
            try:
                control_files.write_report(self.control_dir, report)
            except OSError as e:
                log.error("cannot write the restore report to %s: %s", self.control_dir, e)

    def report_failure(self, e: RestoreFailed, outcome: ann.RestoreOutcome) -> None:
        from api.report import RestoreReport

        self.report(
            RestoreReport(outcome=outcome, artifact=self.uri, reason=e.reason, failedPhase=e.phase)
        )


def control_dir(spec: dict) -> Path | None:
    """The host path of the volume mounted at $SNAPSHOT_CONTROL_DIR in the container, where
    the shim writes and removes files as root: for a pod, only one of the pod's own emptyDir
    volumes (the tenant chooses the variable and the mounts: a volume of another pod, or a
    host path, is not the shim's to write), and never a read-only mount."""
    env = dict(e.split("=", 1) for e in (spec.get("process") or {}).get("env", []) if "=" in e)
    dest = env.get(CONTROL_DIR_ENV, DEFAULT_CONTROL_DIR)
    uid = (spec.get("annotations") or {}).get(ann.SANDBOX_UID)
    for m in spec.get("mounts") or []:
        if m.get("destination") != dest or not m.get("source"):
            continue
        source = Path(m["source"])
        if "ro" in (m.get("options") or []):
            log.warning("control directory %s is mounted read-only: not used", source)
        elif uid is not None and not is_pod_empty_dir(source, uid):
            log.warning("control directory %s is not an emptyDir of pod %s: not used", source, uid)
        else:
            return source
    return None


def netns_path(spec: dict) -> str | None:
    for ns in (spec.get("linux") or {}).get("namespaces") or []:
        if ns.get("type") == "network" and ns.get("path"):
            return ns["path"]
    return None


def wants_warm_up(spec: dict) -> bool:
    """Whether the shim started for this bundle should load the engine before it is asked
    to: a container that restores, or a pod's sandbox (the webhook gives the pod this
    runtime only because it restores, and its container's create comes seconds later)."""
    try:
        return (spec.get("annotations") or {}).get(ann.CONTAINER_TYPE) == "sandbox" or (
            RestoreTarget.from_spec(spec) is not None
        )
    except ann.AnnotationError:
        return False  # the create will refuse it, with the reason


def _load_engine(node: NodeContext) -> None:
    # ~0.1 s, most of it pydantic and the manifest's models; the key ~0.1 s more (cryptography)
    from restore_runtime import netns
    from restore_runtime.criu import images
    from restore_runtime.executor import restore as _  # noqa: F401

    from . import io as _io  # noqa: F401

    node.verify_key()
    # left to the restore, this import was 0.047 s of its verify phase on an H100 node
    images.preload()
    # the pod's addresses, read in its setup phase: pyroute2's import was most of that phase
    # on the 2-core VM (0.1-0.2 s)
    netns.preload()


async def warm_up(node: NodeContext) -> None:
    """Load the engine and read CRIU's version off the restore's path: started when the shim
    starts serving, it runs while the kubelet pulls images and sets the pod up (a create
    that comes first waits for the same imports, and loses nothing)."""
    t0 = time.monotonic()
    assert node.runc is not None
    try:
        # CRIU's version is read while the imports run: the restore asks for it first thing
        await asyncio.gather(asyncio.to_thread(_load_engine, node), node.runc.criu_version())
    except Exception as e:  # the restore meets the same error, and reports it
        log.warning("warm-up: %s: %s", type(e).__name__, e)
        return
    log.info("engine loaded in %.3fs, ahead of the restore", time.monotonic() - t0)


async def restore_init(p, t: RestoreTarget, node: NodeContext) -> RestoreReport:
    """Restore init process ``p`` (an InitProcess, not yet created) from ``t``: one call to
    the engine, which runs every phase with a runc restorer onto the container's stdio. On
    success ``p`` runs with its pid set. Raises RestoreFailed, having left nothing behind:
    no runc container, no restored process, no work directory."""
    # The engine is imported by restoring containers only: plain pods stay light.
    from restore_runtime.executor.restore import RestoreRequest, restore
    from restore_runtime.executor.tree_access import RuncRestorer

    from .io import ProcessIO

    if p.stdio.terminal:
        raise RestoreFailed("setup", "restoring a container with a terminal (tty) is not supported")
    artifact, pull_timings = await t.local_artifact(node)
    req = RestoreRequest(
        artifact=artifact,
        node=node,
        namespace=t.namespace,
        admitted_digest=t.annotations.manifest_digest,
        control_dir=t.control_dir,
        netns=t.netns,
        skip_compat=t.annotations.skip_compat,
        image_digest=t.image_digest,
        rootfs=p.bundle / "rootfs",
        oci_spec=t.spec,
        log_dir=p.workdir,
        work_dir=p.workdir / "restore",
    )
    try:
        p.io = await ProcessIO.open(p.stdio)
        restorer = RuncRestorer(
            p.runc, p.container_id, p.bundle, p.pidfile, p.io.child, loop=asyncio.get_running_loop()
        )
        report = await asyncio.to_thread(restore, req, restorer)
    except Exception as e:
        # its copies keep containerd's FIFOs until a cold start takes them over, or the
        # start fails (CreatedFromArtifact.start)
        p.failed_io, p.io = p.io, None
        raise RestoreFailed.of(e) from e
    p.io.after_start()
    p.pid = report.pid or 0
    return report.model_copy(update={"timings": {**pull_timings, **report.timings}})
