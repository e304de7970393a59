"""A container: its init process, its execs, its rootfs and its cgroups, and what may be done
to it. As containerd's runc shim's ``Container``, it owns its lifecycle (start, delete with
its rootfs and state, kill, pause, exec) under its own lock; the task service translates
RPCs into these calls and maps the errors they raise (errors.py) once. ``new_container``
builds one from its bundle: the spec read, the restore decided (a container whose
annotations name an artifact starts in ``CreatedFromArtifact``), the rootfs mounted, the
init process created; a failure leaves nothing mounted and no state behind. Plain values in,
no protobuf."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from api.annotations import AnnotationError
from restore_runtime import mounts

from . import oom, stats
from .errors import AlreadyExists, FailedPrecondition, InvalidArgument, MountFailed, NotFound
from .io import StdioPaths
from .process import ExecProcess, InitProcess, Process, validate_exec_spec
from .restore import RestoreTarget
from .state_dir import remove_container_state
from .states import CreatedFromArtifact, Deleted

if TYPE_CHECKING:
    from restore_runtime.node import NodeContext


@dataclass(frozen=True)
class Mount:
    """One of the rootfs mounts containerd hands the create."""

    type: str
    source: str
    options: list[str]


@dataclass
class Container:
    id: str
    bundle: Path
    init: InitProcess
    #: the shim's per-namespace state directory (the container's own is ``<it>/<id>``)
    state_root: Path
    execs: dict[str, ExecProcess] = field(default_factory=dict)
    rootfs_mounted: bool = False
    #: the container's cgroup directories, read from its init process once it runs
    cgroup_dirs: dict[str, Path] = field(default_factory=dict)
    oom_baseline: int = 0
    #: one state change at a time (a delete never runs beside the restore of a start). Kill
    #: takes no lock: it must reach a process whatever else is in flight.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def note_cgroups(self) -> None:
        if self.init.pid and not self.cgroup_dirs:
            self.cgroup_dirs = stats.cgroup_dirs(self.init.pid)
            self.oom_baseline = oom.oom_kills(stats.memory_dir(self.cgroup_dirs))

    def process(self, exec_id: str) -> Process:
        if not exec_id:
            return self.init
        p = self.execs.get(exec_id)
        if p is None:
            raise NotFound(f"exec {exec_id!r} not found in {self.id}")
        return p

    @property
    def running(self) -> bool:
        return not isinstance(self.init.state, Deleted) and not self.init.done.is_set()

    async def start(self, p: Process) -> None:
        """Start ``p`` (the init process restores here when it has an artifact)."""
        async with self.lock:
            p.state = await p.state.start(p)
        if p.pid and p is self.init:
            self.note_cgroups()  # a restored or fallen-back init has its pid only now

    async def delete(self, exec_id: str) -> Process:
        """Delete a process; for the init process, the container: its rootfs unmounted and
        its state directory removed."""
        async with self.lock:
            p = self.process(exec_id)
            p.state = await p.state.delete(p)
            if exec_id:
                del self.execs[exec_id]
                return p
            if self.rootfs_mounted:
                mounts.unmount(str(self.bundle / "rootfs"))
                self.rootfs_mounted = False
            await asyncio.to_thread(remove_container_state, self.state_root, self.id)
        return p

    async def kill(self, exec_id: str, sig: int, all_: bool) -> None:
        p = self.process(exec_id)
        await p.state.kill(p, sig, all_)

    async def pause(self) -> None:
        async with self.lock:
            self.init.state = await self.init.state.pause(self.init)

    async def resume(self) -> None:
        async with self.lock:
            self.init.state = await self.init.state.resume(self.init)

    async def exec(self, exec_id: str, stdio: StdioPaths, spec: bytes) -> ExecProcess:
        """Add an exec process (started by ``start``)."""
        if not exec_id:
            raise InvalidArgument("exec id is empty")
        async with self.lock:
            if exec_id in self.execs:
                raise AlreadyExists(f"exec {exec_id!r} already exists")
            if not self.running:
                raise FailedPrecondition(f"container {self.id} is not running")
            validate_exec_spec(spec)
            e = ExecProcess(
                container_id=self.id,
                exec_id=exec_id,
                runc=self.init.runc,
                workdir=self.init.workdir,
                stdio=stdio,
                spec=spec,
            )
            self.execs[exec_id] = e
        return e

    async def pids(self) -> list[int]:
        return await self.init.runc.ps(self.id) if self.init.pid else []

    async def update(self, resources: bytes) -> None:
        """New resources (OCI LinuxResources as JSON, which containerd sends and ``runc
        update`` takes as they are)."""
        if not self.running or not self.init.pid:
            raise FailedPrecondition(f"container {self.id} is not running")
        try:
            json.loads(resources)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InvalidArgument(f"resources are not OCI JSON: {e}") from e
        path = self.init.workdir / "update-resources.json"
        path.write_bytes(resources)
        await self.init.do_update(path)

    def metrics(self):
        self.note_cgroups()
        if not self.cgroup_dirs:
            raise NotFound(f"container {self.id} has no cgroup (not running)")
        return stats.metrics(self.cgroup_dirs)


async def new_container(
    id_: str,
    bundle: Path,
    rootfs_mounts: list[Mount],
    stdio: StdioPaths,
    node: NodeContext,
    state_root: Path,
) -> Container:
    assert node.runc is not None
    try:
        spec = json.loads((bundle / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InvalidArgument(f"bad bundle {bundle}: {e}") from e
    try:
        target = RestoreTarget.from_spec(spec)
    except AnnotationError as e:
        raise InvalidArgument(str(e)) from e
    rootfs = bundle / "rootfs"
    mounted = False
    if rootfs_mounts:
        rootfs.mkdir(exist_ok=True)
        for m in rootfs_mounts:
            try:
                mounts.mount(m.type, m.source, str(rootfs), m.options)
            except OSError as e:
                raise MountFailed(str(e)) from e
        mounted = True
    (state_root / id_).mkdir(parents=True, exist_ok=True)
    init = InitProcess(
        container_id=id_,
        exec_id="",
        runc=node.runc,
        workdir=state_root / id_,
        bundle=bundle,
        stdio=stdio,
        restore_target=target,
        node=node if target is not None else None,
    )
    try:
        if target is not None:
            init.state = CreatedFromArtifact()
        else:
            await init.do_create()
    except BaseException:
        if mounted:
            mounts.unmount(str(rootfs))
        remove_container_state(state_root, id_)
        raise
    return Container(id_, bundle, init, state_root, rootfs_mounted=mounted)
