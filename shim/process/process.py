"""A container's processes: the init process (the container itself) and exec'd processes.
The state objects in states.py decide what is allowed; the ``do_*`` methods here do it."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from restore_runtime.runc import Runc, RuncError

from .errors import InvalidArgument, NotFound, ProcessError, RuntimeFailed, Unimplemented
from .io import ProcessIO, StdioPaths
from .restore import RestoreTarget, restore_init
from .states import Created, State

if TYPE_CHECKING:
    from restore_runtime.node import NodeContext

log = logging.getLogger(__name__)


def runc_call(coro):
    """runc's failures as the shim's errors."""

    async def wrapped():
        try:
            return await coro
        except RuncError as e:
            # containerd treats NotFound from Kill as "already gone", as with the runc shim
            if any(m in e.message for m in ("does not exist", "not found", "not running")):
                raise NotFound(e.message) from e
            raise RuntimeFailed(str(e)) from e

    return wrapped()


@dataclass
class Process:
    container_id: str
    exec_id: str
    runc: Runc
    stdio: StdioPaths
    workdir: Path
    state: State = field(default_factory=Created)
    pid: int = 0
    exit_status: int = 0
    exited_at: float | None = None
    io: ProcessIO | None = None
    #: a failed restore's stdio, until the cold start's takes its output targets over
    failed_io: ProcessIO | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    #: the exit was reaped and is being reported (after its output is drained)
    exiting: bool = False
    #: Start is in progress: an exit reaped meanwhile waits in pending_exit until the process
    #: is Running and TaskStart is out (else the exit lands first and Start then overwrites
    #: Stopped with Running, and Delete refuses the "running" task forever)
    starting: bool = False
    pending_exit: int | None = None

    @property
    def pidfile(self) -> Path:
        return self.workdir / f"{self.exec_id or 'init'}.pid"

    def set_exited(self, code: int) -> None:
        self.exit_status = code
        self.exited_at = time.time()
        self.state = self.state.exited(self)
        self.done.set()

    async def do_kill(self, sig: int, all_: bool) -> None:
        if self.pid <= 0:
            raise NotFound("process has no pid")
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            raise NotFound("process already finished") from None

    async def do_delete(self, never_started: bool = False) -> None:
        if self.io is not None:
            await self.io.wait_drained(timeout=2.0)
            self.io.close()

    async def do_pause(self) -> None:
        raise Unimplemented("pausing a single exec process")

    async def do_resume(self) -> None:
        raise Unimplemented("resuming a single exec process")

    def read_pid(self) -> int:
        return int(self.pidfile.read_text().strip())


@dataclass
class InitProcess(Process):
    bundle: Path = Path()
    #: what the spec's annotations say about its restore (None: a plain container), and
    #: the node it restores on
    restore_target: RestoreTarget | None = None
    node: NodeContext | None = None

    def drop_failed_io(self) -> None:
        if self.failed_io is not None:
            self.failed_io.close()
            self.failed_io = None

    async def do_create(self) -> None:
        try:
            self.io = await ProcessIO.open(self.stdio, after=self.failed_io)
        finally:
            self.drop_failed_io()
        await with_console(
            self.io,
            runc_call(
                self.runc.create(
                    self.container_id,
                    self.bundle,
                    self.pidfile,
                    self.io.child,
                    self.io.console_socket,
                )
            ),
        )
        self.io.after_start()
        self.pid = self.read_pid()

    async def do_start(self) -> None:
        await runc_call(self.runc.start(self.container_id))

    async def do_restore(self) -> None:
        """Restore from the artifact (RestoreFailed when it did not happen: nothing is left
        behind, and a cold start may follow)."""
        assert self.restore_target is not None and self.node is not None
        report = await restore_init(self, self.restore_target, self.node)
        self.restore_target.report(report)

    async def do_kill(self, sig: int, all_: bool) -> None:
        await runc_call(self.runc.kill(self.container_id, sig, all_))

    async def do_delete(self, never_started: bool = False) -> None:
        if not never_started:
            try:
                await self.runc.delete(self.container_id, force=True)
            except RuncError as e:
                if "does not exist" not in e.message:
                    raise RuntimeFailed(str(e)) from e
        await super().do_delete()

    async def do_pause(self) -> None:
        await runc_call(self.runc.pause(self.container_id))

    async def do_update(self, resources: Path) -> None:
        await runc_call(self.runc.update(self.container_id, resources))

    async def do_resume(self) -> None:
        await runc_call(self.runc.resume(self.container_id))


@dataclass
class ExecProcess(Process):
    spec: bytes = b""

    async def do_start(self) -> None:
        spec_path = self.workdir / f"{self.exec_id}.process.json"
        spec_path.write_bytes(self.spec)
        self.io = await ProcessIO.open(self.stdio)
        try:
            await with_console(
                self.io,
                runc_call(
                    self.runc.exec(
                        self.container_id,
                        spec_path,
                        self.pidfile,
                        self.io.child,
                        self.io.console_socket,
                    )
                ),
            )
        except ProcessError:
            self.io.close()
            raise
        self.io.after_start()
        self.pid = self.read_pid()


async def with_console(io: ProcessIO, runc_coro) -> None:
    """Run a runc create/exec; for a terminal, take the pty master it sends meanwhile."""
    if io.console_socket is None:
        await runc_coro
        return
    receiving = asyncio.ensure_future(io.receive_master())
    try:
        await runc_coro
    except BaseException:
        receiving.cancel()
        io.close()
        raise
    await receiving


def validate_exec_spec(spec: bytes) -> None:
    try:
        d = json.loads(spec)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InvalidArgument(f"exec spec is not JSON: {e}") from e
    if not isinstance(d, dict) or not d.get("args"):
        raise InvalidArgument("exec spec has no args")
