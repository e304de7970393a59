"""containerd shim v2 bootstrap: ``start`` (find or launch the pod's shim, print its
address), ``delete`` (clean up after a dead shim), serve mode, and ``-v``.

containerd runs ``containerd-shim-snapshot-v2 -namespace NS -address ADDR -publish-binary BIN
-id ID [-debug] start|delete`` with the bundle as working directory and TTRPC_ADDRESS in the
environment. Containers of one pod share one shim process, keyed on the CRI sandbox id, as
the runc shim does.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import hashlib
import io
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from api.node import NodeConfig, NodeSettingError

from . import VERSION

if TYPE_CHECKING:
    import asyncio

    from .task.service import TaskService

# Heavy imports (asyncio, protobuf, the engine) happen in serve()/delete only: ``start`` runs
# for every container (StartContainer waits for it) and must return fast; asyncio alone is
# 50 ms of an 80 ms start.

log = logging.getLogger("shim")
SANDBOX_ID = "io.kubernetes.cri.sandbox-id"


def parse_args(argv: list[str]) -> argparse.Namespace:
    # containerd passes Go-style single-dash flags.
    p = argparse.ArgumentParser(prog="containerd-shim-snapshot-v2", allow_abbrev=False)
    p.add_argument("-namespace", default=os.environ.get("NAMESPACE", "default"))
    p.add_argument("-id", default="")
    p.add_argument("-address", default="")
    p.add_argument("-publish-binary", dest="publish_binary", default="")
    p.add_argument("-bundle", default="")
    p.add_argument("-socket", default="")
    p.add_argument("-debug", action="store_true")
    p.add_argument("-v", dest="version", action="store_true")
    p.add_argument(
        "-info",
        dest="info",
        action="store_true",
        help="print the runtime's info (features) as protobuf and exit",
    )
    p.add_argument("action", nargs="?", default="serve")
    return p.parse_args(argv)


def grouping_id(bundle: Path, id_: str) -> str:
    try:
        spec = json.loads((bundle / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return id_
    return (spec.get("annotations") or {}).get(SANDBOX_ID) or id_


def socket_path(state_dir: Path, address: str, namespace: str, group: str) -> Path:
    digest = hashlib.sha256(os.path.join(address, namespace, group).encode()).hexdigest()
    return state_dir / "s" / digest


def _connectable(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


def cmd_start(args: argparse.Namespace, node: NodeConfig) -> int:
    bundle = Path.cwd()
    path = socket_path(node.state_dir, args.address, args.namespace, grouping_id(bundle, args.id))
    address = f"unix://{path}"
    if path.exists() and _connectable(path):
        (bundle / "address").write_text(address)
        print(address, end="")
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    os.chmod(path, 0o600)
    listener.listen(128)
    args.socket = str(path)
    # The server is this process, forked: a second interpreter started from nothing (as
    # the runc shim re-executes itself) cost its start-up and these imports again on the
    # path of every restore. Nothing here has started a thread, so the fork is safe.
    child = os.fork()
    if child == 0:
        _serve_forked(args, node, listener)
    (bundle / "shim.pid").write_text(str(child))
    (bundle / "address").write_text(address)
    print(address, end="")
    return 0


def _name_process(name: bytes) -> None:
    """The name ``ps -o comm`` and ``top`` show (its command line stays ``start``'s)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(15, name, 0, 0, 0)  # PR_SET_NAME


def _serve_forked(args: argparse.Namespace, node: NodeConfig, listener: socket.socket) -> NoReturn:
    """The forked server: a session of its own, and none of ``start``'s descriptors but the
    listener (containerd reads ``start``'s stdout until every writer has closed it)."""
    code = 1
    try:
        os.setsid()
        _name_process(b"snapshot-shim")
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        keep = listener.fileno()
        os.closerange(3, keep)
        os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
        import asyncio

        asyncio.run(serve(args, node, listener))
        code = 0
    finally:
        os._exit(code)


def cmd_delete(args: argparse.Namespace, node: NodeConfig) -> int:
    """Called by containerd when the shim is gone: force-delete the container, unmount its
    rootfs, and report it killed."""
    from .process.state_dir import remove_container_state
    from .proto import shim_pb2
    from .task.events import timestamp

    bundle = Path(args.bundle) if args.bundle else Path.cwd()
    root = node.runc_root / args.namespace
    # a runc restore the dead shim started can never finish without it (seen: runc and CRIU
    # waiting on each other for good, the restored tree stuck in CRIU's restorer): end it,
    # its CRIU and what CRIU restored so far, before the container is deleted
    _end_restores_of(args.id)
    subprocess.run(
        ["runc", "--root", str(root), "delete", "--force", args.id],
        capture_output=True,
        check=False,
    )
    _remove_runc_state(root, args.id)
    subprocess.run(["umount", "-l", str(bundle / "rootfs")], capture_output=True, check=False)
    # a restore the dead shim was running leaves its work directory and images view there
    remove_container_state(node.state_dir / "snapshot-shim" / args.namespace, args.id)
    resp = shim_pb2.DeleteResponse(exit_status=128 + signal.SIGKILL)
    resp.exited_at.CopyFrom(timestamp(time.time()))
    sys.stdout.buffer.write(resp.SerializeToString())
    return 0


#: containerd's identifier rule: a container ID is never a path of its own
_ID = re.compile(r"[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*")


def _remove_runc_state(root: Path, container_id: str) -> None:
    """A ``runc restore`` killed before it wrote its state.json leaves the container's
    directory under the runc root, which ``runc delete --force`` then calls "does not exist"
    and leaves for good, with the container's rootfs still mounted at its ``criu-root``
    (runc >= 1.2): each mount under it detached, then removed (its restore, and every process
    of it, is gone)."""
    from restore_runtime.mounts import remove_tree

    if not _ID.fullmatch(container_id) or len(container_id) > 76:
        return
    state = root / container_id
    if state.is_dir() and not state.is_symlink():
        remove_tree(state)
        log.info("removed the runc state %s left by a killed restore", state)


def _end_restores_of(container_id: str) -> None:
    from restore_runtime import procs

    ended: list[int] = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"restore" in argv and container_id.encode() in argv and b"--image-path" in argv:
            for pid in procs.tree(int(d.name)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                ended.append(pid)
    # dead, not yet reaped: nothing of theirs (mounts, open files) holds the delete up
    deadline = time.monotonic() + 10.0
    while any(procs.running(p) for p in ended) and time.monotonic() < deadline:
        time.sleep(0.02)


def _setup_logging(logfile: Path, debug: bool) -> None:
    handlers: list[logging.Handler] = [logging.FileHandler(logfile)]
    # a crash (fatal signal, deadlock dump) lands in the same file
    faulthandler.enable(open(logfile, "a"))  # noqa: SIM115 - lives as long as the process
    with contextlib.suppress(OSError):
        # containerd reads the "log" FIFO in the bundle into its own log.
        fd = os.open("log", os.O_WRONLY | os.O_NONBLOCK)  # in the bundle, our cwd
        os.set_blocking(fd, True)
        handlers.append(logging.StreamHandler(os.fdopen(fd, "w", buffering=1)))
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO,
        handlers=handlers,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def dump_stacks() -> None:
    """SIGUSR1: where every thread and every asyncio task waits, into the shim log (as
    containerd's shims dump their goroutines). `kill -USR1 <shim pid>` on a stuck pod."""
    import asyncio

    buf = io.StringIO()
    for task in asyncio.all_tasks():
        buf.write(f"--- task {task.get_name()}: {task.get_coro()!r}\n")
        task.print_stack(file=buf)
    log.warning("SIGUSR1: asyncio tasks\n%s", buf.getvalue())
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) and handler.stream:
            faulthandler.dump_traceback(file=handler.stream, all_threads=True)
            handler.stream.flush()


async def serve(
    args: argparse.Namespace, node: NodeConfig, sock: socket.socket | None = None
) -> None:
    import asyncio

    from restore_runtime.node import NodeContext
    from restore_runtime.runc import Runc

    from .reaper import Reaper, become_subreaper
    from .task.events import Publisher
    from .task.service import SERVICE, TaskService
    from .ttrpc.server import serve_unix

    workdir = node.state_dir / "snapshot-shim" / args.namespace
    workdir.mkdir(parents=True, exist_ok=True)
    # kept beside the runc logs, outside the bundle that containerd removes on delete
    _setup_logging(workdir / f"shim-{args.id}.log", args.debug)
    become_subreaper()
    reaper = Reaper()
    reaper.start()
    ttrpc_address = os.environ.get("TTRPC_ADDRESS") or f"{args.address}.ttrpc"
    publisher = Publisher(ttrpc_address, args.namespace)
    publisher.start()
    runc = Runc(
        root=node.runc_root / args.namespace,
        binary=node.runtime_binary,
        log_dir=workdir,
        runner=reaper,
    )
    stop = asyncio.Event()
    # the node, built once (its settings parsed as the shim started): every container and
    # every restore this shim serves uses it
    service = TaskService(NodeContext.of(node, runc), reaper, publisher, workdir, on_empty=stop.set)
    if sock is None:  # started as ``serve`` by hand: the listener is descriptor 3
        sock = socket.socket(fileno=3)
    server = await serve_unix(service.handlers(), sock=sock)
    log.info(
        "%s serving %s for %s/%s on %s", VERSION, SERVICE, args.namespace, args.id, args.socket
    )
    warming = _warm_up(service)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, dump_stacks)
    await stop.wait()
    if warming is not None:
        warming.cancel()
    server.close()
    await publisher.flush()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(args.socket)
    log.info("shim exiting")
    # Threads copying stdio may sit in blocking reads of FIFOs nobody will close, and
    # asyncio.run would wait for them: the containers are gone, so end here.
    logging.shutdown()
    if not args.debug:  # containerd has every line through the log FIFO; debug keeps a copy
        (workdir / f"shim-{args.id}.log").unlink(missing_ok=True)
    os._exit(0)


