"""Debian's docker-registry (the CNCF distribution server) on loopback: where devnode pushes
the project's images (and, later, OCI artifacts). Plain HTTP on 127.0.0.1 only; containerd
reaches it through a ``certs.d/<host:port>/hosts.toml`` (:func:`hosts_toml`).

    with docker_registry(workdir) as reg:     # reg.address == "127.0.0.1:PORT"
        ...
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import free_port, stop_process, wait_until

BINARY = "docker-registry"


def missing() -> str | None:
    return None if shutil.which(BINARY) else "docker-registry not installed (make system)"


@dataclass(frozen=True)
class Registry:
    address: str  # host:port

    def hosts_toml(self) -> str:
        """containerd's per-host config: plain HTTP to this registry."""
        return (
            f'server = "http://{self.address}"\n[host."http://{self.address}"]\n'
            '  capabilities = ["pull", "resolve", "push"]\n'
        )


@contextlib.contextmanager
def docker_registry(workdir: Path) -> Iterator[Registry]:
    workdir.mkdir(parents=True, exist_ok=True)
    address = f"127.0.0.1:{free_port()}"
    config = {
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": {
            "filesystem": {"rootdirectory": str(workdir / "data")},
            "delete": {"enabled": True},
        },
        "http": {"addr": address, "debug": {"addr": ""}},
    }
    (workdir / "config.yml").write_text(yaml.safe_dump(config))
    log = workdir / "registry.log"
    with log.open("ab") as logf:
        proc = subprocess.Popen(
            [BINARY, "serve", str(workdir / "config.yml")], stdout=logf, stderr=subprocess.STDOUT
        )
        try:
            wait_until(
                lambda: urllib.request.urlopen(f"http://{address}/v2/", timeout=2).status == 200,
                [proc],
                "docker-registry",
                log,
                30,
            )
            yield Registry(address)
        finally:
            stop_process(proc, 10)
