"""Where checkpoints run: threads of their own, a bounded number, shared fairly between
namespaces, one per pod at a time.

A checkpoint blocks a thread for as long as the workload takes to quiesce (the handshake
waits up to its timeout) and then for the dump. On the event loop's default executor, which
the API client also uses, a few dozen PodSnapshots of one pod that never answers would
stop every other namespace's checkpoints, restore reports and deletions on the node. Here
they wait for a slot of their namespace instead: no namespace holds more than
``per_namespace`` of the ``total`` slots, and the default executor is never used."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class CheckpointSlots:
    def __init__(self, total: int = 4, per_namespace: int = 2) -> None:
        if total < 1 or per_namespace < 1:
            raise ValueError("checkpoint slots must be at least 1")
        self.total, self.per_namespace = total, min(per_namespace, total)
        self._executor = ThreadPoolExecutor(max_workers=total, thread_name_prefix="checkpoint")
        self._all: asyncio.Semaphore | None = None
        self._namespaces: dict[str, asyncio.Semaphore] = {}
        self._pods: dict[str, asyncio.Lock] = {}
        self._users: dict[str, int] = {}
        #: checkpoints waiting for or holding a slot, by namespace (a gauge's source)
        self.waiting: dict[str, int] = {}

    @contextlib.asynccontextmanager
    async def hold(self, namespace: str, pod_uid: str) -> AsyncIterator[None]:
        """A slot for one checkpoint of pod ``pod_uid``: the pod's own turn first (one
        checkpoint of a pod at a time), then its namespace's, then the node's."""
        if self._all is None:  # made on the loop that uses it
            self._all = asyncio.Semaphore(self.total)
        ns = self._namespaces.setdefault(namespace, asyncio.Semaphore(self.per_namespace))
        pod = self._pods.setdefault(pod_uid, asyncio.Lock())
        self._users[pod_uid] = self._users.get(pod_uid, 0) + 1
        self.waiting[namespace] = self.waiting.get(namespace, 0) + 1
        try:
            async with pod, ns, self._all:
                yield
        finally:
            self.waiting[namespace] -= 1
            if not self.waiting[namespace]:
                del self.waiting[namespace]
            self._users[pod_uid] -= 1
            if not self._users[pod_uid]:  # nobody holds or waits for this pod's lock
                del self._users[pod_uid], self._pods[pod_uid]

    async def run(self, fn: Callable[..., T], *args) -> T:
        """``fn(*args)`` on a checkpoint thread (call it while holding a slot)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
