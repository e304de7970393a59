"""The only module that runs ``runc``, for the shim and the engine alike. Every call is async
and fails with RuncError carrying runc's own message (its --log file, JSON lines, or stderr).

How a command runs is the caller's: the shim passes its reaper (it owns ``waitpid(-1)``, so
nothing else may wait on a child), ``snapshotctl`` and the agent use plain asyncio
subprocesses (the default). Either way CRIU is the one binary ``criu.runner.criu_binary``
names, so the version check and runc's checkpoint/restore use the same CRIU."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from .criu import runner as criu_runner
from .errors import CriuError

log = logging.getLogger(__name__)
CRIU_CONFIG_ANNOTATION = "org.criu.config"


def systemd_cgroup(spec: dict) -> bool:
    """Whether a container's cgroup is the systemd driver's: containerd's CRI writes
    ``linux.cgroupsPath`` as ``slice:prefix:name`` when the kubelet's cgroup parent is a
    systemd slice, and as a path otherwise, whatever the runtime's options say. containerd
    hands a runtime of ours no runc options (``SystemdCgroup``), so the form is what tells,
    as it tells runc itself (``--systemd-cgroup`` refuses any other)."""
    path = (spec.get("linux") or {}).get("cgroupsPath") or ""
    parts = path.split(":")
    return len(parts) == 3 and not path.startswith("/") and not any("/" in p for p in parts)


def _bundle_spec(bundle: Path) -> dict:
    return json.loads((bundle / "config.json").read_text())


class RuncError(Exception):
    def __init__(self, args: list[str], returncode: int, message: str) -> None:
        self.returncode = returncode
        self.message = message
        super().__init__(f"runc {' '.join(args[:2])} failed ({returncode}): {message}")

    def as_criu_error(self, action: str, log_path: Path) -> CriuError:
        """A failed checkpoint/restore as CRIU tells it (its log), with runc's message where
        CRIU logged nothing."""
        return criu_runner.failure(action, self.returncode, log_path, [self.message])


class CommandRunner(Protocol):
    async def run(
        self, cmd: list[str], stdin=None, stdout=None, stderr=None, env=None
    ) -> tuple[int, bytes, bytes]:
        """Run ``cmd``; return (exit code, stdout, stderr) for the streams not given."""
        ...


class SubprocessRunner:
    """asyncio's own child handling: for processes that are not a shim (no reaper)."""

    async def run(
        self, cmd: list[str], stdin=None, stdout=None, stderr=None, env=None
    ) -> tuple[int, bytes, bytes]:
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            stdin=stdin if stdin is not None else subprocess.DEVNULL,
            stdout=stdout if stdout is not None else subprocess.PIPE,
            stderr=stderr if stderr is not None else subprocess.PIPE,
            env=env,
        )
        out, err = await proc.communicate()
        return proc.returncode or 0, out or b"", err or b""


@dataclass
class Stdio:
    """File descriptors runc hands to the container's process (inherited by runc)."""

    stdin: int | None = None
    stdout: int | None = None
    stderr: int | None = None


