"""A container: its init process, its execs, its rootfs and its cgroups. ``new_container``
builds one from its bundle, as containerd's runc shim's NewContainer does: the spec read, the
restore decided (a container whose annotations name an artifact starts in
``CreatedFromArtifact``), the rootfs mounted, the init process created; a failure leaves
nothing mounted and no state behind. Plain values in, no protobuf: task/ translates."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from api.annotations import AnnotationError
from api.node import NodeConfig
from restore_runtime import mounts
from restore_runtime.runc import Runc

from ..ttrpc.codes import Code, RPCError
from . import oom, stats
from .io import StdioPaths
from .process import ExecProcess, InitProcess, Process
from .restore import RestoreTarget
from .state_dir import remove_container_state
from .states import CreatedFromArtifact


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
    execs: dict[str, ExecProcess] = field(default_factory=dict)
    rootfs_mounted: bool = False
    #: the container's cgroup directories, read from its init process once it runs
    cgroup_dirs: dict[str, Path] = field(default_factory=dict)
    oom_baseline: int = 0

    def note_cgroups(self) -> None:
        if self.init.pid and not self.cgroup_dirs:
            self.cgroup_dirs = stats.cgroup_dirs(self.init.pid)
            self.oom_baseline = oom.oom_kills(stats.memory_dir(self.cgroup_dirs))

    def process(self, exec_id: str) -> Process:
        if not exec_id:
            return self.init
        p = self.execs.get(exec_id)
        if p is None:
            raise RPCError(Code.NOT_FOUND, f"exec {exec_id!r} not found in {self.id}")
        return p


async def new_container(id_: str, bundle: Path, rootfs_mounts: list[Mount], stdio: StdioPaths,
                        runc: Runc, workdir: Path, node: NodeConfig) -> Container:  # fmt: skip
    try:
        spec = json.loads((bundle / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise RPCError(Code.INVALID_ARGUMENT, f"bad bundle {bundle}: {e}") from e
    try:
        target = RestoreTarget.from_spec(spec)
    except AnnotationError as e:
        raise RPCError(Code.INVALID_ARGUMENT, str(e)) from e
    rootfs = bundle / "rootfs"
    mounted = False
    if rootfs_mounts:
        rootfs.mkdir(exist_ok=True)
        for m in rootfs_mounts:
            try:
                mounts.mount(m.type, m.source, str(rootfs), m.options)
            except OSError as e:
                raise RPCError(Code.INTERNAL, str(e)) from e
        mounted = True
    (workdir / id_).mkdir(parents=True, exist_ok=True)
    init = InitProcess(container_id=id_, exec_id="", runc=runc, workdir=workdir / id_,
                       bundle=bundle, stdio=stdio)  # fmt: skip
    try:
        if target is not None:
            init.restore_target, init.node = target, node
            init.state = CreatedFromArtifact()
        else:
            await init.do_create()
    except BaseException:
        if mounted:
            mounts.unmount(str(rootfs))
        remove_container_state(workdir, id_)
        raise
    return Container(id_, bundle, init, rootfs_mounted=mounted)
