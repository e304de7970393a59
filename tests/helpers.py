"""Shared helpers for the engine tests: start the counter workload, talk to it, clean up."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

# the tests' wait_for and restored_condition are devnode's (bench/gpu/k8s_story.py uses them)
from devnode import free_port, restored_condition, wait_for  # noqa: F401
from devnode.probe import first_response, parse
from restore_runtime import sandbox
from restore_runtime.executor.tree_access import CriuRestorer

ROOT = Path(__file__).resolve().parent.parent
COUNTER = ROOT / "tests" / "workloads" / "counter_server.py"
BACKLOG_LISTENER = ROOT / "tests" / "workloads" / "backlog_listener.py"


def ask(host: str, port: int, timeout: float = 10.0) -> dict[str, str]:
    """One request; returns the parsed ``key=value`` reply. Retries until ``timeout``."""
    try:
        _, line = first_response(host, port, time.monotonic(), timeout)
    except TimeoutError as e:
        raise AssertionError(str(e)) from None
    return parse(line)


def connect(host: str, port: int, timeout: float = 30.0) -> socket.socket:
    """A connection to a listener that may not be up yet (retried until ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection((host, port), timeout=5)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    for _ in range(300):
        if not Path(f"/proc/{pid}").exists():
            return
        # A restored tree is re-parented; reap it if it became our child.
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.01)


def start_counter(
    tmp: Path,
    host: str = "127.0.0.1",
    port: int | None = None,
    netns: str | None = None,
    control_dir: Path | None = None,
    script: Path = COUNTER,
) -> tuple[int, int]:
    port = port or free_port()
    env = (
        {"SNAPSHOT_CONTROL_DIR": str(control_dir)} if control_dir else {"SNAPSHOT_CONTROL_DIR": ""}
    )
    pid = sandbox.start(
        [sys.executable, str(script), host, str(port)],
        tmp / f"counter-{port}.log",
        netns=netns,
        env=env,
    )
    return pid, port


def snapshotctl(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(
        [sys.executable, "-m", "restore_runtime.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if check and p.returncode != 0:
        raise AssertionError(f"snapshotctl {' '.join(args)} failed ({p.returncode}):\n{p.stderr}")
    return p


def restore_cli(art: Path, tmp: Path, *extra: str) -> tuple[int, dict]:
    """``snapshotctl restore ART --json``: the restored root's PID and the report."""
    pidfile = tmp / f"restored-{len(list(tmp.iterdir()))}.pid"
    out = snapshotctl("restore", str(art), "--pidfile", str(pidfile), "--json", *extra)
    return int(pidfile.read_text()), json.loads(out.stdout)


def get_json(ip: str, port: int, path: str = "/generate", timeout: float = 60.0) -> dict:
    """An HTTP workload's JSON answer (a stand-in engine's), retried until it serves (an
    engine asleep answers 503, which is retried too)."""
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://{ip}:{port}{path}", timeout=5) as r:
                return json.loads(r.read())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def processes(pattern: str) -> list[str]:
    """``pgrep -af PATTERN``: the matching processes' command lines, pgrep itself left out."""
    out = subprocess.run(["pgrep", "-af", "--", pattern], capture_output=True, text=True).stdout
    return [ln for ln in out.splitlines() if "pgrep" not in ln]


def shim_pids(container_id: str) -> list[int]:
    """The shim server(s) started for a container or pod sandbox (its ``start`` command
    line names the id)."""
    return [int(ln.split()[0]) for ln in processes(f"-id {container_id} .*start")]


def mapped_outside(pid: int | str, tree: str) -> list[str]:
    """The files process ``pid`` maps (its /proc/PID/maps) that are not under ``tree``: what
    a node bundle's process took from its host."""
    mapped = {
        f.strip()
        for ln in Path(f"/proc/{pid}/maps").read_text().splitlines()
        for f in ln.split(None, 5)[5:]
        if f.strip().startswith("/")
    }
    return sorted(m for m in mapped if not m.startswith(f"{tree.rstrip('/')}/"))


@contextlib.contextmanager
def hung_api_server(kubeconfig: Path, dest: Path) -> Iterator[Path]:
    """A copy of ``kubeconfig`` (at ``dest``) whose server accepts connections and never
    answers: a real listening socket that reads nothing."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(16)
        cfg = yaml.safe_load(kubeconfig.read_text())
        cfg["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{hole.getsockname()[1]}"
        dest.write_text(yaml.safe_dump(cfg))
        yield dest


class BeforeTheTree(Exception):
    """What ``StopBeforeTree`` raises: the restore passed every check before the tree."""


class StopBeforeTree(CriuRestorer):
    """A TreeRestorer that restores nothing: the engine's phases up to the tree's restore
    (verify, gates, stage, rebind) run alone, and the restore then ends as a failure would."""

    def restore(self, images: Path, work: Path, netns: str | None) -> int:
        raise BeforeTheTree()


def up_to_the_tree(req) -> None:
    """Run ``req`` up to the tree's restore; raises what a check raised."""
    from restore_runtime.executor.restore import restore

    with contextlib.suppress(BeforeTheTree):
        restore(req, StopBeforeTree())


def bound_node(store: Path):
    """The shim's kind of node: restores bound to ``store`` (signatures off: these tests are
    about the binding)."""
    from api.node import NodeConfig
    from restore_runtime.node import NodeContext

    return NodeContext.of(NodeConfig(store_root=store, signing_required=False, fill_ledger=False))


EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cpu_demo" / "k8s"


def example_manifest(name: str, image: str, **edits) -> str:
    """examples/cpu_demo/k8s/NAME.yaml with the demo image where the user pushed it (the
    README: "set image: to where you pushed it") and ``edits`` ("spec.replicas": 1)."""
    text = (EXAMPLE / f"{name}.yaml").read_text()
    doc = yaml.safe_load(text.replace("snapshot-cpu-demo:0.1", image))
    for path, value in edits.items():
        node = doc
        *keys, last = path.split(".")
        for k in keys:
            node = node.setdefault(k, {})
        node[last] = value
    return yaml.safe_dump(doc)


def one_replica_named(name: str, **edits) -> dict:
    """The edits that make the example Deployment a second one of its own: ``name``, one
    replica, its own app label (so its pod is told apart from the first's)."""
    return {
        "metadata.name": name,
        "spec.replicas": 1,
        "spec.selector.matchLabels.app": name,
        "spec.template.metadata.labels.app": name,
        **edits,
    }


def client_as(control_plane, admin, namespace: str, account: str):
    """A client of ``control_plane`` authenticated as service account ``namespace/account``
    (a token the admin asks for, ten minutes long, bound to no pod)."""
    r = admin.post(f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
                   json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                         "spec": {"expirationSeconds": 600}})  # fmt: skip
    assert r.status_code == 201, r.text
    client = control_plane.client()
    client.headers["Authorization"] = f"Bearer {r.json()['status']['token']}"
    return client
