"""The only module that runs ``runc``. Every call is async and fails with RuncError carrying
runc's own message (its --log file, JSON lines, or stderr)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ..task.exits import Reaper

log = logging.getLogger(__name__)


class RuncError(Exception):
    def __init__(self, args: list[str], returncode: int, message: str) -> None:
        self.returncode = returncode
        self.message = message
        super().__init__(f"runc {' '.join(args[:2])} failed ({returncode}): {message}")


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
    #: CRIU binary for checkpoint/restore (runc's --criu), if not the one on PATH
    criu: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    reaper: Reaper | None = None

    def _base(self, id_: str) -> list[str]:
        args = [self.binary, "--root", str(self.root)]
        if self.log_dir is not None:
            args += ["--log", str(self.log_dir / f"runc-{id_}.log"), "--log-format", "json"]
        if self.criu:
            args += ["--criu", self.criu]
        return args

    async def run(
        self, id_: str, args: list[str], stdio: Stdio | None = None, capture: bool = True
    ) -> str:
        stdio = stdio or Stdio()
        cmd = [*self._base(id_), *args]
        log.debug("exec %s", cmd)
        if self.reaper is None:
            raise RuntimeError("Runc needs a reaper (the shim's waitpid(-1) owner)")
        # Without capture, runc's stdio become the container's: a pipe of ours there would
        # never see EOF while the container lives, so it gets /dev/null instead (runc's own
        # errors still reach its --log file).
        quiet = None if capture else subprocess.DEVNULL
        code, out, err = await self.reaper.run(
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

    async def restore(
        self, id_: str, bundle: Path, image_path: Path, work_path: Path, pidfile: Path,
        stdio: Stdio, extra: list[str] | None = None,
    ) -> None:  # fmt: skip
        args = ["restore", "--detach", "--bundle", str(bundle), "--image-path", str(image_path),
                "--work-path", str(work_path), "--pid-file", str(pidfile),
                "--file-locks"]  # fmt: skip
        await self.run(id_, [*args, *(extra or []), id_], stdio, capture=False)
