"""The agent's I/O loop. Each pass, for its node:
- PodSnapshots handed to it (Ready=False/CheckpointPending): checkpoint the source container
  through runc with the engine, into the artifact store; write Ready or Failed.
- PodSnapshots being deleted: delete the artifact, then drop the finalizer.
- restore pods: read the shim's restore report from the pod's control volume; set the pod
  condition nvidia.com/Restored and record an Event with the phase timings.

Checkpoints run on threads of their own (agent/slots.py): a bounded number at once, at most
a fair share of them per namespace, one per pod, so the loop keeps answering and a workload
that never quiesces holds up nobody else's."""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from api.crd import ARTIFACT_FINALIZER, PodSnapshot, PodSnapshotReasons
from api.handshake import DEFAULT_HANDSHAKE_TIMEOUT_S, RESTORE_REPORT
from api.node import DEFAULT_CACHE_MAX_BYTES
from api.paths import DEFAULT_RUNC_ROOT
from api.report import RestoreReport
from kubeclient import api as kube
from kubeclient.watch import Source
from kubeclient.workqueue import Key, Watched, meta
from restore_runtime.artifact import oci, signing
from restore_runtime.artifact.cache import CACHE_DIR, ArtifactCache
from restore_runtime.artifact.oci import OciRef, RegistryAccess
from restore_runtime.artifact.pack import Signer, remove_stale_staging
from restore_runtime.compat import HostInfo, host_info
from restore_runtime.control_files import read_control_file
from restore_runtime.errors import SnapshotError
from restore_runtime.executor.checkpoint import CheckpointRequest, CheckpointResult, checkpoint
from restore_runtime.executor.recovery import recover_interrupted
from restore_runtime.executor.tree_access import RuncContainer
from restore_runtime.timing import phases_text

from . import decisions as d
from .signer_client import RemoteSigner
from .slots import CheckpointSlots

log = logging.getLogger("snapshot.agent")
COMPONENT = "snapshot-agent"
#: a pull's staging directory older than this is a killed pull's (pulls end in minutes)
STALE_PULL_S = 3600.0


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


class AgentMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.checkpoints = Counter(
            "snapshot_agent_checkpoints", "Checkpoints, by result (captured, failed)",
            ["result"], registry=r,
        )  # fmt: skip
        self.checkpoint_seconds = Histogram(
            "snapshot_agent_checkpoint_seconds", "Checkpoint duration, handshake to artifact",
            buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600), registry=r,
        )  # fmt: skip
        self.artifact_bytes = Counter(
            "snapshot_agent_artifact_bytes", "Bytes of artifacts written", registry=r
        )
        self.pre_pulls = Counter(
            "snapshot_agent_pre_pulls", "Artifacts pulled ahead of a restore, by result "
            "(pulled, failed)", ["result"], registry=r,
        )  # fmt: skip
        self.recovered = Counter(
            "snapshot_agent_recovered", "Checkpoints found interrupted at the agent's start "
            "(it was killed mid-way) whose source was given back", registry=r,
        )  # fmt: skip
        self.restores = Counter(
            "snapshot_agent_restores_reported",
            "Restore outcomes reported on pods (restored, fell-back, failed)",
            ["outcome"], registry=r,
        )  # fmt: skip

    def serve(self, port: int) -> None:
        """/metrics on port, from a background thread."""
        start_http_server(port, registry=self.registry)


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
        self._host: HostInfo | None = None
        # before the staging is removed: a dead checkpoint's source may be frozen or quiesced
        self.recovered = {r.pod_snapshot_uid: r for r in recover_interrupted(cfg.store)}
        self.metrics.recovered.inc(len(self.recovered))
        if stale := remove_stale_staging(cfg.store):
            log.warning("removed %d staging dir(s) of interrupted checkpoints", len(stale))
        if stale := self.cache.remove_stale_staging(STALE_PULL_S):
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
                await self.report_restore(pod)

    async def reconcile_snapshot(self, snap: PodSnapshot) -> None:
        if snap.metadata.uid in self.running:
            return
        if d.interrupted(snap, self.cfg.node):
            done = self.recovered.pop(snap.metadata.uid, None)
            what = f": {done.summary}" if done else ""
            await self._fail(snap, f"the agent restarted during the checkpoint{what}")
        elif d.to_checkpoint(snap, self.cfg.node):
            self._start_checkpoint(snap)
        elif d.to_delete(snap, self.cfg.node):
            await self.delete_artifact(snap)
        elif self.cfg.pre_pull:
            await self._pre_pull(snap)

    def _start_checkpoint(self, snap: PodSnapshot) -> None:
        async def run() -> None:
            try:
                with kube.isolated(snap):
                    await self.checkpoint(snap)
            except Exception:  # a bug must not vanish silently with the task
                log.exception("checkpoint of PodSnapshot %s/%s failed",
                              snap.metadata.namespace, snap.metadata.name)  # fmt: skip

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
        uri = f"file://{result.path}"
        if self.cfg.oci_repository is not None:
            try:
                uri = await asyncio.to_thread(self.publish, snap, result)
            except (SnapshotError, OSError) as e:
                await asyncio.to_thread(shutil.rmtree, result.path, True)
                self.metrics.checkpoints.labels("failed").inc()
                return await self._fail(snap, f"pushing the artifact: {e}")
        seconds = time.monotonic() - t0
        self.metrics.checkpoints.labels("captured").inc()
        self.metrics.checkpoint_seconds.observe(seconds)
        self.metrics.artifact_bytes.inc(result.manifest.size_bytes)
        status = d.captured(snap, result.manifest, uri, result.digest, seconds)
        await self.snapshots.patch_status(snap, status)
        msg = f"{result.manifest.size_bytes / 1e9:.2f} GB in {seconds:.1f}s: " + phases_text(
            result.manifest.timings
        )
        await self._event(snap.to_api(), "Normal", PodSnapshotReasons.CAPTURED, msg)

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
        await self.snapshots.patch_status(snap, d.failed(snap, reason, message))
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

    async def report_restore(self, pod: dict[str, Any]) -> None:
        """The restore outcome of ``pod``, once its shim has written it (a later event of the
        pod, its containers starting, brings it back here otherwise)."""
        if not d.needs_restore_report(pod, self.cfg.node):
            return
        path = d.control_dir(self.cfg.kubelet_root, pod["metadata"]["uid"]) / RESTORE_REPORT
        try:
            report = RestoreReport.model_validate_json(read_control_file(path))
        except FileNotFoundError:
            return  # not started yet
        except (ValueError, SnapshotError) as e:  # the pod's tenant controls this file
            log.warning("unreadable restore report of pod %s/%s: %s",
                        pod["metadata"]["namespace"], pod["metadata"]["name"], e)  # fmt: skip
            return
        await self.report(pod, report)

    async def report(self, pod: dict[str, Any], report: RestoreReport) -> None:
        cond = d.restored_condition(report)
        self.metrics.restores.labels(report.outcome.value).inc()
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        meta = pod["metadata"]
        # A strategic merge patch merges conditions by type and leaves the kubelet's alone.
        await self.core.patch_namespaced_pod_status(
            meta["name"], meta["namespace"], {"status": {"conditions": [cond.to_api(now)]}}
        )
        type_ = "Normal" if cond.status == "True" else "Warning"
        await self._event({"apiVersion": "v1", "kind": "Pod", "metadata": meta}, type_,
                          cond.reason, cond.message)  # fmt: skip
        log.info("pod %s/%s: %s (%s)", meta["namespace"], meta["name"], cond.reason, cond.message)

    async def _event(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        await kube.emit_event(self.api, obj, type_, reason, message, COMPONENT)
