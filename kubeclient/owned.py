"""What a component makes once and keeps in the API server instead of the chart making it at
render time: a Secret (the signing key, a serving CA and certificate) and a ConfigMap (a CA
that agents trust). Nothing secret is then in ``helm template``'s output, so a GitOps sync
renders the same bytes every time and never replaces a key.

Every replica may start at once: a Secret is created only if absent (the loser of the race
reads the winner's), and renewed with a compare-and-swap on its resourceVersion."""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Callable

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from .api import unless_absent

log = logging.getLogger(__name__)
Data = dict[str, bytes]
#: what ``kubectl delete secret,configmap -l`` removes after an uninstall (docs/operations.md)
MANAGED = {"app.kubernetes.io/managed-by": "snapshot"}
ATTEMPTS = 5
#: the whole of one ensure/publish, retries included: an API server that accepts and never
#: answers stops a component's start with an error instead of holding it forever
DEADLINE_S = 30.0


async def ensure_secret(
    api: client.ApiClient,
    namespace: str,
    name: str,
    make: Callable[[], Data],
    usable: Callable[[Data], bool] = lambda _: True,
    deadline_s: float = DEADLINE_S,
    renew: Callable[[Data], Data] | None = None,
) -> Data:
    """The data of Secret ``namespace/name``: as it is when ``usable``; else made by ``make``
    (by ``renew`` from the unusable data, when given) and written (created, or replaced when
    unusable). TimeoutError past ``deadline_s``."""
    async with asyncio.timeout(deadline_s):
        core = client.CoreV1Api(api)
        return await _ensure_secret(core, namespace, name, make, usable, renew)


async def _ensure_secret(
    core: client.CoreV1Api,
    namespace: str,
    name: str,
    make: Callable[[], Data],
    usable: Callable[[Data], bool],
    renew: Callable[[Data], Data] | None,
) -> Data:
    for _ in range(ATTEMPTS):
        secret = await unless_absent(core.read_namespaced_secret(name, namespace))
        data = None
        if secret is not None:
            data = {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}
            if usable(data):
                return data
        new = renew(data) if renew is not None and data is not None else make()
        body = client.V1Secret(
            metadata=client.V1ObjectMeta(
                name=name,
                namespace=namespace,
                labels=MANAGED,
                resource_version=secret.metadata.resource_version if secret else None,
            ),
            type="Opaque",
            data={k: base64.b64encode(v).decode() for k, v in new.items()},
        )
        try:
            if secret is None:
                await core.create_namespaced_secret(namespace, body)
            else:
                await core.replace_namespaced_secret(name, namespace, body)
        except ApiException as e:
            if e.status == 409:  # another replica wrote it first: use theirs
                continue
            raise
        log.info("%s Secret %s/%s", "wrote" if secret is None else "renewed", namespace, name)
        return new
    raise RuntimeError(f"Secret {namespace}/{name} kept changing under us")


async def publish_configmap(
    api: client.ApiClient,
    namespace: str,
    name: str,
    data: dict[str, str],
    deadline_s: float = DEADLINE_S,
) -> None:
    """ConfigMap ``namespace/name`` holds ``data`` (created, or updated when it differs).
    TimeoutError past ``deadline_s``."""
    async with asyncio.timeout(deadline_s):
        await _publish_configmap(client.CoreV1Api(api), namespace, name, data)


async def _publish_configmap(
    core: client.CoreV1Api, namespace: str, name: str, data: dict[str, str]
) -> None:
    body = client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name=name, namespace=namespace, labels=MANAGED), data=data
    )
    for _ in range(ATTEMPTS):
        current = await unless_absent(core.read_namespaced_config_map(name, namespace))
        if current is not None:
            if current.data != data:
                await core.patch_namespaced_config_map(name, namespace, {"data": data})
                log.info("updated ConfigMap %s/%s", namespace, name)
            return
        try:
            await core.create_namespaced_config_map(namespace, body)
        except ApiException as e:
            if e.status == 409:  # another replica created it first: compare with theirs
                continue
            raise
        log.info("published ConfigMap %s/%s", namespace, name)
        return
    raise RuntimeError(f"ConfigMap {namespace}/{name} kept changing under us")
