"""ttrpc server and client over a real unix socket.

Cases: a unary call round-trips; unknown methods answer UNIMPLEMENTED; malformed requests
answer INVALID_ARGUMENT; a crashing handler answers INTERNAL and the server keeps serving;
concurrent calls on one connection are matched by stream id; an oversize frame answers
RESOURCE_EXHAUSTED and the connection stays usable.
"""

from __future__ import annotations

import asyncio

import pytest

from shim.proto import shim_pb2, ttrpc_pb2
from shim.ttrpc import framing
from shim.ttrpc.client import Client
from shim.ttrpc.codes import Code, RPCError
from shim.ttrpc.server import Handler, serve_unix

SVC = "containerd.task.v2.Task"


async def state(req: shim_pb2.StateRequest) -> shim_pb2.StateResponse:
    if req.id == "boom":
        raise ZeroDivisionError("handler bug")
    if req.id == "missing":
        raise RPCError(Code.NOT_FOUND, "no such task")
    if req.id == "slow":
        await asyncio.sleep(0.2)
    return shim_pb2.StateResponse(id=req.id, pid=42)


HANDLERS = {f"/{SVC}/State": Handler(state, shim_pb2.StateRequest)}


@pytest.fixture
async def client(tmp_path):
    path = str(tmp_path / "s.sock")
    server = await serve_unix(HANDLERS, path)
    c = await Client.connect(path)
    yield c
    await c.close()
    server.close()
    await server.wait_closed()


async def test_unary_call(client):
    r = await client.call(SVC, "State", shim_pb2.StateRequest(id="c1"), shim_pb2.StateResponse)
    assert (r.id, r.pid) == ("c1", 42)


async def test_unknown_method(client):
    with pytest.raises(RPCError) as e:
        await client.call(SVC, "Nope", shim_pb2.StateRequest(), shim_pb2.StateResponse)
    assert e.value.code == Code.UNIMPLEMENTED


async def test_handler_errors_become_statuses_and_server_survives(client):
    with pytest.raises(RPCError) as e:
        await client.call(SVC, "State", shim_pb2.StateRequest(id="boom"), shim_pb2.StateResponse)
    assert e.value.code == Code.INTERNAL and "handler bug" in e.value.message
    with pytest.raises(RPCError) as e:
        await client.call(SVC, "State", shim_pb2.StateRequest(id="missing"), shim_pb2.StateResponse)
    assert e.value.code == Code.NOT_FOUND
    r = await client.call(SVC, "State", shim_pb2.StateRequest(id="ok"), shim_pb2.StateResponse)
    assert r.id == "ok"


async def test_concurrent_calls_match_by_stream(client):
    slow = client.call(SVC, "State", shim_pb2.StateRequest(id="slow"), shim_pb2.StateResponse)
    fast = client.call(SVC, "State", shim_pb2.StateRequest(id="fast"), shim_pb2.StateResponse)
    a, b = await asyncio.gather(slow, fast)
    assert (a.id, b.id) == ("slow", "fast")


async def raw_exchange(path: str, payload: bytes) -> ttrpc_pb2.Response:
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(payload)
    header = await reader.readexactly(framing.HEADER_SIZE)
    length, _, _, _ = framing.HEADER.unpack(header)
    resp = ttrpc_pb2.Response()
    resp.ParseFromString(await reader.readexactly(length))
    writer.close()
    return resp


async def test_malformed_request_payloads(tmp_path):
    path = str(tmp_path / "s.sock")
    server = await serve_unix(HANDLERS, path)
    try:
        resp = await raw_exchange(path, framing.encode(1, 1, b"\xff\xff\xff"))
        assert resp.status.code == Code.INVALID_ARGUMENT
        bad_inner = ttrpc_pb2.Request(service=SVC, method="State", payload=b"\x0a\xff")
        resp = await raw_exchange(path, framing.encode(3, 1, bad_inner.SerializeToString()))
        assert resp.status.code == Code.INVALID_ARGUMENT
        assert "containerd.task.v2.StateRequest" in resp.status.message
    finally:
        server.close()


async def test_oversize_frame_answers_resource_exhausted(tmp_path):
    path = str(tmp_path / "s.sock")
    server = await serve_unix(HANDLERS, path)
    try:
        reader, writer = await asyncio.open_unix_connection(path)
        big = framing.MAX_MESSAGE + 10
        writer.write(framing.HEADER.pack(big, 1, 1, 0) + b"\0" * big)
        ok = ttrpc_pb2.Request(
            service=SVC,
            method="State",
            payload=shim_pb2.StateRequest(id="after").SerializeToString(),
        )
        writer.write(framing.encode(3, 1, ok.SerializeToString()))
        statuses = []
        for _ in range(2):
            length, sid, _, _ = framing.HEADER.unpack(await reader.readexactly(10))
            resp = ttrpc_pb2.Response()
            resp.ParseFromString(await reader.readexactly(length))
            statuses.append((sid, resp.status.code))
        assert sorted(statuses) == [(1, Code.RESOURCE_EXHAUSTED), (3, 0)]
        writer.close()
    finally:
        server.close()
