"""`snapshot-webhook` and `snapshot-signer` as their own processes (not their modules in the
test's), serving TLS on loopback with a self-signed CA: for the tests and the webhook load
benchmark."""

from __future__ import annotations

import contextlib
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from devnode import free_port, stop_process, wait_until


@dataclass
class TlsServer:
    url: str
    ca: Path
    log: Path

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, verify=ssl.create_default_context(cafile=self.ca), timeout=30
        )


@contextlib.contextmanager
def webhook_process(
    tmp: Path, kubeconfig: Path, *extra: str, own_ca: bool = False
) -> Iterator[TlsServer]:
    """`snapshot-webhook` as its own process, serving TLS on loopback with a self-signed CA;
    ``own_ca``: ``extra`` says where its certificate comes from (``TlsServer.ca`` is then a
    path the caller fills in)."""
    with _tls_process(tmp, "webhook", kubeconfig, extra, own_ca) as server:
        yield server


@contextlib.contextmanager
def signer_process(
    tmp: Path, kubeconfig: Path, key: Path | None, agent_sa: str, *extra: str, own_ca: bool = False
) -> Iterator[TlsServer]:
    """`snapshot-signer` as its own process, with ``key`` (else ``extra`` names its key),
    for ``agent_sa`` (NS:NAME)."""
    args = (*(("--key", str(key)) if key else ()), "--agent-service-account", agent_sa, *extra)
    with _tls_process(tmp, "signer", kubeconfig, args, own_ca) as server:
        yield server


@contextlib.contextmanager
def _tls_process(
    tmp: Path, component: str, kubeconfig: Path, extra: tuple[str, ...], own_ca: bool = False
) -> Iterator[TlsServer]:
    port = free_port()
    log = tmp / f"{component}-{port}.log"
    certs = tmp / f"certs-{port}"
    tls = () if own_ca else ("--self-signed", str(certs))
    cmd = [
        sys.executable,
        "-m",
        f"{component}.cli",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *tls,
        "--extra-san",
        "127.0.0.1",
        "--kubeconfig",
        str(kubeconfig),
        *extra,
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    server = TlsServer(f"https://127.0.0.1:{port}", certs / "ca.crt", log)
    try:

        def healthy() -> bool:
            if not own_ca and not server.ca.exists():
                return False
            try:
                with (
                    httpx.Client(base_url=server.url, verify=False) if own_ca else server.client()
                ) as c:
                    return c.get("/healthz").status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, [proc], f"snapshot-{component}", log, 30)
        yield server
    finally:
        stop_process(proc, 10)
