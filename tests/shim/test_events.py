"""Event forwarding to a real ttrpc events service (a stand-in for containerd's, recording what
it receives over a real unix socket): order, envelope fields, type URLs, and retry while the
receiver is down, as when containerd restarts."""

from __future__ import annotations

import asyncio

from google.protobuf import empty_pb2

from shim.proto import events_pb2
from shim.task.events import EVENTS_SERVICE, Publisher
from shim.ttrpc.server import Handler, serve_unix


async def start_receiver(path: str, got: list):
    async def forward(req: events_pb2.ForwardRequest) -> empty_pb2.Empty:
        got.append(req.envelope)
        return empty_pb2.Empty()

    return await serve_unix(
        {f"/{EVENTS_SERVICE}/Forward": Handler(forward, events_pb2.ForwardRequest)}, path
    )


async def test_events_arrive_in_order_with_envelopes(tmp_path):
    path = str(tmp_path / "events.sock")
    got: list = []
    server = await start_receiver(path, got)
    pub = Publisher(f"unix://{path}", "k8s.io")
    pub.start()
    pub.publish(events_pb2.TaskCreate(container_id="c1", pid=10))
    pub.publish(events_pb2.TaskStart(container_id="c1", pid=10))
    pub.publish(events_pb2.TaskExecAdded(container_id="c1", exec_id="e1"))
    pub.publish(events_pb2.TaskExecStarted(container_id="c1", exec_id="e1", pid=11))
    pub.publish(events_pb2.TaskExit(container_id="c1", id="c1", pid=10, exit_status=137))
    pub.publish(events_pb2.TaskDelete(container_id="c1", pid=10, exit_status=137))
    await pub.flush()
    server.close()
    assert [e.topic for e in got] == [
        "/tasks/create",
        "/tasks/start",
        "/tasks/exec-added",
        "/tasks/exec-started",
        "/tasks/exit",
        "/tasks/delete",
    ]
    assert {e.namespace for e in got} == {"k8s.io"}
    assert got[0].event.type_url == "containerd.events.TaskCreate"
    exit_ev = events_pb2.TaskExit()
    exit_ev.ParseFromString(got[4].event.value)
    assert exit_ev.exit_status == 137


async def test_events_wait_for_a_restarting_receiver(tmp_path):
    path = str(tmp_path / "events.sock")
    got: list = []
    pub = Publisher(f"unix://{path}", "k8s.io")
    pub.start()
    pub.publish(events_pb2.TaskStart(container_id="c2", pid=1))
    await asyncio.sleep(0.3)  # nothing listens yet: the publisher retries
    server = await start_receiver(path, got)
    await pub.flush()
    server.close()
    assert [e.topic for e in got] == ["/tasks/start"]
