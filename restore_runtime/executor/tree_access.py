"""How the process tree is dumped and restored: straight through CRIU (plain processes,
``snapshotctl``) or through runc (containers, whose runtime state runc owns). These are the
executors' ports: a ``Dumper`` for the checkpoint, a ``TreeRestorer`` for the restore; the
caller picks one, and everything else about a checkpoint or restore is the engine's, the
same for both."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from api.manifest import ROOTFS_DIFF_NAME

from .. import procs
from ..artifact.rootfs_pack import DEFAULT_MAX_BYTES, pack_upper
from ..criu import options, runner
from ..errors import SnapshotError
from ..runc import Runc, RuncError, Stdio

log = logging.getLogger(__name__)
T = TypeVar("T")
#: how long a source's processes may take to go once killed after its checkpoint
END_TIMEOUT_S = 30.0


class Dumper(Protocol):
    def dump(
        self,
        pid: int,
        images: Path,
        work: Path,
        leave_running: bool,
        external_netns_inode: int | None,
    ) -> None: ...

    def pack_extra(self, staging: Path) -> None: ...

    def end(self, pid: int) -> None:
        """End the source once its artifact is committed (the dump always leaves it running,
        so that a failure anywhere before the commit can give it back)."""


# -- plain processes -------------------------------------------------------------------------
class CriuDumper:
    def dump(self, pid, images, work, leave_running, external_netns_inode) -> None:
        o = options.DumpOptions(
            pid=pid,
            images_dir=images,
            work_dir=work,
            leave_running=leave_running,
            external_netns_inode=external_netns_inode,
        )
        runner.run(options.dump_args(o), work / "dump.log")

    def pack_extra(self, staging: Path) -> None:
        return None

    def end(self, pid: int) -> None:
        procs.kill_tree(pid, END_TIMEOUT_S)


def run_sync(call: Coroutine[Any, Any, T]) -> T:
    """The result of ``call`` from synchronous code, whether or not this thread runs an
    event loop: asyncio.run refuses inside a running loop (an agent's recovery at start
    crash-looped on that), so there the call gets a thread and a loop of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(call)
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = asyncio.run(call)
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e

    t = threading.Thread(target=run, name="run-sync")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


class TreeRestorer(Protocol):
    """Restores the tree, left stopped, for the engine, which verifies and stages before
    and fills, verifies, restores CUDA and wakes after, the same way whichever restores."""

    def criu_version(self) -> str: ...

    def restore(self, images: Path, work: Path, netns: str | None) -> int:
        """The tree restored from ``images`` (into ``netns`` when it had a network namespace
        of its own), left stopped; returns its root's host PID."""
        ...

    def discard(self) -> None:
        """After a failure, once the engine has killed the tree: remove what ``restore``
        made besides it."""


class CriuRestorer:
    """``criu restore`` of a plain process tree (snapshotctl)."""

    def criu_version(self) -> str:
        return runner.criu_version()

    def restore(self, images: Path, work: Path, netns: str | None) -> int:
        return criu_restore(images, work, netns)

    def discard(self) -> None:
        return None


#: What runc passes to CRIU (the bundle's ``org.criu.config``): established connections
#: cannot follow the pod to its new address, clients reconnect; the tree stays stopped until
#: the engine has verified every page image.
RUNC_CRIU_CONFIG = "tcp-close\nleave-stopped\n"


