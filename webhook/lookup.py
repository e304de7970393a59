"""Looking up a pod's PodSnapshot within a time budget, so that an unreachable API server turns
into an answer under the pod's restore policy before the API server's webhook timeout."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from pydantic import ValidationError

from api.crd import PodSnapshot
from kubeclient.api import ApiException, CustomResources
from webhook.mutate import Found, Lookup, NotFound, Unavailable

LookupFn = Callable[[str, str], Awaitable[Lookup]]


def snapshot_lookup(snapshots: CustomResources[PodSnapshot], timeout: float) -> LookupFn:
    async def lookup(namespace: str, name: str) -> Lookup:
        try:
            async with asyncio.timeout(timeout):
                snap = await snapshots.get(namespace, name, timeout=timeout)
        except TimeoutError:
            return Unavailable(f"no answer within {timeout:g}s")
        except ApiException as e:
            return Unavailable(f"HTTP {e.status} {e.reason}")
        except ValidationError as e:
            return Unavailable(f"the stored object does not match the PodSnapshot schema: {e}")
        except OSError as e:  # aiohttp's connection errors derive from OSError
            return Unavailable(f"{type(e).__name__}: {e}")
        return NotFound() if snap is None else Found(snap)

    return lookup
