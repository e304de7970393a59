"""Per-object work, as client-go's informers and work queues do it: each watched object (or
the object an event points to) becomes a key; a key queued many times before a worker takes
it is reconciled once, with the newest object seen; one key is never reconciled by two
workers at once (an event during its reconcile queues it again, for after); a reconcile that
fails is retried for that key alone, after a backoff that doubles per failure.

    await run_per_object(reconcile, [Watched(source, keys_of)], resync=60)

``reconcile(key, obj)`` gets the object from the list or watch event (``None`` when the
event was another object's, a pod pointing at its job, say: it reads the object itself).
A resync, measured in minutes, lists every source again and queues every key."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .watch import MAX_BACKOFF, Source, follow, listed_items

log = logging.getLogger("snapshot.workqueue")
Key = tuple[str, str, str]  # (kind, namespace, name)


class WorkQueue:
    def __init__(self, base_delay: float = 0.5, max_delay: float = MAX_BACKOFF) -> None:
        self.base_delay, self.max_delay = base_delay, max_delay
        self._pending: dict[Key, dict | None] = {}  # insertion-ordered: first in, first out
        self._processing: set[Key] = set()
        self._again: dict[Key, dict | None] = {}
        self._failures: dict[Key, int] = {}
        self._wake = asyncio.Event()

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, key: Key, obj: dict | None = None) -> None:
        """Queue ``key``; ``obj`` (its newest state) replaces any older one queued with it."""
        target = self._again if key in self._processing else self._pending
        if obj is not None or key not in target:
            target[key] = obj
        self._wake.set()

    async def get(self) -> tuple[Key, dict | None]:
        while not self._pending:
            self._wake.clear()
            await self._wake.wait()
        key = next(iter(self._pending))
        obj = self._pending.pop(key)
        self._processing.add(key)
        return key, obj

    def done(self, key: Key, ok: bool) -> float | None:
        """``key``'s reconcile ended; after a failure it is queued again after a backoff
        (returned, in seconds), unless an event queued it meanwhile."""
        self._processing.discard(key)
        delay = None
        if ok:
            self._failures.pop(key, None)
        else:
            n = self._failures[key] = self._failures.get(key, 0) + 1
            delay = min(self.base_delay * 2 ** (n - 1), self.max_delay)
        if key in self._again:
            self.add(key, self._again.pop(key))
        elif delay is not None:
            asyncio.get_running_loop().call_later(delay, self.add, key)
        return delay


@dataclass(frozen=True)
class Watched:
    """A watched collection, and the keys each of its objects asks to reconcile."""

    source: Source
    keys: Callable[[dict], list[tuple[Key, dict | None]]]


async def run_per_object(
    reconcile: Callable[[Key, dict | None], Awaitable[None]],
    watched: list[Watched],
    resync: float,
    stop: asyncio.Event | None = None,
    sanitize: Callable[[Any], Any] = dict,
    on_depth: Callable[[int], None] | None = None,
    workers: int = 4,
) -> None:
    """Reconcile each object when it changes, and every object every ``resync`` seconds,
    until ``stop`` is set (default: SIGTERM or SIGINT)."""
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    queue = WorkQueue()

    def notify(w: Watched) -> Callable[[dict | None], None]:
        def on(obj: dict | None) -> None:
            for key, o in w.keys(obj) if obj is not None else ():
                queue.add(key, o)
            if on_depth is not None:
                on_depth(len(queue))

        return on

    async def worker() -> None:
        while True:
            key, obj = await queue.get()
            ok = False
            try:
                await reconcile(key, obj)
                ok = True
            except asyncio.CancelledError:
                raise
            except Exception as e:  # that key is retried; the others go on
                log.warning("reconciling %s %s/%s failed: %s", *key, e)
            delay = queue.done(key, ok)
            if delay is not None:
                log.info("%s %s/%s: again in %gs", *key, delay)

    async def resyncs() -> None:
        while True:
            await asyncio.sleep(resync)
            for w, on in zip(watched, notifiers, strict=True):
                try:
                    listed = await w.source.list_fn(*w.source.args, **w.source.kwargs)
                except Exception as e:  # the next resync tries again; watches go on
                    log.warning("resync of %s failed: %s", w.source.name, e)
                    continue
                for item in listed_items(listed, sanitize):
                    on(item)

    notifiers = [notify(w) for w in watched]
    tasks = [
        asyncio.create_task(follow(w.source, on, sanitize), name=w.source.name)
        for w, on in zip(watched, notifiers, strict=True)
    ]
    tasks += [asyncio.create_task(worker()) for _ in range(workers)]
    tasks.append(asyncio.create_task(resyncs()))
    try:
        await stop.wait()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def meta(obj: dict) -> tuple[str, str]:
    m = obj.get("metadata") or {}
    return m.get("namespace") or "", m.get("name") or ""
