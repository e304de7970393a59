"""Forwarding task events to containerd, in order, over its ttrpc events service.

Events are queued and sent by one task, so TaskCreate always precedes TaskStart, TaskExit
and TaskDelete for a container, as containerd requires. A containerd that is restarting must
not block RPCs or lose events: sends are retried with back-off.
"""

from __future__ import annotations

import asyncio
import logging
import time

from google.protobuf import any_pb2, empty_pb2, timestamp_pb2
from google.protobuf.message import Message

from ..proto import events_pb2
from ..ttrpc.client import Client

log = logging.getLogger(__name__)

EVENTS_SERVICE = "containerd.services.events.ttrpc.v1.Events"

TOPICS: dict[type[Message], str] = {
    events_pb2.TaskCreate: "/tasks/create",
    events_pb2.TaskStart: "/tasks/start",
    events_pb2.TaskExit: "/tasks/exit",
    events_pb2.TaskDelete: "/tasks/delete",
    events_pb2.TaskExecAdded: "/tasks/exec-added",
    events_pb2.TaskExecStarted: "/tasks/exec-started",
    events_pb2.TaskOOM: "/tasks/oom",
    events_pb2.TaskCheckpointed: "/tasks/checkpointed",
}


def timestamp(t: float | None = None) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int((time.time() if t is None else t) * 1e9))
    return ts


def envelope(namespace: str, event: Message) -> events_pb2.Envelope:
    # containerd names event types by their full protobuf name, without a URL prefix.
    packed = any_pb2.Any(type_url=event.DESCRIPTOR.full_name, value=event.SerializeToString())
    return events_pb2.Envelope(
        timestamp=timestamp(), namespace=namespace, topic=TOPICS[type(event)], event=packed
    )


class Publisher:
    def __init__(self, address: str, namespace: str, retries: int = 20) -> None:
        self.address = address.removeprefix("unix://")
        self.namespace = namespace
        self.retries = retries
        self.queue: asyncio.Queue[events_pb2.Envelope] = asyncio.Queue()
        self.sent: list[str] = []  # topics, for tests and logs
        self._client: Client | None = None
        self._task: asyncio.Task | None = None
        self._busy = False

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def publish(self, event: Message) -> None:
        self.queue.put_nowait(envelope(self.namespace, event))

    async def flush(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.queue.empty() or self._busy:
            if time.monotonic() > deadline:
                return
            await asyncio.sleep(0.01)

    async def _run(self) -> None:
        while True:
            env = await self.queue.get()
            self._busy = True
            try:
                await self._send(env)
            finally:
                self._busy = False

    async def _send(self, env: events_pb2.Envelope) -> None:
        delay = 0.05
        for attempt in range(self.retries):
            try:
                if self._client is None:
                    self._client = await Client.connect(self.address)
                await self._client.call(
                    EVENTS_SERVICE,
                    "Forward",
                    events_pb2.ForwardRequest(envelope=env),
                    empty_pb2.Empty,
                    timeout=5,
                )
                self.sent.append(env.topic)
                return
            except (TimeoutError, OSError, ConnectionError) as e:
                log.warning("forwarding %s failed (attempt %d): %s", env.topic, attempt + 1, e)
                if self._client is not None:
                    await self._client.close()
                    self._client = None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
        log.error("dropped event %s after %d attempts", env.topic, self.retries)
