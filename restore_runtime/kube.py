"""The Kubernetes I/O the control plane shares (webhook, controller, node agent): a client from
in-cluster config or a KUBECONFIG, and typed access to PodSnapshots. Deliberately thin: the
decisions live in pure functions over the models of contracts/crd.py.

kubernetes-asyncio is imported here only, and only the control plane imports this module, so
the shim and snapshotctl never load it."""

from __future__ import annotations

import os
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from restore_runtime.contracts import crd

__all__ = ["ApiException", "PodSnapshots", "api_client"]

# The generated client sends a dict body to custom objects as a JSON patch; they need a merge patch.
MERGE_PATCH = "application/merge-patch+json"


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


class PodSnapshots:
    def __init__(self, api: client.ApiClient) -> None:
        self._objs = client.CustomObjectsApi(api)

    async def get(
        self, namespace: str, name: str, timeout: float | None = None
    ) -> crd.PodSnapshot | None:
        """The PodSnapshot, or None when it does not exist; ApiException for anything else."""
        try:
            obj = await self._objs.get_namespaced_custom_object(
                crd.GROUP, crd.VERSION, namespace, crd.POD_SNAPSHOT_PLURAL, name,
                _request_timeout=timeout,
            )  # fmt: skip
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return crd.PodSnapshot.model_validate(obj)

    async def list(self, namespace: str | None = None) -> list[crd.PodSnapshot]:
        if namespace:
            objs = await self._objs.list_namespaced_custom_object(
                crd.GROUP, crd.VERSION, namespace, crd.POD_SNAPSHOT_PLURAL
            )
        else:
            objs = await self._objs.list_cluster_custom_object(
                crd.GROUP, crd.VERSION, crd.POD_SNAPSHOT_PLURAL
            )
        return [crd.PodSnapshot.model_validate(o) for o in objs.get("items", [])]

    async def create(self, snap: crd.PodSnapshot) -> crd.PodSnapshot:
        body = snap.to_api()
        body.pop("status", None)
        obj = await self._objs.create_namespaced_custom_object(
            crd.GROUP, crd.VERSION, snap.metadata.namespace, crd.POD_SNAPSHOT_PLURAL, body
        )
        return crd.PodSnapshot.model_validate(obj)

    async def patch_status(
        self, namespace: str, name: str, status: crd.PodSnapshotStatus
    ) -> crd.PodSnapshot:
        obj = await self._objs.patch_namespaced_custom_object_status(
            crd.GROUP, crd.VERSION, namespace, crd.POD_SNAPSHOT_PLURAL, name,
            {"status": status.to_api()}, _content_type=MERGE_PATCH,
        )  # fmt: skip
        return crd.PodSnapshot.model_validate(obj)

    async def patch_metadata(self, namespace: str, name: str, metadata: dict[str, Any]) -> None:
        await self._objs.patch_namespaced_custom_object(
            crd.GROUP, crd.VERSION, namespace, crd.POD_SNAPSHOT_PLURAL, name,
            {"metadata": metadata}, _content_type=MERGE_PATCH,
        )  # fmt: skip
