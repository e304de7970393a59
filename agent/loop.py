"""The agent's I/O loop. Each pass, for its node:
- PodSnapshots handed to it (Ready=False/CheckpointPending): checkpoint the source container
  through runc with the engine, into the artifact store; write Ready or Failed.
- PodSnapshots being deleted: delete the artifact, then drop the finalizer.
- restore pods: read the shim's restore report from the pod's control volume; set the pod
  condition nvidia.com/Restored and record an Event with the phase timings
  (restore_reports.py).

Checkpoints run on threads of their own (agent/slots.py): a bounded number at once, at most
a fair share of them per namespace, one per pod, so the loop keeps answering and a workload
that never quiesces holds up nobody else's."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from api.crd import ARTIFACT_FINALIZER, PodSnapshot, PodSnapshotReasons
from api.handshake import DEFAULT_HANDSHAKE_TIMEOUT_S
from api.host import HostFingerprint
from api.node import DEFAULT_CACHE_MAX_BYTES
from api.paths import DEFAULT_RUNC_ROOT
from kubeclient import api as kube
from kubeclient.watch import Source
from kubeclient.workqueue import Key, Watched, meta
from restore_runtime.artifact import oci, signing
from restore_runtime.artifact.cache import CACHE_DIR, ArtifactCache
from restore_runtime.artifact.oci import OciRef, RegistryAccess
from restore_runtime.artifact.pack import Signer, remove_stale_staging
from restore_runtime.artifact.verify import load_manifest, manifest_digest
from restore_runtime.compat import host_info
from restore_runtime.errors import SnapshotError
from restore_runtime.executor.checkpoint import CheckpointRequest, CheckpointResult, checkpoint
from restore_runtime.executor.recovery import Recovered, recover_interrupted
from restore_runtime.executor.tree_access import RuncContainer
from restore_runtime.timing import phases_text

from . import decisions as d
from .metrics import AgentMetrics
from .restore_reports import COMPONENT, RestoreReports
from .signer_client import RemoteSigner
from .slots import CheckpointSlots

log = logging.getLogger("snapshot.agent")
#: a pull's staging directory older than this is a killed pull's (pulls end in minutes)
STALE_PULL_S = 3600.0
#: the Event reason of a source that should serve on after its checkpoint but did not wake
SOURCE_NOT_RESUMED = "SourceNotResumed"


@dataclass
class AgentConfig:
    node: str
    store: Path  # the artifact store, at the same path on every node (hostPath or shared mount)
    kubelet_root: Path = Path("/var/lib/kubelet")
    runc_root: Path = DEFAULT_RUNC_ROOT
    runc: str = "runc"  # the node's runc (the one its containerd runs), or one as new
    handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S
    #: who signs manifest.json: the cluster's signer (the chart: no key on the node), or a
    #: private key here (one-machine setups); unsigned when neither is set
    signer: RemoteSigner | None = None
    sign_key: Path | None = None  # Ed25519 private key (PEM)
    #: push artifacts to this OCI repository (oci://REGISTRY/REPOSITORY) instead of keeping
    #: them in the store; the store then holds this node's cache of them
    oci_repository: OciRef | None = None
    registry: RegistryAccess = field(default_factory=RegistryAccess)
    oci_cache_max_bytes: int = DEFAULT_CACHE_MAX_BYTES
    #: pull each Ready PodSnapshot this node could restore into its cache before any pod
    #: asks for it, so a scale-up onto this node does not wait on the registry
    pre_pull: bool = False
    #: checkpoints at once on this node, and of them at most this many of one namespace
    max_checkpoints: int = 4
    max_checkpoints_per_namespace: int = 2


class Agent:
    def __init__(self, api: client.ApiClient, cfg: AgentConfig) -> None:
        self.api, self.cfg = api, cfg
        self.core = client.CoreV1Api(api)
        self.snapshots = kube.pod_snapshots(api)
        self.metrics = AgentMetrics()
        kube.count_requests(api, "agent", self.metrics.registry)
        #: checkpoints in flight, by PodSnapshot uid: each runs on its own, so one pod's slow
        #: handshake never holds up another pod's checkpoint or the restore reports
        self.running: dict[str, asyncio.Task] = {}
        self.slots = CheckpointSlots(cfg.max_checkpoints, cfg.max_checkpoints_per_namespace)
        self.cache = ArtifactCache(cfg.store / CACHE_DIR, cfg.oci_cache_max_bytes, cfg.registry)
        #: pre-pulls in flight, by manifest digest
        self.pulling: dict[str, asyncio.Task] = {}
        self._host: HostFingerprint | None = None
        #: what recover() gave back, by PodSnapshot uid, until its PodSnapshot is told
        self.recovered: dict[str | None, Recovered] = {}
        self.restores = RestoreReports(api, self.metrics, cfg.node, cfg.kubelet_root)

    async def recover(self) -> None:
        """What a killed agent left: give back the sources of its checkpoints in flight
        (thawed, GPU state handed back, woken), then remove their staging. Run once at start,
        before any reconcile, on a thread: it blocks on runc, the driver and engine APIs."""
        # before the staging is removed: a dead checkpoint's source may be frozen or quiesced
        done = await asyncio.to_thread(recover_interrupted, self.cfg.store)
        self.recovered = {r.pod_snapshot_uid: r for r in done}
        self.metrics.recovered.inc(len(done))
        if stale := await asyncio.to_thread(remove_stale_staging, self.cfg.store):
            log.warning("removed %d staging dir(s) of interrupted checkpoints", len(stale))
        if stale := await asyncio.to_thread(self.cache.remove_stale_staging, STALE_PULL_S):
            log.warning("removed %d staging dir(s) of interrupted pulls", len(stale))

    def sources(self) -> list[Source]:
        """What wakes a pass: PodSnapshots, and the pods of this node only."""
        return [self.snapshots.source(),
                Source("pods on this node", self.core.list_pod_for_all_namespaces,
                       kwargs={"field_selector": f"spec.nodeName={self.cfg.node}"})]  # fmt: skip

    def watched(self) -> list[Watched]:
        """Each PodSnapshot, and each pod of this node, is its own key."""
        snaps, pods = self.sources()
        return [Watched(snaps, lambda o: [(("PodSnapshot", *meta(o)), o)]),
                Watched(pods, lambda o: [(("Pod", *meta(o)), o)])]  # fmt: skip

    async def reconcile_key(self, key: Key, obj: dict | None) -> None:
        """One object, as a watch event or list carried it (kubeclient.workqueue); an API
        error propagates, so the queue retries this object alone."""
        kind, ns, name = key
        if kind == "PodSnapshot":
            snap = self.snapshots.parse(obj) if obj else await self.snapshots.get(ns, name)
            if snap is not None:
                await self.reconcile_snapshot(snap)
        else:
            pod = obj or await kube.read_pod(self.api, ns, name)
            if pod is not None:
                await self.restores.report(pod)

    async def reconcile_snapshot(self, snap: PodSnapshot) -> None:
        if snap.metadata.uid in self.running:
            return
        if d.interrupted(snap, self.cfg.node):
            await self._resume_interrupted(snap)
        elif d.to_checkpoint(snap, self.cfg.node):
            self._start_checkpoint(snap)
        elif d.to_delete(snap, self.cfg.node):
            await self.delete_artifact(snap)
        elif self.cfg.pre_pull:
            await self._pre_pull(snap)

    async def _resume_interrupted(self, snap: PodSnapshot) -> None:
        """A PodSnapshot left Checkpointing with no checkpoint running here. Its artifact
        committed (the agent died, or the API server was down, between the commit and the
        Ready): the job is finished from it. Else it failed, and says so truthfully."""
        done = self.recovered.pop(snap.metadata.uid, None)
        result = await asyncio.to_thread(self._committed, snap)
        if result is not None:
            log.info("PodSnapshot %s/%s: finishing from its committed artifact %s",
                     snap.metadata.namespace, snap.metadata.name, result.path)  # fmt: skip
            # its source was given back at this agent's start (recover()), and serves on
            seconds = result.manifest.timings.get("total", 0.0)
            return await self._finish(snap, None, result, time.monotonic() - seconds)
        if done is not None:
            why = f"the agent restarted during the checkpoint: {done.summary}"
        else:
            why = "the checkpoint stopped before its artifact was committed"
        await self._fail(snap, why)

    def _committed(self, snap: PodSnapshot) -> CheckpointResult | None:
        """This node's committed artifact of ``snap``, when its store (the agent's own,
        root-only) holds one that names this very PodSnapshot."""
        path = d.artifact_dir(self.cfg.store, snap)
        try:
            manifest, digest = load_manifest(path), manifest_digest(path)
        except (SnapshotError, OSError):
            return None
        if manifest.source.pod_snapshot_uid != snap.metadata.uid:
            return None
        return CheckpointResult(path, manifest, digest)

    def _start_checkpoint(self, snap: PodSnapshot) -> None:
        async def run() -> None:
            try:
                with kube.isolated(snap):
                    await self.checkpoint(snap)
            except Exception as e:  # a bug must not vanish silently with the task
                log.exception("checkpoint of PodSnapshot %s/%s failed",
                              snap.metadata.namespace, snap.metadata.name)  # fmt: skip
                # nor leave it Checkpointing, which the signer would sign for
                with contextlib.suppress(Exception):
                    await self._fail(snap, f"the checkpoint failed: {type(e).__name__}: "
                                           f"{str(e)[:300]}")  # fmt: skip

        uid = snap.metadata.uid
        task = asyncio.ensure_future(run())
        self.running[uid] = task
        task.add_done_callback(lambda _: self.running.pop(uid, None))

    async def _pre_pull(self, snap: PodSnapshot) -> None:
        if self._host is None:  # once: it runs criu --version and reads the GPU inventory
            self._host = await asyncio.to_thread(host_info, with_gpus=True)
        uri = d.to_pre_pull(snap, self.cfg.node, self._host)
        art = snap.status.artifact
        if uri is None or art is None or art.manifest_digest in self.pulling:
            return
        digest = art.manifest_digest
        if self.cache.entry(digest).is_dir():
            return

        async def pull() -> None:
            try:
                await asyncio.to_thread(self.cache.fetch, OciRef.parse(uri), digest)
                self.metrics.pre_pulls.labels("pulled").inc()
                log.info("pre-pulled %s into the node cache", uri)
            except (SnapshotError, OSError, ValueError) as e:  # the shim will try again
                self.metrics.pre_pulls.labels("failed").inc()
                log.warning("pre-pulling %s failed: %s", uri, e)

        task = asyncio.ensure_future(pull())
        self.pulling[digest] = task
        task.add_done_callback(lambda _: self.pulling.pop(digest, None))

    async def checkpoint(self, snap: PodSnapshot) -> None:
        ns = snap.metadata.namespace
        pod = await kube.read_pod(self.api, ns, snap.spec.source.pod_ref.name)
        target = d.checkpoint_target(pod, snap, self.cfg.node)
        if isinstance(target, str):
            return await self._fail(snap, target)
        # a thread of the checkpoints' own, one checkpoint of a pod at a time, a fair share
        # of them per namespace: a workload that never quiesces holds only its own slots
        async with self.slots.hold(ns, target.pod_uid):
            await self._checkpoint(snap, pod, target)

    async def _checkpoint(self, snap: PodSnapshot, pod: dict, target: d.CheckpointTarget) -> None:
        ns, name, cid = snap.metadata.namespace, snap.spec.source.pod_ref.name, target.container_id
        container = RuncContainer(self.cfg.runc_root, cid, self.cfg.runc)
        try:
            state = await self.slots.run(container.state)
        except SnapshotError as e:
            return await self._fail(snap, str(e))
        if why := d.container_problem(state.get("annotations") or {}, pod, snap.container or ""):
            log.warning("refused PodSnapshot %s/%s: %s", ns, snap.metadata.name, why)
            return await self._fail(snap, why)
        try:
            signer = self._signer(snap)
        except SnapshotError as e:
            return await self._fail(snap, str(e))
        await self.snapshots.patch_status(snap, d.checkpointing(snap))
        control = d.control_dir(self.cfg.kubelet_root, target.pod_uid)
        out = d.artifact_dir(self.cfg.store, snap)
        req = CheckpointRequest(
            output=out,
            runc_container=container,
            leave_running=snap.spec.keep_source_running,
            control_dir=control if control.is_dir() else None,
            handshake_timeout_s=self.cfg.handshake_timeout_s,
            quiesce=snap.spec.quiesce,
            signer=signer,
            pod=name, namespace=ns, container=snap.container,
            pod_snapshot=snap.metadata.name, pod_snapshot_uid=snap.metadata.uid or None,
            image_digest=target.image_digest,
            # ended only once the artifact is pushed and the PodSnapshot Ready (_finish)
            end_at_commit=False,
        )  # fmt: skip
        log.info("checkpointing %s/%s (container %s) into %s", ns, name, cid[:12], out)
        t0 = time.monotonic()
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            result = await self.slots.run(checkpoint, req)
        except (SnapshotError, OSError) as e:
            log.error("checkpoint of %s/%s failed: %s", ns, name, e)
            self.metrics.checkpoints.labels("failed").inc()
            return await self._fail(snap, str(e))
        await self._finish(snap, pod, result, t0)

    async def _finish(self, snap: PodSnapshot, pod: dict | None, result: CheckpointResult,
                      t0: float) -> None:  # fmt: skip
        """The artifact is committed. It is made durable where the user asked for it (pushed
        for OCI; the PodSnapshot Ready), and only then is a source that is not kept running
        ended (``result.held``): any failure before that gives the source back instead."""
        try:
            await self._make_durable(snap, pod, result, t0)
        except BaseException:  # a bug or a refusal: never leave the source held, asleep
            if result.held is not None:  # given back unless already ended (HeldSource)
                await asyncio.to_thread(result.held.give_back)
            raise

    async def _make_durable(self, snap: PodSnapshot, pod: dict | None,
                            result: CheckpointResult, t0: float) -> None:  # fmt: skip
        uri = f"file://{result.path}"
        if self.cfg.oci_repository is not None:
            try:
                uri = await asyncio.to_thread(self.publish, snap, result)
            except (SnapshotError, OSError) as e:
                problems = await self._discard(result)
                self.metrics.checkpoints.labels("failed").inc()
                kept = "; the source keeps serving" if result.held is not None else ""
                await self._fail(snap, f"pushing the artifact: {e}{kept}")
                return await self._source_problems(snap, pod, problems)
        seconds = time.monotonic() - t0
        status = d.captured(snap, result.manifest, uri, result.digest, seconds)
        if not await self.snapshots.write_status(snap, status):
            log.warning("PodSnapshot %s/%s is gone: its artifact is removed",
                        snap.metadata.namespace, snap.metadata.name)  # fmt: skip
            return await self._source_problems(snap, pod, await self._discard(result))
        problems = list(result.problems)
        if result.held is not None:  # Ready: only now may the source go
            problems += await asyncio.to_thread(result.held.end)
        self.metrics.checkpoints.labels("captured").inc()
        self.metrics.checkpoint_seconds.observe(seconds)
        self.metrics.artifact_bytes.inc(result.manifest.size_bytes)
        msg = f"{result.manifest.size_bytes / 1e9:.2f} GB in {seconds:.1f}s: " + phases_text(
            result.manifest.timings
        )
        await self._event(snap.to_api(), "Normal", PodSnapshotReasons.CAPTURED, msg)
        await self._source_problems(snap, pod, problems)

    async def _discard(self, result: CheckpointResult) -> list[str]:
        """A committed artifact that will not be used: its held source given back (and what
        could not be), the artifact removed."""
        problems = list(result.problems)
        if result.held is not None:
            problems += await asyncio.to_thread(result.held.give_back)
        await asyncio.to_thread(shutil.rmtree, result.path, True)
        return problems

    async def _source_problems(self, snap: PodSnapshot, pod: dict | None,
                               problems: list[str]) -> None:  # fmt: skip
        """A source that should serve on but did not wake is never left asleep silently: a
        Warning on the PodSnapshot and on its pod, and a metric."""
        if not problems:
            return
        self.metrics.source_not_resumed.inc()
        msg = "the source pod was not handed back after its checkpoint: " + "; ".join(problems)
        log.error("PodSnapshot %s/%s: %s", snap.metadata.namespace, snap.metadata.name, msg)
        await self._event(snap.to_api(), "Warning", SOURCE_NOT_RESUMED, msg)
        if pod is not None:
            await self._event({"apiVersion": "v1", "kind": "Pod", "metadata": pod["metadata"]},
                              "Warning", SOURCE_NOT_RESUMED, msg)  # fmt: skip

    def _signer(self, snap: PodSnapshot) -> Signer | None:
        if self.cfg.signer is not None:
            return self.cfg.signer.for_snapshot(snap)
        return signing.local_signer(self.cfg.sign_key) if self.cfg.sign_key else None

    def publish(self, snap: PodSnapshot, result: CheckpointResult) -> str:
        """Push the artifact to the OCI repository; this node keeps it as its cached copy
        (a restore here starts warm). Returns the pinned oci:// URI."""
        assert self.cfg.oci_repository is not None
        ref = replace(self.cfg.oci_repository, tag=d.oci_tag(snap))
        t0 = time.monotonic()
        pushed = oci.push(result.path, ref, self.cfg.registry,
                          d.oci_annotations(snap, result.digest))  # fmt: skip
        log.info("pushed %s (%.2f GB) in %.1fs", pushed.uri, result.manifest.size_bytes / 1e9,
                 time.monotonic() - t0)  # fmt: skip
        self.cache.adopt(result.path, result.digest)
        return pushed.uri

    async def _fail(self, snap: PodSnapshot, message: str) -> None:
        reason = PodSnapshotReasons.CHECKPOINT_FAILED
        await self.snapshots.write_status(snap, d.failed(snap, reason, message))
        await self._event(snap.to_api(), "Warning", reason, message)

    async def delete_artifact(self, snap: PodSnapshot) -> None:
        art = snap.status.artifact
        if art is not None and art.uri.startswith("oci://"):
            await self._delete_pushed(snap, OciRef.parse(art.uri), art.manifest_digest)
        path = d.artifact_dir(self.cfg.store, snap)
        if path.exists():
            await asyncio.to_thread(shutil.rmtree, path)
            log.info("deleted artifact %s of PodSnapshot %s/%s", path, snap.metadata.namespace,
                     snap.metadata.name)  # fmt: skip
        rest = [f for f in snap.metadata.finalizers if f != ARTIFACT_FINALIZER]
        if rest != snap.metadata.finalizers:
            await self.snapshots.set_finalizers(snap, rest)

    async def _delete_pushed(self, snap: PodSnapshot, ref: OciRef, digest: str) -> None:
        """The registry's copy, and this node's; other nodes' cached copies age out."""
        try:
            if not await asyncio.to_thread(oci.delete, ref, self.cfg.registry):
                log.warning("registry %s does not allow deletes: %s stays", ref.registry, ref.uri)
        except SnapshotError as e:  # never hold a deletion hostage to a registry outage
            await self._event(snap.to_api(), "Warning", "ArtifactNotDeleted", str(e))
        await asyncio.to_thread(self.cache.remove, digest)

    async def _event(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        await kube.emit_event(self.api, obj, type_, reason, message, COMPONENT)
