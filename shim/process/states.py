"""Process states, one class per state, as containerd's runc shim has them
(process/init_state.go). A state's methods do the work and return the next state; an
operation a state does not allow fails with FailedPrecondition (or NotFound once deleted)
instead of reaching runc.

``CreatedFromArtifact`` is the restore path: its ``start`` restores instead of starting.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from api.annotations import RestoreOutcome, RestorePolicy

from .errors import FailedPrecondition, NotFound, ProcessError
from .restore import RestoreFailed

if TYPE_CHECKING:
    from .process import InitProcess, Process

log = logging.getLogger(__name__)


class State:
    name = "unknown"
    #: containerd.v1.types.Status value reported by State RPCs
    status = 0

    def _refuse(self, op: str) -> ProcessError:
        return FailedPrecondition(f"cannot {op} a process that is {self.name}")

    async def start(self, p: Process) -> State:
        raise self._refuse("start")

    async def kill(self, p: Process, sig: int, all_: bool) -> None:
        raise self._refuse("kill")

    async def delete(self, p: Process) -> State:
        raise self._refuse("delete")

    async def pause(self, p: Process) -> State:
        raise self._refuse("pause")

    async def resume(self, p: Process) -> State:
        raise self._refuse("resume")

    def exited(self, p: Process) -> State:
        return Stopped()


class Created(State):
    name, status = "created", 1

    async def start(self, p: Process) -> State:
        await p.do_start()
        return Running()

    async def kill(self, p: Process, sig: int, all_: bool) -> None:
        await p.do_kill(sig, all_)

    async def delete(self, p: Process) -> State:
        await p.do_delete()
        return Deleted()


class CreatedFromArtifact(Created):
    """Created with a snapshot to restore: nothing runs until start, which restores the
    container. When the restore fails, the policy decides: ``fallback`` creates and starts
    it normally (a cold start), ``strict`` fails the start. Either way the report says why."""

    name = "created-from-artifact"

    async def start(self, p: InitProcess) -> State:  # type: ignore[override]
        target = p.restore_target
        assert target is not None
        try:
            await p.do_restore()
            return Running()
        except RestoreFailed as e:
            if target.policy is RestorePolicy.STRICT:
                p.drop_failed_io()
                target.report_failure(e, RestoreOutcome.FAILED)
                raise FailedPrecondition(str(e)) from e
            target.report_failure(e, RestoreOutcome.FELL_BACK)
            log.warning("%s of %s; cold-starting", e, p.container_id)
        await p.do_create()
        await p.do_start()
        return Running()

    async def kill(self, p: Process, sig: int, all_: bool) -> None:
        raise NotFound("process not started yet (it restores on start)")

    async def delete(self, p: Process) -> State:
        await p.do_delete(never_started=True)
        return Deleted()


class Running(State):
    name, status = "running", 2

    async def kill(self, p: Process, sig: int, all_: bool) -> None:
        await p.do_kill(sig, all_)

    async def pause(self, p: Process) -> State:
        await p.do_pause()
        return Paused()


class Paused(State):
    name, status = "paused", 4

    async def kill(self, p: Process, sig: int, all_: bool) -> None:
        await p.do_kill(sig, all_)

    async def resume(self, p: Process) -> State:
        await p.do_resume()
        return Running()


class Stopped(State):
    name, status = "stopped", 3

    async def kill(self, p: Process, sig: int, all_: bool) -> None:
        if all_:
            await p.do_kill(sig, all_)  # stray processes of the container may remain
            return
        raise NotFound("process already finished")

    async def delete(self, p: Process) -> State:
        await p.do_delete()
        return Deleted()

    def exited(self, p: Process) -> State:
        return self


class Deleted(State):
    name, status = "deleted", 3

    def _refuse(self, op: str) -> ProcessError:
        return NotFound(f"cannot {op}: process was deleted")

    def exited(self, p: Process) -> State:
        return self
