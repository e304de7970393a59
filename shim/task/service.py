"""The task API: translates ttrpc RPCs into operations on containers (process/container.py),
publishes containerd's events, and maps the errors those raise to ttrpc statuses in one
place (errors.py). Protobuf types stay here; process/ and runc/ never see them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path

from google.protobuf import empty_pb2

from restore_runtime.node import NodeContext

from .. import VERSION
from ..process import oom, stats
from ..process.container import Container, Mount, new_container
from ..process.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unimplemented,
)
from ..process.io import StdioPaths
from ..process.process import Process
from ..proto import events_pb2, shim_pb2, types_pb2
from ..reaper import Reaper
from ..ttrpc.server import Handler, Handlers
from .errors import mapped
from .events import Publisher, timestamp

log = logging.getLogger(__name__)
SERVICE = "containerd.task.v2.Task"


def _exited_at(p: Process):
    """The exit time as a protobuf Timestamp; None (unset) while the process runs."""
    return timestamp(p.exited_at) if p.exited_at else None


class TaskService:
    def __init__(
        self,
        node: NodeContext,
        reaper: Reaper,
        publisher: Publisher,
        workdir: Path,
        on_empty: Callable[[], None] | None = None,
    ) -> None:
        #: the node, built once by bootstrap: its settings, keys, cache and runc
        self.node = node
        self.reaper, self.events = reaper, publisher
        self.workdir = workdir
        self.containers: dict[str, Container] = {}
        self.on_empty = on_empty
        self._exit_tasks: set[asyncio.Task] = set()
        reaper.subscribe(self._on_exit)

    def handlers(self) -> Handlers:
        S = shim_pb2
        table = {
            "State": (self.state, S.StateRequest),
            "Create": (self.create, S.CreateTaskRequest),
            "Start": (self.start, S.StartRequest),
            "Delete": (self.delete, S.DeleteRequest),
            "Pids": (self.pids, S.PidsRequest),
            "Pause": (self.pause, S.PauseRequest),
            "Resume": (self.resume, S.ResumeRequest),
            "Kill": (self.kill, S.KillRequest),
            "Exec": (self.exec, S.ExecProcessRequest),
            "Wait": (self.wait, S.WaitRequest),
            "ResizePty": (self.resize_pty, S.ResizePtyRequest),
            "CloseIO": (self.close_io, S.CloseIORequest),
            "Update": (self.update, S.UpdateTaskRequest),
            "Stats": (self.stats, S.StatsRequest),
            "Connect": (self.connect, S.ConnectRequest),
            "Shutdown": (self.shutdown, S.ShutdownRequest),
            "Checkpoint": (self.checkpoint, S.CheckpointTaskRequest),
        }
        return {f"/{SERVICE}/{k}": Handler(mapped(fn), req) for k, (fn, req) in table.items()}

    # -- helpers ----------------------------------------------------------------------------
    def _get(self, id_: str) -> Container:
        c = self.containers.get(id_)
        if c is None:
            raise NotFound(f"container {id_!r} not found")
        return c

    def _on_exit(self, pid: int, code: int) -> None:
        for c in self.containers.values():
            for p in (c.init, *c.execs.values()):
                if p.pid == pid and not p.done.is_set() and not p.exiting:
                    if p.starting:
                        p.pending_exit = code
                        return
                    p.exiting = True
                    task = asyncio.ensure_future(self._finish_exit(c, p, code))
                    self._exit_tasks.add(task)
                    task.add_done_callback(self._exit_tasks.discard)
                    return

    async def _finish_exit(self, c: Container, p: Process, code: int) -> None:
        """Report an exit once the process's output is copied (bounded), as the runc shim
        does: a client that stops reading at the exit event must not lose the last lines."""
        if p.io is not None:
            await p.io.wait_drained(timeout=2.0)
        if p is c.init and oom.oom_kills(stats.memory_dir(c.cgroup_dirs)) > c.oom_baseline:
            # before TaskExit, so CRI records reason OOMKilled
            self.events.publish(events_pb2.TaskOOM(container_id=c.id))
        p.set_exited(code)
        self.events.publish(
            events_pb2.TaskExit(
                container_id=c.id,
                id=p.exec_id or c.id,
                pid=p.pid,
                exit_status=code,
                exited_at=timestamp(p.exited_at),
            )
        )
        if p is c.init:
            # the container's other processes die with its init (the runc shim does so)
            for e in c.execs.values():
                if not e.done.is_set() and e.pid:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(e.pid, signal.SIGKILL)

    def _check_already_exited(self, p: Process) -> None:
        """The process may have exited before its pid was known (reaped, not yet matched)."""
        code = self.reaper.forget(p.pid)
        if code is not None:
            self._on_exit(p.pid, code)

    # -- RPCs -------------------------------------------------------------------------------
    async def create(self, r: shim_pb2.CreateTaskRequest) -> shim_pb2.CreateTaskResponse:
        if not r.id:
            raise InvalidArgument("container id is empty")
        if r.id in self.containers:
            raise AlreadyExists(f"container {r.id!r} already exists")
        c = await new_container(
            r.id,
            Path(r.bundle),
            [Mount(m.type, m.source, list(m.options)) for m in r.rootfs],
            StdioPaths(r.stdin, r.stdout, r.stderr, r.terminal),
            self.node,
            self.workdir,
        )
        init = c.init
        self.containers[r.id] = c
        if init.pid:
            c.note_cgroups()
            self._check_already_exited(init)
        self.events.publish(
            events_pb2.TaskCreate(
                container_id=r.id,
                bundle=r.bundle,
                rootfs=list(r.rootfs),
                pid=init.pid,
                io=events_pb2.TaskIO(
                    stdin=r.stdin, stdout=r.stdout, stderr=r.stderr, terminal=r.terminal
                ),
                checkpoint=r.checkpoint,
            )
        )
        return shim_pb2.CreateTaskResponse(pid=init.pid)

    async def start(self, r: shim_pb2.StartRequest) -> shim_pb2.StartResponse:
        c = self._get(r.id)
        p = c.process(r.exec_id)
        p.starting = True
        try:
            await c.start(p)
            if r.exec_id:
                self.events.publish(
                    events_pb2.TaskExecStarted(container_id=c.id, exec_id=r.exec_id, pid=p.pid)
                )
            else:
                self.events.publish(events_pb2.TaskStart(container_id=c.id, pid=p.pid))
        finally:
            # An exit that came during Start is handled now, after TaskStart (containerd
            # expects that order), or after a failed start, so waiters are not left hanging.
            p.starting = False
            if p.pending_exit is not None:
                code, p.pending_exit = p.pending_exit, None
                self._on_exit(p.pid, code)
            elif p.pid:
                self._check_already_exited(p)
        return shim_pb2.StartResponse(pid=p.pid)

    async def delete(self, r: shim_pb2.DeleteRequest) -> shim_pb2.DeleteResponse:
        c = self._get(r.id)
        p = await c.delete(r.exec_id)
        if not r.exec_id:
            del self.containers[r.id]
        resp = shim_pb2.DeleteResponse(
            pid=p.pid, exit_status=p.exit_status, exited_at=_exited_at(p)
        )
        self.events.publish(
            events_pb2.TaskDelete(
                container_id=c.id,
                pid=p.pid,
                exit_status=p.exit_status,
                exited_at=resp.exited_at,
                id=r.exec_id or c.id,
            )
        )
        return resp

    async def exec(self, r: shim_pb2.ExecProcessRequest) -> empty_pb2.Empty:
        c = self._get(r.id)
        await c.exec(r.exec_id, StdioPaths(r.stdin, r.stdout, r.stderr, r.terminal), r.spec.value)
        self.events.publish(events_pb2.TaskExecAdded(container_id=c.id, exec_id=r.exec_id))
        return empty_pb2.Empty()

    async def state(self, r: shim_pb2.StateRequest) -> shim_pb2.StateResponse:
        c = self._get(r.id)
        p = c.process(r.exec_id)
        resp = shim_pb2.StateResponse(
            id=p.exec_id or c.id,
            bundle=str(c.bundle),
            pid=p.pid,
            status=p.state.status,
            stdin=p.stdio.stdin,
            stdout=p.stdio.stdout,
            stderr=p.stdio.stderr,
            terminal=p.stdio.terminal,
            exit_status=p.exit_status,
            exec_id=r.exec_id,
            exited_at=_exited_at(p),
        )
        return resp

    async def kill(self, r: shim_pb2.KillRequest) -> empty_pb2.Empty:
        await self._get(r.id).kill(r.exec_id, r.signal, r.all)
        return empty_pb2.Empty()

    async def wait(self, r: shim_pb2.WaitRequest) -> shim_pb2.WaitResponse:
        c = self._get(r.id)
        p = c.process(r.exec_id)
        await p.done.wait()
        return shim_pb2.WaitResponse(exit_status=p.exit_status, exited_at=_exited_at(p))

    async def pids(self, r: shim_pb2.PidsRequest) -> shim_pb2.PidsResponse:
        pids = await self._get(r.id).pids()
        return shim_pb2.PidsResponse(processes=[types_pb2.ProcessInfo(pid=p) for p in pids])

    async def pause(self, r: shim_pb2.PauseRequest) -> empty_pb2.Empty:
        await self._get(r.id).pause()
        return empty_pb2.Empty()

    async def resume(self, r: shim_pb2.ResumeRequest) -> empty_pb2.Empty:
        await self._get(r.id).resume()
        return empty_pb2.Empty()

    async def close_io(self, r: shim_pb2.CloseIORequest) -> empty_pb2.Empty:
        p = self._get(r.id).process(r.exec_id)
        if p.io is not None and r.stdin:
            p.io.close_stdin()
        return empty_pb2.Empty()

    async def resize_pty(self, r: shim_pb2.ResizePtyRequest) -> empty_pb2.Empty:
        p = self._get(r.id).process(r.exec_id)
        if p.io is None or p.io.master is None:
            raise FailedPrecondition("process has no terminal")
        p.io.resize(r.width, r.height)
        return empty_pb2.Empty()

    async def update(self, r: shim_pb2.UpdateTaskRequest) -> empty_pb2.Empty:
        if r.resources.value:
            await self._get(r.id).update(r.resources.value)
        return empty_pb2.Empty()

    async def stats(self, r: shim_pb2.StatsRequest) -> shim_pb2.StatsResponse:
        return shim_pb2.StatsResponse(stats=self._get(r.id).metrics())

    async def checkpoint(self, r: shim_pb2.CheckpointTaskRequest) -> empty_pb2.Empty:
        c = self._get(r.id)
        raise Unimplemented(
            f"checkpoint {c.id} with the node agent (snapshotctl), which packs a verified artifact"
        )

    async def connect(self, r: shim_pb2.ConnectRequest) -> shim_pb2.ConnectResponse:
        c = self.containers.get(r.id)
        return shim_pb2.ConnectResponse(
            shim_pid=os.getpid(), task_pid=c.init.pid if c else 0, version=VERSION
        )

    async def shutdown(self, r: shim_pb2.ShutdownRequest) -> empty_pb2.Empty:
        if self.containers and not r.now:
            return empty_pb2.Empty()  # still serving other containers of the pod
        if self.on_empty:
            asyncio.get_running_loop().call_later(0.05, self.on_empty)
        return empty_pb2.Empty()
