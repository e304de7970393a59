"""The Kubernetes I/O the control plane shares (webhook, controller, node agent): a client from
in-cluster config or a KUBECONFIG, and typed access to PodSnapshots. Deliberately thin: the
decisions live in pure functions over the models of api/crd.py.

The engine, the shim and snapshotctl never load kubernetes-asyncio (tests/test_layering.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Iterator
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel, ValidationError

from api import crd

from .watch import Source

__all__ = [
    "ApiException",
    "CustomResources",
    "api_client",
    "count_requests",
    "isolated",
    "pod_snapshots",
    "read_pod",
    "snapshot_jobs",
    "unless_absent",
]
log = logging.getLogger(__name__)

# The generated client sends a dict body to custom objects as a JSON patch; they need a merge patch.
MERGE_PATCH = "application/merge-patch+json"
#: answers of an API server that may take the same request later (overloaded, restarting)
TRANSIENT_STATUS = frozenset({0, 429, 500, 502, 503, 504})


async def api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """An API client from, in order: kubeconfig, $KUBECONFIG, the pod's service account,
    ~/.kube/config."""
    cfg = client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path:
        await config.load_kube_config(config_file=path, client_configuration=cfg)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=cfg)
    else:
        await config.load_kube_config(client_configuration=cfg)
    return client.ApiClient(configuration=cfg)


M = TypeVar("M", crd.PodSnapshot, crd.SnapshotJob)
T = TypeVar("T")


class CustomResources(Generic[M]):
    """Typed access to one of our custom resources."""

    def __init__(self, api: client.ApiClient, plural: str, model: type[M]) -> None:
        self._objs = client.CustomObjectsApi(api)
        self._plural = plural
        self._model = model

    def _args(self, namespace: str) -> tuple[str, str, str, str]:
        return crd.GROUP, crd.VERSION, namespace, self._plural

    async def get(self, namespace: str, name: str, timeout: float | None = None) -> M | None:
        """The object, or None when it does not exist; ApiException for anything else."""
        obj = await unless_absent(
            self._objs.get_namespaced_custom_object(
                *self._args(namespace), name, _request_timeout=timeout
            )
        )
        return None if obj is None else self._model.model_validate(obj)

    def source(self) -> Source:
        """This collection, to watch (kubeclient.watch)."""
        return Source(
            self._plural,
            self._objs.list_cluster_custom_object,
            (crd.GROUP, crd.VERSION, self._plural),
        )

    def parse(self, obj: dict) -> M | None:
        """The object as its model; None (logged) when it does not parse."""
        try:
            return self._model.model_validate(obj)
        except ValidationError as e:
            meta = obj.get("metadata", {})
            log.error(
                "skipping %s %s/%s: %s", self._plural, meta.get("namespace"), meta.get("name"), e
            )
            return None

    async def create(self, obj: M) -> M:
        body = obj.to_api()
        body.pop("status", None)
        created = await self._objs.create_namespaced_custom_object(
            *self._args(obj.metadata.namespace), body
        )
        return self._model.model_validate(created)

    async def patch_status(self, obj: M, status: BaseModel) -> None:
        """Write ``status``, stamped with the generation of ``obj`` it was decided from."""
        body = status.to_api()
        if obj.metadata.generation is not None:
            body["observedGeneration"] = obj.metadata.generation
        await self._objs.patch_namespaced_custom_object_status(
            *self._args(obj.metadata.namespace),
            obj.metadata.name,
            {"status": body},
            _content_type=MERGE_PATCH,
        )

    async def write_status(self, obj: M, status: BaseModel, max_delay_s: float = 30.0) -> bool:
        """``patch_status`` that lands: an API server that is down, overloaded or restarting
        is tried again with backoff (0.5 s doubling to ``max_delay_s``) for as long as it
        takes. False once the object is gone; any other refusal raises."""
        delay = 0.5
        while True:
            try:
                await self.patch_status(obj, status)
                return True
            except ApiException as e:
                if e.status == 404:
                    return False
                if e.status not in TRANSIENT_STATUS:
                    raise
                why = f"{e.status} {e.reason}"
            except (TimeoutError, aiohttp.ClientError, OSError) as e:
                why = str(e) or type(e).__name__
            log.warning(
                "writing the status of %s %s/%s failed (%s): again in %.1fs",
                obj.kind,
                obj.metadata.namespace,
                obj.metadata.name,
                why,
                delay,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_delay_s)

    async def set_finalizers(self, obj: M, finalizers: list[str]) -> None:
        # resourceVersion makes this a compare-and-swap: a concurrent change gets a 409 and the
        # next resync retries from fresh state.
        meta = {"finalizers": finalizers, "resourceVersion": obj.metadata.resource_version}
        await self._objs.patch_namespaced_custom_object(
            *self._args(obj.metadata.namespace),
            obj.metadata.name,
            {"metadata": meta},
            _content_type=MERGE_PATCH,
        )


def count_requests(api: client.ApiClient, component: str, registry: CollectorRegistry) -> Counter:
    """Count every request ``api`` makes, at the client's one choke point (``request``), in
    ``snapshot_<component>_api_requests_total{verb, outcome}``; returns the counter."""
    counter = Counter(
        f"snapshot_{component}_api_requests",
        "Kubernetes API requests, by verb and outcome (ok, error)",
        ["verb", "outcome"],
        registry=registry,
    )
    inner = api.request

    async def request(method, url, *args, **kwargs):
        try:
            out = await inner(method, url, *args, **kwargs)
        except Exception:
            counter.labels(method.lower(), "error").inc()
            raise
        counter.labels(method.lower(), "ok").inc()
        return out

    api.request = request  # type: ignore[method-assign]
    return counter


@contextlib.contextmanager
def isolated(obj: crd.PodSnapshot | crd.SnapshotJob) -> Iterator[None]:
    """Work on one object of a pass: an API error (a conflict, a rejected write) is logged
    and the pass goes on with the next object; the next pass retries this one."""
    try:
        yield
    except ApiException as e:
        log.warning(
            "%s %s/%s: HTTP %s %s",
            obj.kind,
            obj.metadata.namespace,
            obj.metadata.name,
            e.status,
            e.reason,
        )


async def unless_absent(call: Awaitable[T]) -> T | None:
    """What a read answers, or None when the object does not exist (404); any other
    ApiException is raised."""
    try:
        return await call
    except ApiException as e:
        if e.status == 404:
            return None
        raise


async def read_pod(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    """The pod as the API server returns it (camelCase dict), or None when it does not exist."""
    pod = await unless_absent(client.CoreV1Api(api).read_namespaced_pod(name, namespace))
    return None if pod is None else api.sanitize_for_serialization(pod)


def pod_snapshots(api: client.ApiClient) -> CustomResources[crd.PodSnapshot]:
    return CustomResources(api, crd.POD_SNAPSHOT_PLURAL, crd.PodSnapshot)


def snapshot_jobs(api: client.ApiClient) -> CustomResources[crd.SnapshotJob]:
    return CustomResources(api, crd.SNAPSHOT_JOB_PLURAL, crd.SnapshotJob)


async def emit_event(
    api: client.ApiClient,
    obj: dict[str, Any],
    type_: str,
    reason: str,
    message: str,
    component: str,
) -> None:
    """A core/v1 Event about obj (apiVersion, kind and metadata of any object). Events are
    best effort: failing to record one is logged, never raised."""
    meta = obj["metadata"]
    now = datetime.now(UTC)
    # a cluster-scoped object's (a Node's) Events live in "default", as the kubelet's do
    where = meta.get("namespace") or "default"
    event = {
        "metadata": {"generateName": f"{meta['name']}.", "namespace": where},
        "involvedObject": {
            "apiVersion": obj["apiVersion"],
            "kind": obj["kind"],
            "name": meta["name"],
            "namespace": meta.get("namespace", ""),
            "uid": meta.get("uid"),
        },
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        await client.CoreV1Api(api).create_namespaced_event(where, event)
    except (ApiException, OSError) as e:
        log.warning("could not record event %s on %s/%s: %s", reason, where, meta["name"], e)