@dataclass
class Runc:
    root: Path
    binary: str = "runc"
    log_dir: Path | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    runner: CommandRunner = field(default_factory=SubprocessRunner)
    _criu_version: asyncio.Future[str] | None = field(default=None, init=False, repr=False)
    _skips_in_flight: bool | None = field(default=None, init=False, repr=False)
    #: the containers under the systemd cgroup driver: runc gets ``--systemd-cgroup`` on
    #: every call for them, as containerd's runc shim passes it with ``SystemdCgroup``
    _systemd: set[str] = field(default_factory=set, init=False, repr=False)

    def _base(self, id_: str) -> list[str]:
        args = [self.binary, "--root", str(self.root)]
        if id_ in self._systemd:
            args.append("--systemd-cgroup")
        if self.log_dir is not None:
            args += ["--log", str(self.log_dir / f"runc-{id_}.log"), "--log-format", "json"]
        return args

    async def run(
        self, id_: str, args: list[str], stdio: Stdio | None = None, capture: bool = True
    ) -> str:
        stdio = stdio or Stdio()
        cmd = [*self._base(id_), *args]
        log.debug("exec %s", cmd)
        # Without capture, runc's stdio become the container's: a pipe of ours there would
        # never see EOF while the container lives, so it gets /dev/null instead (runc's own
        # errors still reach its --log file).
        quiet = None if capture else subprocess.DEVNULL
        code, out, err = await self.runner.run(
            cmd,
            stdin=stdio.stdin,
            stdout=stdio.stdout if stdio.stdout is not None else quiet,
            stderr=stdio.stderr if stdio.stderr is not None else quiet,
            env={**os.environ, **self.extra_env},
        )
        if code != 0:
            raise RuncError(args, code, self._message(id_, err))
        return out.decode()

    def _message(self, id_: str, stderr: bytes | None) -> str:
        lines: list[str] = []
        if self.log_dir is not None:
            try:
                for line in (self.log_dir / f"runc-{id_}.log").read_text().splitlines()[-20:]:
                    try:
                        entry = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    if entry.get("level") in ("error", "fatal"):
                        lines.append(entry.get("msg", ""))
            except FileNotFoundError:
                pass
        text = (stderr or b"").decode(errors="replace").strip()
        return "; ".join(lines[-3:]) or text or "(no message)"

    # -- lifecycle -------------------------------------------------------------------------
    async def create(
        self, id_: str, bundle: Path, pidfile: Path, stdio: Stdio, console_socket: str | None
    ) -> None:
        self._follow_cgroup_driver(id_, _bundle_spec(bundle))
        args = ["create", "--bundle", str(bundle), "--pid-file", str(pidfile)]
        if console_socket:
            args += ["--console-socket", console_socket]
        await self.run(id_, [*args, id_], stdio, capture=False)

    async def start(self, id_: str) -> None:
        await self.run(id_, ["start", id_])

    async def exec(
        self, id_: str, spec_path: Path, pidfile: Path, stdio: Stdio, console_socket: str | None
    ) -> None:
        args = ["exec", "--detach", "--process", str(spec_path), "--pid-file", str(pidfile)]
        if console_socket:
            args += ["--console-socket", console_socket]
        await self.run(id_, [*args, id_], stdio, capture=False)

    async def kill(self, id_: str, sig: int, all_: bool = False) -> None:
        await self.run(id_, ["kill", *(["--all"] if all_ else []), id_, str(sig)])

    async def delete(self, id_: str, force: bool = False) -> None:
        await self.run(id_, ["delete", *(["--force"] if force else []), id_])
        self._systemd.discard(id_)

    def _follow_cgroup_driver(self, id_: str, spec: dict) -> None:
        if systemd_cgroup(spec):
            self._systemd.add(id_)
        else:
            self._systemd.discard(id_)

    async def state(self, id_: str) -> dict:
        return json.loads(await self.run(id_, ["state", id_]))

    async def ps(self, id_: str) -> list[int]:
        return json.loads(await self.run(id_, ["ps", "--format", "json", id_])) or []

    async def pause(self, id_: str) -> None:
        await self.run(id_, ["pause", id_])

    async def resume(self, id_: str) -> None:
        await self.run(id_, ["resume", id_])

    async def update(self, id_: str, resources_json: Path) -> None:
        await self.run(id_, ["update", "--resources", str(resources_json), id_])

    # -- checkpoint / restore (CRIU) --------------------------------------------------------
    def _criu(self) -> list[str]:
        # Only when one is named (SNAPSHOT_CRIU): runc >= 1.2 ignores --criu, takes criu from
        # PATH, and warns on its stderr, which during a restore is the container's log.
        if not os.environ.get(criu_runner.CRIU_ENV):
            return []
        return ["--criu", criu_runner.criu_binary()]

    async def criu_version(self) -> str:
        """``criu --version`` through this driver's runner (in the shim: its reaper), read
        once: a shim restores many containers, the binary does not change under it."""
        if self._criu_version is None:  # one read, whoever asks first (a warm-up, a restore)
            self._criu_version = asyncio.ensure_future(self._read_criu_version())
        try:
            return await asyncio.shield(self._criu_version)
        except Exception:
            self._criu_version = None  # asked again next time
            raise

    async def _read_criu_version(self) -> str:
        _, out, _ = await self.runner.run([criu_runner.criu_binary(), "--version"])
        return criu_runner.parse_version(out.decode(errors="replace"))

    async def skips_in_flight(self) -> bool:
        """Whether this runc can leave connections in a listener's accept queue out of a
        dump (``--tcp-skip-in-flight``, runc >= 1.2). Without it, a connection that arrives
        while CRIU freezes the tree (a kubelet tcpSocket probe) fails the whole dump."""
        if self._skips_in_flight is None:
            _, out, err = await self.runner.run([self.binary, "checkpoint", "--help"])
            self._skips_in_flight = b"--tcp-skip-in-flight" in out + err
            if not self._skips_in_flight:
                log.warning(
                    "%s has no --tcp-skip-in-flight (runc < 1.2): a connection "
                    "arriving during a dump fails it",
                    self.binary,
                )
        return self._skips_in_flight

    async def checkpoint(
        self, id_: str, image_path: Path, work_path: Path, leave_running: bool
    ) -> None:
        in_flight = ["--tcp-skip-in-flight"] if await self.skips_in_flight() else []
        args = [
            *self._criu(),
            "checkpoint",
            "--image-path",
            str(image_path),
            "--work-path",
            str(work_path),
            "--tcp-established",
            *in_flight,
            "--file-locks",
            *(["--leave-running"] if leave_running else []),
            id_,
        ]
        try:
            await self.run(id_, args)
        except RuncError as e:
            raise e.as_criu_error("dump (runc checkpoint)", work_path / "dump.log") from e

    async def restore(
        self,
        id_: str,
        bundle: Path,
        image_path: Path,
        work_path: Path,
        pidfile: Path,
        stdio: Stdio,
        criu_config: str | None = None,
    ) -> None:
        """``runc restore --detach``; ``criu_config`` (CRIU options, one per line) reaches
        CRIU through the bundle's ``org.criu.config`` annotation, which runc honours."""
        spec = _bundle_spec(bundle)
        self._follow_cgroup_driver(id_, spec)
        if criu_config is not None:
            conf = work_path / "criu-restore.conf"
            conf.write_text(criu_config)
            spec.setdefault("annotations", {})[CRIU_CONFIG_ANNOTATION] = str(conf)
            (bundle / "config.json").write_text(json.dumps(spec))
        args = [
            *self._criu(),
            "restore",
            "--detach",
            "--bundle",
            str(bundle),
            "--image-path",
            str(image_path),
            "--work-path",
            str(work_path),
            "--pid-file",
            str(pidfile),
            "--file-locks",
            id_,
        ]
        try:
            await self.run(id_, args, stdio, capture=False)
        except RuncError as e:
            raise e.as_criu_error("restore (runc)", work_path / "restore.log") from e
