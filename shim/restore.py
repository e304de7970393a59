"""The restore path: Start of a container whose OCI annotations name an artifact.

verify -> compat gates -> rootfs diff -> network rebinding -> ``runc restore`` (CRIU) into the
new pod's namespaces and cgroups -> CUDA restore + unlock -> ``restore-complete``. The engine
(restore_runtime.executor.restore) runs the sequence; this module plugs runc in and applies
the policy: under ``fallback`` (the default) any failure cold-starts the same container,
under ``strict`` the start fails with the reason. Either way a restore report (outcome,
reason, phase timings) goes to the control directory and the shim log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from pathlib import Path

from restore_runtime.contracts import annotations as ann
from restore_runtime.contracts.handshake import CONTROL_DIR_ENV, DEFAULT_CONTROL_DIR

from .process.io import ProcessIO
from .process.process import InitProcess
from .runc.driver import RuncError
from .ttrpc.codes import Code, RPCError

log = logging.getLogger(__name__)
CONTAINER_NAME = "io.kubernetes.cri.container-name"
CONTAINER_TYPE = "io.kubernetes.cri.container-type"
# Established connections cannot follow the pod to its new address; clients reconnect. The
# tree stays stopped until the engine has verified every page image.
CRIU_CONFIG = "tcp-close\nleave-stopped\n"


def make_restorer(init: InitProcess, spec: dict) -> ShimRestorer | None:
    a = spec.get("annotations") or {}
    if ann.ARTIFACT not in a or a.get(CONTAINER_TYPE) == "sandbox":
        return None
    wanted, name = a.get(ann.CONTAINER), a.get(CONTAINER_NAME)
    if wanted and name and wanted != name:
        return None  # another container of a restored pod: it starts normally
    return ShimRestorer(init, spec)


VERIFY_KEY_ENV = "SNAPSHOT_VERIFY_KEY"


def verify_key():
    """The Ed25519 public key that restores require a signature from ($SNAPSHOT_VERIFY_KEY,
    a PEM file; the node installer sets it when the chart has a signing key). Unset: no
    signature is required, the digests still are. A key that cannot be read fails the
    restore: unverifiable is not unsigned."""
    path = os.environ.get(VERIFY_KEY_ENV)
    if not path:
        return None
    from restore_runtime.artifact import signing

    return signing.load_public_key(Path(path))


def artifact_path(uri: str) -> Path:
    return Path(uri.removeprefix("file://"))


def control_dir(spec: dict) -> Path | None:
    """The host path of the volume mounted at $SNAPSHOT_CONTROL_DIR in the container."""
    env = dict(e.split("=", 1) for e in (spec.get("process") or {}).get("env", []) if "=" in e)
    dest = env.get(CONTROL_DIR_ENV, DEFAULT_CONTROL_DIR)
    for m in spec.get("mounts") or []:
        if m.get("destination") == dest and m.get("source"):
            return Path(m["source"])
    return None


def netns_path(spec: dict) -> str | None:
    for ns in (spec.get("linux") or {}).get("namespaces") or []:
        if ns.get("type") == "network" and ns.get("path"):
            return ns["path"]
    return None


class RuncRestorer:
    """The engine's Restorer for a container: runc restores it into the bundle's namespaces
    and cgroups. Runs in the engine's worker thread; runc itself runs on the shim's loop,
    whose reaper owns every child exit."""

    def __init__(self, p: InitProcess, io: ProcessIO, loop: asyncio.AbstractEventLoop) -> None:
        self.p, self.io, self.loop = p, io, loop

    def prepare(self, artifact: Path, manifest) -> None:
        from restore_runtime.executor.runners import CRIU_CONFIG_ANNOTATION, apply_rootfs_diff

        apply_rootfs_diff(artifact, self.p.bundle / "rootfs")
        conf = self.p.workdir / "criu-restore.conf"
        conf.write_text(CRIU_CONFIG)
        cfg_path = self.p.bundle / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg.setdefault("annotations", {})[CRIU_CONFIG_ANNOTATION] = str(conf)
        cfg_path.write_text(json.dumps(cfg))

    def restore(self, image_dir: Path, work: Path, netns_path: str | None) -> int:
        from restore_runtime.criu.runner import error_lines
        from restore_runtime.errors import CriuError

        p = self.p
        coro = p.runc.restore(p.container_id, p.bundle, image_dir, work, p.pidfile, self.io.child)
        try:
            asyncio.run_coroutine_threadsafe(coro, self.loop).result()
        except RuncError as e:
            try:
                lines = error_lines((work / "restore.log").read_text(errors="replace"))
            except FileNotFoundError:
                lines = []
            raise CriuError("restore (runc)", e.returncode, lines or [e.message],
                            str(work / "restore.log")) from e  # fmt: skip
        return int(p.pidfile.read_text().strip())


class ShimRestorer:
    def __init__(self, init: InitProcess, spec: dict) -> None:
        a = spec.get("annotations") or {}
        self.artifact = artifact_path(a[ann.ARTIFACT])
        policy = a.get(ann.INTERNAL_RESTORE_POLICY) or a.get(ann.RESTORE_POLICY) or "fallback"
        strict = policy == ann.RestorePolicy.STRICT
        self.policy = ann.RestorePolicy.STRICT if strict else ann.RestorePolicy.FALLBACK
        self.skip_compat = a.get(ann.SKIP_COMPAT_CHECK, "").lower() == "true"
        self.control_dir = control_dir(spec)
        self.netns = netns_path(spec)
        #: the digest the webhook admitted; the artifact on disk must still be that one
        self.digest = a.get(ann.MANIFEST_DIGEST)
        self.report = None

    async def start(self, p: InitProcess) -> None:
        # The engine is imported by restoring containers only: plain pods stay light.
        from restore_runtime.artifact.verify import manifest_digest
        from restore_runtime.errors import Problem, SnapshotError, VerificationError
        from restore_runtime.executor import RestoreRequest, restore

        if p.stdio.terminal:
            await self._failed(p, SnapshotError("restoring a container with a terminal (tty) "
                                                "is not supported"))  # fmt: skip
            return
        if self.digest:
            try:
                found = manifest_digest(self.artifact)
            except OSError as e:
                found = f"unreadable ({e.strerror})"
            if found != self.digest:
                await self._failed(p, VerificationError([Problem(
                    "manifest.json", "manifest",
                    f"manifest digest {found} is not the admitted {self.digest}")]))  # fmt: skip
                return
        try:
            key = verify_key()
        except SnapshotError as e:  # an unreadable key: fall back (or fail) like a bad signature
            await self._failed(p, e)
            return
        p.io = await ProcessIO.open(p.stdio)
        req = RestoreRequest(
            artifact=self.artifact,
            verify_key=key,
            control_dir=self.control_dir,
            netns=self.netns,
            skip_compat=self.skip_compat,
            restorer=RuncRestorer(p, p.io, asyncio.get_running_loop()),
        )
        try:
            report = await asyncio.to_thread(restore, req)
        except Exception as e:
            await self._failed(p, e)
            return
        p.io.after_start()
        p.pid = report.pid or 0
        self._emit(report)

    async def _failed(self, p: InitProcess, e: Exception) -> None:
        from restore_runtime.contracts.report import RestoreReport
        from restore_runtime.errors import SnapshotError

        phase = e.phase if isinstance(e, SnapshotError) else "setup"
        reason = str(e) if isinstance(e, SnapshotError) else f"{type(e).__name__}: {e}"
        if p.io is not None:
            p.io.close()
        with contextlib.suppress(RuncError):  # nothing may have been created
            await p.runc.delete(p.container_id, force=True)
        strict = self.policy is ann.RestorePolicy.STRICT
        outcome = ann.RestoreOutcome.FAILED if strict else ann.RestoreOutcome.FELL_BACK
        self._emit(RestoreReport(outcome=outcome, artifact=str(self.artifact), reason=reason,
                                 failedPhase=phase))  # fmt: skip
        if strict:
            raise RPCError(Code.FAILED_PRECONDITION, f"restore failed in {phase}: {reason}")
        log.warning("restore of %s failed in %s; cold-starting: %s", p.container_id, phase, reason)
        await p.do_create()
        await p.do_start()

    def _emit(self, report) -> None:
        from restore_runtime import handshake

        self.report = report
        log.info("restore report for %s: %s", self.artifact, report.to_json().decode())
        if self.control_dir is not None:
            try:
                handshake.write_report(self.control_dir, report)
            except OSError as e:
                log.error("cannot write the restore report to %s: %s", self.control_dir, e)
