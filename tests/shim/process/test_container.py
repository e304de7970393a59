"""The shim's Container owns its lifecycle under its own lock (shim/process/container.py).

A Delete that comes while the init process restores (a restore can take seconds to minutes;
the kubelet may give up on StartContainer and remove the container) waits for the restore to
end; it used to run beside it, marking the container deleted and removing its state while
the restored tree went on running with no container to account for it. A Kill is not held
up. The init process here is a stand-in whose restore waits on an event (no runc: the real
one runs in the containerd tests)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from api.annotations import RestoreOutcome, RestorePolicy
from shim.process.container import Container
from shim.process.errors import FailedPrecondition, NotFound
from shim.process.io import StdioPaths
from shim.process.process import InitProcess
from shim.process.states import CreatedFromArtifact, Running


@dataclass
class Target:
    policy: RestorePolicy = RestorePolicy.FALLBACK

    def report(self, report) -> None:
        pass

    def report_failure(self, e, outcome: RestoreOutcome) -> None:
        pass


@dataclass
class RestoringInit(InitProcess):
    """Stands in for runc: its restore waits until the test lets it end."""

    gate: asyncio.Event | None = None
    restoring: asyncio.Event | None = None
    deleted: bool = False

    async def do_restore(self) -> None:
        assert self.gate is not None and self.restoring is not None
        self.restoring.set()
        await self.gate.wait()
        self.pid = 4242

    async def do_delete(self, never_started: bool = False) -> None:
        self.deleted = True


async def test_a_delete_waits_for_the_restore_of_a_start(tmp_path):
    gate, restoring = asyncio.Event(), asyncio.Event()
    init = RestoringInit(container_id="c1", exec_id="", runc=None, stdio=StdioPaths(),
                         workdir=tmp_path / "c1", bundle=tmp_path, restore_target=Target(),
                         gate=gate, restoring=restoring)  # fmt: skip
    init.state = CreatedFromArtifact()
    (tmp_path / "c1").mkdir()
    c = Container("c1", tmp_path, init, tmp_path)
    c.note_cgroups = lambda: None  # no cgroup for a stand-in
    start = asyncio.create_task(c.start(init))
    await restoring.wait()
    delete = asyncio.create_task(c.delete(""))
    await asyncio.sleep(0.1)
    assert not delete.done() and not init.deleted, "the delete ran beside the restore"
    # a kill is not held up by the restore (it is answered at once)
    with pytest.raises(NotFound):
        await asyncio.wait_for(c.kill("", 9, False), 1)
    gate.set()
    await start
    assert isinstance(init.state, Running) and init.pid == 4242
    # the container now runs: the delete is refused, as for any running container (containerd
    # kills it first), and nothing of it was removed
    with pytest.raises(FailedPrecondition):
        await delete
    assert not init.deleted and (tmp_path / "c1").is_dir()
