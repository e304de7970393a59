"""How the process tree is dumped and restored: straight through CRIU (plain processes,
``snapshotctl run``) or through runc (containers, whose runtime state runc owns). The
executors call these; everything else about a checkpoint or restore is the same."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..contracts.manifest import ROOTFS_DIFF_NAME, Manifest
from ..criu import options, runner
from ..errors import CriuError, SnapshotError

log = logging.getLogger(__name__)
CRIU_CONFIG_ANNOTATION = "org.criu.config"


class Dumper(Protocol):
    def dump(self, pid: int, images: Path, work: Path, leave_running: bool,
             external_netns_inode: int | None) -> None: ...  # fmt: skip

    def pack_extra(self, staging: Path) -> None: ...


class Restorer(Protocol):
    def prepare(self, artifact: Path, manifest: Manifest) -> None: ...

    def restore(self, image_dir: Path, work: Path, netns_path: str | None) -> int:
        """Restore with the tree left stopped; return the root's host PID."""
        ...


# -- plain processes -------------------------------------------------------------------------
class CriuDumper:
    def dump(self, pid, images, work, leave_running, external_netns_inode) -> None:
        o = options.DumpOptions(pid=pid, images_dir=images, work_dir=work,
                                leave_running=leave_running,
                                external_netns_inode=external_netns_inode)  # fmt: skip
        runner.run(options.dump_args(o), work / "dump.log")

    def pack_extra(self, staging: Path) -> None:
        return None


class CriuRestorer:
    def prepare(self, artifact: Path, manifest: Manifest) -> None:
        return None

    def restore(self, image_dir: Path, work: Path, netns_path: str | None) -> int:
        pidfile = work / "restore.pid"
        netns_fd = os.open(netns_path, os.O_RDONLY) if netns_path else None
        try:
            o = options.RestoreOptions(images_dir=image_dir, work_dir=work, pidfile=pidfile,
                                       netns_fd=netns_fd, leave_stopped=True)  # fmt: skip
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

    def cmd(self, *args: str) -> list[str]:
        criu = os.environ.get(runner.CRIU_ENV)
        return [self.binary, "--root", str(self.root), *(["--criu", criu] if criu else []), *args]

    def state(self) -> dict:
        p = subprocess.run(self.cmd("state", self.id), capture_output=True, text=True)
        if p.returncode != 0:
            raise SnapshotError(f"runc state {self.id}: {p.stderr.strip() or p.returncode}")
        return json.loads(p.stdout)

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

    def __init__(self, container: RuncContainer) -> None:
        self.container = container
        self.upperdir: str | None = None

    def dump(self, pid, images, work, leave_running, external_netns_inode) -> None:
        # read before the dump: without --leave-running, runc forgets the container
        self.upperdir = overlay_upperdir(self.container.state().get("rootfs", ""))
        args = ["checkpoint", "--image-path", str(images), "--work-path", str(work),
                "--tcp-established", "--file-locks"]  # fmt: skip
        if leave_running:
            args.append("--leave-running")
        p = subprocess.run(self.container.cmd(*args, self.container.id),
                           capture_output=True, text=True)  # fmt: skip
        if p.returncode != 0:
            raise _criu_failure("dump (runc checkpoint)", p, work / "dump.log")

    def pack_extra(self, staging: Path) -> None:
        upper = self.upperdir
        if upper is None:
            log.warning("no overlay upper dir for %s: rootfs changes are not captured",
                        self.container.id)  # fmt: skip
            return
        with tarfile.open(staging / ROOTFS_DIFF_NAME, "w") as t:
            for entry in sorted(os.listdir(upper)):
                t.add(os.path.join(upper, entry), entry, filter=_skip_whiteouts)


def _skip_whiteouts(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    # overlayfs records deletions as 0:0 character devices; a restore cannot replay them
    # through the new container's mount, so deletions are not carried over.
    return None if info.ischr() and info.devmajor == 0 and info.devminor == 0 else info


def _criu_failure(action: str, p: subprocess.CompletedProcess, log_path: Path) -> CriuError:
    try:
        text = log_path.read_text(errors="replace")
    except FileNotFoundError:
        text = ""
    lines = runner.error_lines(text) or [ln for ln in p.stderr.splitlines() if ln.strip()][-10:]
    return CriuError(action, p.returncode, lines, str(log_path))


def apply_rootfs_diff(artifact: Path, rootfs: Path) -> bool:
    """Unpack the source container's writable-layer changes into the new rootfs."""
    diff = artifact / ROOTFS_DIFF_NAME
    if not diff.exists():
        return False
    with tarfile.open(diff) as t:
        t.extractall(rootfs, filter="tar")
    return True
