"""ttrpc server: a dispatch table from ``/package.Service/Method`` to handlers, served on a
unix socket. Unknown methods answer UNIMPLEMENTED; a handler's exception answers INTERNAL
and never takes the server (or other streams) down."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError, Message

from ..proto import ttrpc_pb2
from . import framing
from .codes import Code, RPCError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Handler:
    fn: Callable[[Any], Awaitable[Message]]
    request_type: type[Message]


Handlers = dict[str, Handler]


async def dispatch(handlers: Handlers, data: bytes) -> ttrpc_pb2.Response:
    """Decode one Request frame's data, run its handler, build the Response."""
    req = ttrpc_pb2.Request()
    try:
        req.ParseFromString(data)
    except DecodeError as e:
        return _error(Code.INVALID_ARGUMENT, f"malformed ttrpc request: {e}")
    path = f"/{req.service}/{req.method}"
    handler = handlers.get(path)
    if handler is None:
        return _error(Code.UNIMPLEMENTED, f"{path} is not implemented")
    msg = handler.request_type()
    try:
        msg.ParseFromString(req.payload)
    except DecodeError as e:
        return _error(Code.INVALID_ARGUMENT, f"malformed {msg.DESCRIPTOR.full_name}: {e}")
    what = f"{req.method} {_target(msg)}"
    log.debug("-> %s", what)
    # A call still running after SLOW_S is logged (with SIGUSR1, the shim then dumps where
    # every task waits): a hung RPC otherwise blocks containerd with nothing in any log.
    slow = asyncio.get_running_loop().call_later(
        SLOW_S, log.warning, "%s still running after %gs", what, SLOW_S
    )
    try:
        reply = await handler.fn(msg)
    except RPCError as e:
        log.debug("<- %s: %s %s", what, e.code.name, e.message)
        return _error(e.code, e.message)
    except Exception as e:
        log.exception("handler %s failed", path)
        return _error(Code.INTERNAL, f"{type(e).__name__}: {e}")
    finally:
        slow.cancel()
    log.debug("<- %s: ok", what)
    return ttrpc_pb2.Response(status=ttrpc_pb2.Status(code=0), payload=reply.SerializeToString())


SLOW_S = 10.0


def _target(msg: Message) -> str:
    ids = [getattr(msg, f, "") for f in ("id", "exec_id")]
    return "/".join(i for i in ids if i)[:80]


def _error(code: Code, message: str) -> ttrpc_pb2.Response:
    return ttrpc_pb2.Response(status=ttrpc_pb2.Status(code=int(code), message=message))


class _Connection(asyncio.Protocol):
    def __init__(self, handlers: Handlers) -> None:
        self.handlers = handlers
        self.decoder = framing.Decoder()
        self.transport: asyncio.Transport | None = None
        self.tasks: set[asyncio.Task] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        for frame in self.decoder.feed(data):
            if frame.oversize:
                self._reply(frame.stream_id, _error(Code.RESOURCE_EXHAUSTED, "message too large"))
            elif frame.type == framing.MessageType.REQUEST:
                task = asyncio.ensure_future(self._serve(frame))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
            # Data frames belong to streaming calls, which the task API does not use.

    async def _serve(self, frame: framing.Frame) -> None:
        self._reply(frame.stream_id, await dispatch(self.handlers, frame.data))

    def _reply(self, stream_id: int, resp: ttrpc_pb2.Response) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        data = resp.SerializeToString()
        if len(data) > framing.MAX_MESSAGE:
            data = _error(Code.RESOURCE_EXHAUSTED, "response too large").SerializeToString()
        self.transport.write(framing.encode(stream_id, framing.MessageType.RESPONSE, data))

    def connection_lost(self, exc: Exception | None) -> None:
        for t in self.tasks:
            t.cancel()


async def serve_unix(handlers: Handlers, path: str | None = None, sock=None) -> asyncio.Server:
    """Serve on a unix socket path (created 0600), or on an already-bound listening socket
    (the shim inherits one from its ``start`` invocation)."""
    loop = asyncio.get_running_loop()
    if sock is not None:
        return await loop.create_unix_server(lambda: _Connection(handlers), sock=sock)
    server = await loop.create_unix_server(lambda: _Connection(handlers), path=path)
    os.chmod(path, 0o600)
    return server
