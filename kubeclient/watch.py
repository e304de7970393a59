"""Passes on change instead of on a clock: each watched collection is listed once, then
watched from that list's resourceVersion; any event wakes the component's pass, and a burst
of events wakes it once (the pass is level-triggered: it reads what the API server holds, so
one pass covers every event before it). A periodic resync, measured in minutes, repairs
anything a watch could miss; a failed pass is retried with backoff.

- A watch that ends (its server-side timeout) resumes from the last resourceVersion seen.
- 410 Gone (that version was compacted away) re-lists, then watches from the new list.
- Any other failure (the API server restarting, a network error) waits with backoff, then
  re-lists.

    await run_on_changes(agent.pass_once, agent.sources(), resync=300)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
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


async def follow(src: Source, changed: asyncio.Event) -> None:
    """Keep ``changed`` set on every change of ``src``, forever (cancel to stop)."""
    backoff = 1.0
    while True:
        try:
            version = _resource_version(await src.list_fn(*src.args, **src.kwargs))
            changed.set()  # what changed while nobody watched
            while True:
                w = watch.Watch()
                async with w.stream(src.list_fn, *src.args, resource_version=version,
                                    timeout_seconds=WATCH_TIMEOUT, allow_watch_bookmarks=True,
                                    **src.kwargs) as stream:  # fmt: skip
                    async for event in stream:
                        backoff = 1.0
                        if event["type"] != "BOOKMARK":
                            changed.set()
                version = w.resource_version or version  # the server ended it: resume
        except asyncio.CancelledError:
            raise
        except ApiException as e:
            if e.status == 410:
                log.info("watch of %s: resourceVersion too old, listing again", src.name)
                continue
            log.warning("watch of %s failed (HTTP %s), again in %gs", src.name, e.status,
                        backoff)  # fmt: skip
        except Exception as e:
            log.warning("watch of %s failed (%s), again in %gs", src.name, e, backoff)
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, MAX_BACKOFF)


async def run_on_changes(
    pass_once: Callable[[], Awaitable[None]],
    sources: list[Source],
    resync: float,
    stop: asyncio.Event | None = None,
) -> None:
    """Run ``pass_once`` when a source changes, and at least every ``resync`` seconds, until
    ``stop`` is set (default: SIGTERM or SIGINT)."""
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    changed = asyncio.Event()
    changed.set()  # the first pass, at once
    watchers = [asyncio.create_task(follow(s, changed), name=f"watch-{s.name}") for s in sources]
    backoff = 1.0
    try:
        while not stop.is_set():
            waits = [asyncio.ensure_future(changed.wait()), asyncio.ensure_future(stop.wait())]
            await asyncio.wait(waits, timeout=resync, return_when=asyncio.FIRST_COMPLETED)
            for f in waits:
                f.cancel()
            if stop.is_set():
                break
            changed.clear()
            try:
                await pass_once()
                backoff = 1.0
            except (ApiException, OSError) as e:
                log.warning("pass failed, again in %gs: %s", backoff, e)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)
                changed.set()
    finally:
        for t in watchers:
            t.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
