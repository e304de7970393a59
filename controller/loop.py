"""The controller's I/O: read a PodSnapshot or SnapshotJob with what it refers to, ask the
pure reconcilers what to do, do it. Running, it reconciles per object as watch events come
(``reconcile_key`` through kubeclient.workqueue, retried per object with backoff), and
every object again at each resync."""

from __future__ import annotations

import contextlib
import json
import logging
from datetime import UTC, datetime

from kubernetes_asyncio import client

from api.crd import ARTIFACT_FINALIZER, JOB_LABEL, PodSnapshot, SnapshotJob
from controller import jobs, snapshots
from controller.metrics import ControllerMetrics
from kubeclient import api as kube
from kubeclient.api import ApiException
from kubeclient.watch import Source
from kubeclient.workqueue import Key, Watched, meta

log = logging.getLogger("snapshot.controller")
COMPONENT = "snapshot-controller"


class Controller:
    def __init__(self, api: client.ApiClient, metrics: ControllerMetrics | None = None) -> None:
        self.api = api
        self.metrics = metrics or ControllerMetrics()
        kube.count_requests(api, "controller", self.metrics.registry)
        self.core = client.CoreV1Api(api)
        self.snapshots = kube.pod_snapshots(api)
        self.jobs = kube.snapshot_jobs(api)

    def sources(self) -> list[Source]:
        """What wakes a pass: the two collections, and the pods SnapshotJobs made (their
        readiness moves a job on). A PodSnapshot of any other pod waits for the resync."""
        return [
            self.jobs.source(),
            self.snapshots.source(),
            Source(
                "snapshotjob pods",
                self.core.list_pod_for_all_namespaces,
                kwargs={"label_selector": JOB_LABEL},
            ),
        ]

    def watched(self) -> list[Watched]:
        """Each collection and the keys its objects queue: jobs and PodSnapshots themselves;
        a pod a SnapshotJob made, its job (the pod's readiness moves the job on)."""

        def own(kind: str):
            return lambda o: [((kind, *meta(o)), o)]

        def job_of(pod: dict):
            job = ((pod.get("metadata") or {}).get("labels") or {}).get(JOB_LABEL)
            return [(("SnapshotJob", meta(pod)[0], job), None)] if job else []

        jobs_, snaps, pods = self.sources()
        return [
            Watched(jobs_, own("SnapshotJob")),
            Watched(snaps, own("PodSnapshot")),
            Watched(pods, job_of),
        ]

    async def reconcile_key(self, key: Key, obj: dict | None) -> None:
        """Reconcile one object: the state the event carried, or read now. An API error
        propagates, so the work queue retries this object alone."""
        kind, ns, name = key
        store = self.jobs if kind == "SnapshotJob" else self.snapshots
        model = store.parse(obj) if obj is not None else await store.get(ns, name)
        if model is None:
            return  # deleted, or an object that does not parse (logged)
        ok = False
        try:
            if isinstance(model, SnapshotJob):
                await self.reconcile_job(model)
            else:
                await self.reconcile_snapshot(model)
            ok = True
        finally:
            self.metrics.reconciles.labels(kind, "ok" if ok else "error").inc()

    async def reconcile_snapshot(self, snap: PodSnapshot) -> None:
        pod = None
        if snapshots.needs_source(snap):
            ref = snap.spec.source.pod_ref
            pod = await kube.read_pod(self.api, snap.metadata.namespace, ref.name)
        act = snapshots.reconcile(snap, pod)
        if act.add_finalizer:
            await self.snapshots.set_finalizers(
                snap, [*snap.metadata.finalizers, ARTIFACT_FINALIZER]
            )
        if act.remove_finalizer:
            rest = [f for f in snap.metadata.finalizers if f != ARTIFACT_FINALIZER]
            await self.snapshots.set_finalizers(snap, rest)
        if act.status is not None:
            await self.snapshots.patch_status(snap, act.status)
        await self._events(snap, act.events)

    async def reconcile_job(self, job: SnapshotJob) -> None:
        ns = job.metadata.namespace
        pod = await kube.read_pod(self.api, ns, jobs.source_pod_name(job))
        snap_name = job.status.pod_snapshot_name or job.metadata.name
        snap = await self.snapshots.get(ns, snap_name)
        now = datetime.now(UTC)
        act = jobs.reconcile(job, pod, snap, now)
        if act.create_pod is not None:
            log.info("SnapshotJob %s/%s: creating source pod", ns, job.metadata.name)
            try:
                await self.core.create_namespaced_pod(ns, act.create_pod, field_validation="Strict")
            except ApiException as e:
                if e.status not in (400, 422):
                    raise
                act = jobs.template_refused(job, act.status, _api_message(e), now)
        if act.create_snapshot is not None:
            await self.snapshots.create(act.create_snapshot)
        if act.delete_pod and pod is not None:
            with contextlib.suppress(ApiException):
                await self.core.delete_namespaced_pod(pod["metadata"]["name"], ns)
        if act.status is not None:
            await self.jobs.patch_status(job, act.status)
        await self._events(job, act.events)

    async def _events(self, obj: PodSnapshot | SnapshotJob, events) -> None:
        for type_, reason, message in events:
            await kube.emit_event(self.api, obj.to_api(), type_, reason, message, COMPONENT)


def _api_message(e: ApiException) -> str:
    """The API server's own words for a refusal (its Status message), one line."""
    try:
        message = json.loads(e.body or "{}").get("message") or e.reason
    except (ValueError, AttributeError):
        message = e.reason
    return " ".join(str(message).split())[:1000]
