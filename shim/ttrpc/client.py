"""A unary ttrpc client on asyncio, for forwarding events to containerd and for tests."""

from __future__ import annotations

import asyncio
import contextlib
import itertools

from google.protobuf.message import Message

from ..proto import ttrpc_pb2
from . import framing
from .codes import Code, RPCError


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._ids = itertools.count(1, 2)  # client streams are odd
        self._pending: dict[int, asyncio.Future] = {}
        self._decoder = framing.Decoder()
        self._reader_task = asyncio.ensure_future(self._read())

    @classmethod
    async def connect(cls, path: str) -> Client:
        reader, writer = await asyncio.open_unix_connection(path)
        return cls(reader, writer)

    async def call(
        self,
        service: str,
        method: str,
        request: Message,
        reply_type: type[Message],
        timeout: float = 10.0,
    ) -> Message:
        sid = next(self._ids)
        req = ttrpc_pb2.Request(
            service=service,
            method=method,
            payload=request.SerializeToString(),
            timeout_nano=int(timeout * 1e9),
        )
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending[sid] = fut
        self._writer.write(
            framing.encode(sid, framing.MessageType.REQUEST, req.SerializeToString())
        )
        try:
            resp: ttrpc_pb2.Response = await asyncio.wait_for(fut, timeout)
        finally:
            self._pending.pop(sid, None)
        if resp.status.code != 0:
            raise RPCError(Code(resp.status.code), resp.status.message)
        reply = reply_type()
        reply.ParseFromString(resp.payload)
        return reply

    async def _read(self) -> None:
        try:
            while data := await self._reader.read(65536):
                for f in self._decoder.feed(data):
                    fut = self._pending.get(f.stream_id)
                    if fut and not fut.done() and f.type == framing.MessageType.RESPONSE:
                        resp = ttrpc_pb2.Response()
                        resp.ParseFromString(f.data)
                        fut.set_result(resp)
        finally:
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("ttrpc connection closed"))

    async def close(self) -> None:
        self._reader_task.cancel()
        self._writer.close()
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            await self._writer.wait_closed()
