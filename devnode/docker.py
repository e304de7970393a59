"""A private Docker daemon for kind, and a census of what it could leave on the host.

kind needs Docker. The daemon here is started for the kind smoke and stopped after it, with
its own containerd, sockets and directories, so the rest of the suite never meets it:

- ``--iptables=false`` (and no ip6tables, forwarding or masquerading): Docker's own rules
  (the DOCKER chains, a FORWARD policy of DROP) would break the CNI tests that run after it.
  kind needs none of them: the node reaches nothing outside, and the API server's published
  port is served by docker-proxy on loopback.
- ``--bridge=none``: no docker0; kind makes its own network, removed after the smoke.
- its images (the kind node image among them) stay in the tools cache between runs.

Where ``DOCKER_HOST`` is set, that daemon is used instead and nothing is started (a user's
CI runner, say)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from . import links, mount_points, stop_process, unmount_under, wait_until

CACHE = Path(os.environ.get("SNAPSHOT_KIND_CACHE", "/var/cache/snapshot-tools/kind"))
RUN = Path("/run/snapshot-docker")
SOCKET = RUN / "docker.sock"


def missing() -> str | None:
    """Why Docker cannot run here, or None."""
    if os.environ.get("DOCKER_HOST"):
        return None
    dirs = [*os.environ["PATH"].split(":"), "/usr/sbin"]
    for binary in ("docker", "dockerd", "containerd", "docker-proxy"):
        if not any(Path(d, binary).exists() for d in dirs):
            return f"{binary} is not installed (make system installs docker.io)"
    if os.geteuid() != 0:
        return "a rootful Docker daemon needs root (the rootless one needs cgroup v2)"
    return None


@dataclass
class Docker:
    """The docker CLI against one daemon."""

    host: str
    env: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self.env = {**os.environ, "DOCKER_HOST": self.host}

    def run(
        self, *args: str, check: bool = True, input: bytes | None = None, timeout: float = 600
    ) -> subprocess.CompletedProcess:
        p = subprocess.run(
            ["docker", *args], env=self.env, input=input, capture_output=True, timeout=timeout
        )
        if check and p.returncode:
            raise RuntimeError(f"docker {' '.join(args)}: {p.stderr.decode().strip()}")
        return p

    def out(self, *args: str) -> str:
        return self.run(*args).stdout.decode().strip()

    def has_image(self, ref: str) -> bool:
        return self.run("image", "inspect", ref, check=False).returncode == 0

    def names(self, what: str) -> set[str]:
        """Containers (every state) or networks, by name."""
        command, fmt = _LISTS[what]
        return set(self.out(*command, "--format", fmt).split())


#: what lists each kind of object, and its name's field
_LISTS = {"containers": (["ps", "-a"], "{{.Names}}"), "networks": (["network", "ls"], "{{.Name}}")}


def _containerd_config() -> str:
    return "\n".join(
        [
            "version = 2",
            f'root = "{CACHE / "containerd"}"',
            f'state = "{RUN / "containerd-state"}"',
            'disabled_plugins = ["io.containerd.grpc.v1.cri"]',
            "[grpc]",
            f'  address = "{RUN / "containerd.sock"}"',
            "",
        ]
    )


def _remove_all(docker: Docker) -> None:
    """Every container and network of the private daemon: it only ever runs kind's nodes,
    and one still there is an interrupted run's."""
    ids = docker.out("ps", "-aq").split()
    if ids:
        docker.run("rm", "-f", "-v", *ids)
    docker.run("network", "prune", "-f")