@dataclass
class RuncRestorer:
    """``runc restore`` of a container from its bundle, onto the container's stdio: runc
    joins the namespaces and cgroups the bundle's spec names (``netns`` among them). Its
    calls run on ``loop`` when given (the shim's, whose reaper owns every child's exit),
    else on a loop of their own."""

    runc: Runc
    container_id: str
    bundle: Path
    pidfile: Path
    stdio: Stdio
    loop: asyncio.AbstractEventLoop | None = None

    def _run(self, call: Coroutine[Any, Any, T]) -> T:
        if self.loop is None:
            return run_sync(call)
        return asyncio.run_coroutine_threadsafe(call, self.loop).result()

    def criu_version(self) -> str:
        return self._run(self.runc.criu_version())  # read once per runc, ahead, by the shim

    def restore(self, images: Path, work: Path, netns: str | None) -> int:
        self._run(
            self.runc.restore(
                self.container_id,
                self.bundle,
                images,
                work,
                self.pidfile,
                self.stdio,
                criu_config=RUNC_CRIU_CONFIG,
            )
        )
        return int(self.pidfile.read_text().strip())

    def discard(self) -> None:
        with contextlib.suppress(RuncError):  # nothing may have been created
            self._run(self.runc.delete(self.container_id, force=True))


def criu_restore(image_dir: Path, work: Path, netns_path: str | None) -> int:
    """``criu restore`` of a plain process tree, left stopped; returns the root's host PID."""
    pidfile = work / "restore.pid"
    netns_fd = os.open(netns_path, os.O_RDONLY) if netns_path else None
    try:
        o = options.RestoreOptions(
            images_dir=image_dir,
            work_dir=work,
            pidfile=pidfile,
            netns_fd=netns_fd,
            leave_stopped=True,
        )
        fds = (netns_fd,) if netns_fd is not None else ()
        runner.run(options.restore_args(o), work / "restore.log", pass_fds=fds)
    finally:
        if netns_fd is not None:
            os.close(netns_fd)
    return int(pidfile.read_text().strip())


# -- containers ------------------------------------------------------------------------------
@dataclass
class RuncContainer:
    """A container as runc knows it (``runc --root ROOT state ID``)."""

    root: Path
    id: str
    binary: str = "runc"

    @property
    def runc(self) -> Runc:
        return Runc(self.root, self.binary)

    def _call(self, what: str, call):
        try:
            return run_sync(call)
        except RuncError as e:
            raise SnapshotError(f"runc {what} {self.id}: {e.message}") from e

    def state(self) -> dict:
        return self._call("state", self.runc.state(self.id))

    def resume(self) -> None:
        self._call("resume", self.runc.resume(self.id))

    def kill(self) -> None:
        self._call("kill", self.runc.kill(self.id, signal.SIGKILL, all_=True))

    def init_pid(self) -> int:
        st = self.state()
        if st.get("status") != "running":
            raise SnapshotError(f"container {self.id} is {st.get('status')}, not running")
        return int(st["pid"])


def overlay_upperdir(rootfs: str) -> str | None:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        fields = pre.split()
        if len(fields) > 4 and fields[4] == rootfs and post.startswith("overlay "):
            for opt in post.split()[-1].split(","):
                if opt.startswith("upperdir="):
                    return opt.removeprefix("upperdir=")
    return None


class RuncDumper:
    """``runc checkpoint``: runc records the container's external mounts, namespaces and
    stdio (descriptors.json) beside CRIU's images, which its restore needs."""

    def __init__(self, container: RuncContainer, max_rootfs_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.container = container
        self.max_rootfs_bytes = max_rootfs_bytes
        self.upperdir: str | None = None

    def dump(self, pid, images, work, leave_running, external_netns_inode) -> None:
        # read before the dump: without --leave-running, runc forgets the container
        self.upperdir = overlay_upperdir(self.container.state().get("rootfs", ""))
        c = self.container
        run_sync(c.runc.checkpoint(c.id, images, work, leave_running))

    def pack_extra(self, staging: Path) -> None:
        upper = self.upperdir
        if upper is None:
            log.warning(
                "no overlay upper dir for %s: rootfs changes are not captured", self.container.id
            )
            return
        # the tenant's tree, maybe still running: walked by descriptors, never by name
        pack_upper(upper, staging / ROOTFS_DIFF_NAME, self.max_rootfs_bytes)

    def end(self, pid: int) -> None:
        # runc kills the container's processes; its shim sees the exit, as after a dump
        # without --leave-running
        self.container.kill()
