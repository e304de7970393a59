"""Following a collection instead of polling it: it is listed once, then watched from that
list's resourceVersion; every listed object and every event's object goes to a callback
(kubeclient.workqueue turns them into per-object work).

- A watch that ends (its server-side timeout) resumes from the last resourceVersion seen.
- 410 Gone (that version was compacted away) re-lists, then watches from the new list.
- Any other failure (the API server restarting, a network error) waits with backoff, then
  re-lists.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import watch
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger("snapshot.watch")

#: seconds the API server keeps one watch open before ending it (it is resumed at once)
WATCH_TIMEOUT = 300
MAX_BACKOFF = 30.0


@dataclass(frozen=True)
class Source:
    """One watched collection: a kubernetes_asyncio list function with its arguments."""

    name: str
    list_fn: Callable[..., Awaitable[Any]]
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


def _resource_version(listed: Any) -> str:
    if isinstance(listed, dict):  # custom objects come back as dicts
        return listed["metadata"]["resourceVersion"]
    return listed.metadata.resource_version


Notify = Callable[[dict | None], None]


def listed_items(listed: Any, sanitize: Callable[[Any], Any]) -> list[dict]:
    items = listed.get("items", []) if isinstance(listed, dict) else listed.items
    return [i if isinstance(i, dict) else sanitize(i) for i in items or []]


async def follow(src: Source, notify: Notify, sanitize: Callable[[Any], Any] = dict) -> None:
    """Call ``notify`` with every object of ``src`` as listed (each time it is listed), then
    with every object a watch event carries, forever (cancel to stop); ``notify(None)`` after
    a list, which covers what changed while nobody watched. ``sanitize`` turns a listed
    model (core resources) into its API dict."""
    backoff = 1.0
    while True:
        try:
            listed = await src.list_fn(*src.args, **src.kwargs)
            version = _resource_version(listed)
            for obj in listed_items(listed, sanitize):
                notify(obj)
            notify(None)
            while True:
                w = watch.Watch()
                async with w.stream(
                    src.list_fn,
                    *src.args,
                    resource_version=version,
                    timeout_seconds=WATCH_TIMEOUT,
                    allow_watch_bookmarks=True,
                    **src.kwargs,
                ) as stream:
                    async for event in stream:
                        backoff = 1.0
                        if event["type"] != "BOOKMARK":
                            notify(event.get("raw_object") or None)
                version = w.resource_version or version  # the server ended it: resume
        except asyncio.CancelledError:
            raise
        except ApiException as e:
            if e.status == 410:
                log.info("watch of %s: resourceVersion too old, listing again", src.name)
                continue
            log.warning("watch of %s failed (HTTP %s), again in %gs", src.name, e.status, backoff)
        except Exception as e:
            log.warning("watch of %s failed (%s), again in %gs", src.name, e, backoff)
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, MAX_BACKOFF)