def _ours(pidfile: Path) -> int | None:
    """The PID in ``pidfile`` if that process is still one this module started (its command
    line names the private directories), not a later process that got its number."""
    try:
        pid = int(pidfile.read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if str(RUN).encode() in cmdline else None


def sweep() -> None:
    """What an interrupted run left: its kind nodes (while the private daemon still answers),
    the daemon and its containerd, and their mounts."""
    if SOCKET.exists():
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            _remove_all(Docker(f"unix://{SOCKET}"))
    for pidfile in (RUN / "dockerd.pid", RUN / "containerd.pid"):
        if (pid := _ours(pidfile)) is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
                deadline = time.monotonic() + 30
                while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                    time.sleep(0.2)
                os.kill(pid, signal.SIGKILL)
        pidfile.unlink(missing_ok=True)
    unmount_under(RUN, CACHE / "docker", CACHE / "containerd")


@contextlib.contextmanager
def daemon() -> Iterator[Docker]:
    """The daemon ``DOCKER_HOST`` names, or a private one for the length of the block."""
    if os.environ.get("DOCKER_HOST"):
        yield Docker(os.environ["DOCKER_HOST"])
        return
    sweep()
    RUN.mkdir(parents=True, exist_ok=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    (RUN / "containerd.toml").write_text(_containerd_config())
    logs = [RUN / "containerd.log", RUN / "dockerd.log"]
    with logs[0].open("w") as log:
        ctrd = subprocess.Popen(
            ["containerd", "--config", str(RUN / "containerd.toml")],
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    (RUN / "containerd.pid").write_text(f"{ctrd.pid}\n")
    dockerd = None
    try:
        wait_until((RUN / "containerd.sock").exists, [ctrd], "containerd", logs[0], 60)
        with logs[1].open("w") as log:
            dockerd = subprocess.Popen(
                [
                    "dockerd",
                    "--data-root",
                    str(CACHE / "docker"),
                    "--exec-root",
                    str(RUN / "exec"),
                    "--pidfile",
                    str(RUN / "dockerd.pid"),
                    "--host",
                    f"unix://{SOCKET}",
                    "--containerd",
                    str(RUN / "containerd.sock"),
                    "--iptables=false",
                    "--ip6tables=false",
                    "--ip-forward=false",
                    "--ip-masq=false",
                    "--bridge=none",
                    "--log-level=warn",
                ],
                stdout=log,
                stderr=log,
                start_new_session=True,
                env={**os.environ, "PATH": f"{os.environ['PATH']}:/usr/sbin:/sbin"},
            )
        docker = Docker(f"unix://{SOCKET}")
        wait_until(
            lambda: docker.run("info", check=False).returncode == 0,
            [dockerd],
            "dockerd",
            logs[1],
            60,
        )
        _remove_all(docker)  # a node the daemon restarted (its run was killed with it)
        yield docker
    finally:
        if dockerd is not None:
            stop_process(dockerd, 60)
        stop_process(ctrd, 60)
        unmount_under(RUN, CACHE / "docker", CACHE / "containerd")


@dataclass(frozen=True)
class Census:
    """What a daemon and its clusters could leave on the host."""

    iptables_chains: frozenset[str]
    links: frozenset[str]
    mounts: frozenset[str]

    @classmethod
    def take(cls) -> Census:
        chains = set()
        for cmd in ("iptables-save", "ip6tables-save"):
            table = ""
            out = subprocess.run([cmd], capture_output=True, text=True).stdout
            for line in out.splitlines():
                if line.startswith("*"):
                    table = line[1:]
                elif line.startswith(":"):
                    chains.add(f"{cmd[:-5]} {table} {line[1:].split()[0]}")
        names = frozenset(link["ifname"] for link in links())
        return cls(frozenset(chains), names, frozenset(mount_points()))

    def counts(self) -> dict[str, int]:
        return {
            "iptables_chains": len(self.iptables_chains),
            "links": len(self.links),
            "mounts": len(self.mounts),
        }

    def diff(self, later: Census) -> dict[str, list[str]]:
        """What ``later`` has that this has not, and the reverse, per kind."""
        out = {}
        for name in ("iptables_chains", "links", "mounts"):
            a, b = getattr(self, name), getattr(later, name)
            if a != b:
                out[name] = sorted(f"+{x}" for x in b - a) + sorted(f"-{x}" for x in a - b)
        return out
