"""Pure builders for CRIU command lines. No I/O here, so every flag is unit-testable."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

#: Mounts the workload inherited from the host are external to the dump: CRIU records them
#: by path and binds them back at restore instead of trying to recreate them.
_MOUNT_FLAGS = ["--ext-mount-map", "auto", "--enable-external-sharing", "--enable-external-masters"]
EXTERNAL_NETNS_KEY = "extnet"


@dataclass(frozen=True)
class DumpOptions:
    pid: int
    images_dir: Path
    work_dir: Path
    leave_running: bool = False
    #: inode of the workload's network namespace when it is not CRIU's own: the namespace
    #: stays outside the image, and a restore plugs the process into another one
    external_netns_inode: int | None = None
    tcp_established: bool = True
    verbosity: int = 4
    extra: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RestoreOptions:
    images_dir: Path
    work_dir: Path
    pidfile: Path
    #: file descriptor (in the CRIU process) open on the target network namespace
    netns_fd: int | None = None
    leave_stopped: bool = False
    verbosity: int = 4
    extra: list[str] = field(default_factory=list)


def dump_args(o: DumpOptions) -> list[str]:
    args = [
        "dump",
        "--tree",
        str(o.pid),
        "--images-dir",
        str(o.images_dir),
        "--work-dir",
        str(o.work_dir),
        "--log-file",
        "dump.log",
        f"-v{o.verbosity}",
        "--file-locks",
        *_MOUNT_FLAGS,
    ]
    if o.leave_running:
        args.append("--leave-running")
    if o.tcp_established:
        # Established connections are dumped so the dump never fails on them; the restore
        # closes them (--tcp-close): clients reconnect to the new replica. Connections still
        # in a listener's accept queue (a kubelet tcpSocket probe mid-handshake) would fail
        # the dump outright: they are left out, and their clients see a reset.
        args += ["--tcp-established", "--skip-in-flight"]
    if o.external_netns_inode is not None:
        args += ["--external", f"net[{o.external_netns_inode}]:{EXTERNAL_NETNS_KEY}"]
    return args + list(o.extra)


def restore_args(o: RestoreOptions) -> list[str]:
    args = [
        "restore",
        "--images-dir",
        str(o.images_dir),
        "--work-dir",
        str(o.work_dir),
        "--log-file",
        "restore.log",
        f"-v{o.verbosity}",
        "--restore-detached",
        "--pidfile",
        str(o.pidfile),
        "--root",
        "/",
        "--file-locks",
        "--tcp-close",
        *_MOUNT_FLAGS,
    ]
    if o.leave_stopped:
        args.append("--leave-stopped")
    if o.netns_fd is not None:
        args += ["--inherit-fd", f"fd[{o.netns_fd}]:{EXTERNAL_NETNS_KEY}"]
    return args + list(o.extra)