def _warm_up(service: TaskService) -> asyncio.Task | None:
    """The engine loaded in the background when this shim was started for a pod's sandbox
    or a restoring container (its bundle is our working directory)."""
    import asyncio

    from .process.restore import wants_warm_up, warm_up

    try:
        spec = json.loads(Path("config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not wants_warm_up(spec):
        return None
    return asyncio.get_running_loop().create_task(warm_up(service.node))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.version:
        print(f"containerd-shim-snapshot-v2 {VERSION}\n  runtime: io.containerd.snapshot.v2")
        return 0
    if args.info:
        from .info import runtime_info

        sys.stdin.buffer.read()  # the runtime options: nothing in them changes the answer
        sys.stdout.buffer.write(runtime_info(VERSION))
        return 0
    # pydantic looks for plugins in every installed distribution's metadata when the
    # engine's models load (10 ms of a restore's path): the shim uses none (set before
    # ``start`` forks its server, which inherits it)
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    # A containerd run by systemd (Type=notify, as its own unit file says) has NOTIFY_SOCKET
    # set, and its shims inherit it. runc takes it as "proxy sd_notify for this container":
    # it binds a socket under its state directory, whose path is too long for a socket with
    # a CRI id in it, and every sandbox failed to start ("notify.sock: bind: invalid
    # argument"). containerd's runc shim drops it from runc's environment the same way.
    os.environ.pop("NOTIFY_SOCKET", None)
    try:
        node = NodeConfig.from_env()
    except NodeSettingError as e:  # containerd shows the shim's stderr: one line, no traceback
        print(f"containerd-shim-snapshot-v2: {e}", file=sys.stderr)
        return 1
    if args.action == "start":
        return cmd_start(args, node)
    if args.action == "delete":
        return cmd_delete(args, node)
    if args.action == "serve":
        import asyncio

        asyncio.run(serve(args, node))
        return 0
    print(f"unknown action {args.action!r}", file=sys.stderr)
    return 2
