"""The one place where the shim's own errors (process/errors.py) become ttrpc statuses."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ..process import errors as e
from ..ttrpc.codes import Code, RPCError

T = TypeVar("T")
R = TypeVar("R")

CODES: dict[type[e.ProcessError], Code] = {
    e.NotFound: Code.NOT_FOUND,
    e.AlreadyExists: Code.ALREADY_EXISTS,
    e.InvalidArgument: Code.INVALID_ARGUMENT,
    e.FailedPrecondition: Code.FAILED_PRECONDITION,
    e.Unimplemented: Code.UNIMPLEMENTED,
    e.RuntimeFailed: Code.UNKNOWN,
    e.MountFailed: Code.INTERNAL,
}


def to_rpc(err: e.ProcessError) -> RPCError:
    return RPCError(CODES.get(type(err), Code.UNKNOWN), err.message)


def mapped(fn: Callable[[T], Awaitable[R]]) -> Callable[[T], Awaitable[R]]:
    """An RPC handler whose process errors answer with their status."""

    @functools.wraps(fn)
    async def handler(request: T) -> R:
        try:
            return await fn(request)
        except e.ProcessError as err:
            raise to_rpc(err) from err

    return handler
