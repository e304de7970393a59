"""A source is ended only when its snapshot is durable where the user asked for it, and a
source that should serve on is never left asleep silently (faults round 2), through the
agent's real entry point (``reconcile_key``), a real kube-apiserver, containerd's CRI (both
lines), runc, CRIU and Debian's registry:

- the registry killed mid-push, without keepSourceRunning: before, the source was ended at
  the local commit and the failed push then deleted the artifact (neither pod nor snapshot
  left), after 90+ s of oras' retries. Now the PodSnapshot fails within the push's retry
  window, the source serves with its state, and no artifact or cache entry is left;
- a committed artifact whose PodSnapshot still says Checkpointing (the agent died, or the
  API server was down, between the commit and the Ready): the agent finishes the job from
  it and marks it Ready, where it used to fail it as "the agent restarted";
- the API server down from the dump until after the commit: the Ready write is retried
  until it lands, and only then is the source ended;
- keepSourceRunning with an engine whose wake fails: the PodSnapshot is Ready, and the
  source's sleep is a Warning on the PodSnapshot and on its pod, and a metric;
- a handshake timeout through the agent: condition, Event and counter;
- the agent's checkpoints run on its slots (one slot: one quiesce at a time).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import threading
import time
import uuid

import yaml

from agent import decisions
from agent.loop import SOURCE_NOT_RESUMED
from api.handshake import CHECKPOINT_REQUESTED
from api.paths import DEFAULT_RUNC_ROOT
from devnode import oci_registry, wait_until
from kubeclient import api as kube
from restore_runtime.artifact.oci import OciRef, RegistryAccess
from restore_runtime.errors import SnapshotError
from restore_runtime.executor.checkpoint import CheckpointRequest, checkpoint
from restore_runtime.executor.tree_access import RuncContainer
from tests.conftest import CRI_NODE
from tests.controller.objects import conditions
from tests.helpers import ask
from tests.kube_support import hand_over, resync, settle
from tests.test_node_flow import (  # noqa: F401 - kubelet: the fixture
    IMAGE,
    PORT,
    STANDIN_VLLM,
    generate,
    kubelet,
    node_agent,
    snaps,
)

pytestmark = CRI_NODE


def _pod(kl, name: str, env: list[dict] | None = None, command=None, ready=None):
    main = {"name": "main", "image": IMAGE, "env": env or []}
    pod = kl.api.post(
        f"/api/v1/namespaces/{kl.ns}/pods",
        json={"metadata": {"name": name}, "spec": {"containers": [main]}},
    ).json()
    kw = {"command": command} if command else {}
    sandbox, ctr = kl.start(pod, ready=ready, **kw)
    return pod, kl.crictl.pod_ip(sandbox), ctr


def _events(api, ns: str) -> set[tuple[str, str]]:
    items = api.get(f"/api/v1/namespaces/{ns}/events").json()["items"]
    return {(e["involvedObject"]["name"], e["reason"]) for e in items}


async def test_a_registry_killed_mid_push_leaves_the_source_serving(
    control_plane,
    containerd,
    kubelet,  # noqa: F811 - the fixture imported above
    tmp_path,
):
    api, ns, sfx = kubelet.api, kubelet.ns, uuid.uuid4().hex[:6]
    _, ip, _ = _pod(kubelet, f"push-{sfx}", [{"name": "COUNTER_EXTRA_MB", "value": "768"}])
    before = int(ask(ip, PORT, timeout=30)["count"])
    await hand_over(control_plane, api, ns, f"push-{sfx}", f"push-{sfx}")
    work = tmp_path / "registry"
    with oci_registry.docker_registry(work) as reg:
        repo = OciRef.parse(f"oci://{reg.address}/snapshots/faults")
        settings = {
            "oci_repository": repo,
            "registry": RegistryAccess(plain_http=frozenset({"127.0.0.1"}), workers=2),
        }
        async with await kube.api_client(str(control_plane.kubeconfig)) as client:
            agent = node_agent(client, containerd, kubelet, **settings)
            await resync(agent)

            def uploading() -> bool:  # the push has begun: blobs are landing
                return any((work / "data").rglob("_uploads")) or any(
                    (work / "data").rglob("blobs/sha256")
                )

            await _until(uploading, "the push under way", timeout=180)
            subprocess.run(["pkill", "-KILL", "-f", str(work / "config.yml")], check=False)
            killed = time.monotonic()
            await settle(agent)
            took = time.monotonic() - killed
    snap = api.get(f"{snaps(ns)}/push-{sfx}").json()
    failed = conditions(snap).get("Failed")
    message = next(c["message"] for c in snap["status"]["conditions"] if c["type"] == "Failed")
    assert failed and failed[0] == "True", snap["status"]
    assert "pushing the artifact" in message and "the source keeps serving" in message, message
    assert took < 60, f"the push failed {took:.0f}s after the registry died"
    assert int(ask(ip, PORT, timeout=30)["count"]) == before + 1, "the source lost its state"
    assert not list((containerd.store / ns).glob(f"push-{sfx}-*")), "no artifact is left"
    assert not [p for p in (containerd.store / ns).iterdir() if f"push-{sfx}" in p.name]
    assert not any(agent.cache.root.glob("*")) if agent.cache.root.exists() else True


async def test_a_committed_artifact_of_a_checkpointing_snapshot_is_finished_not_failed(
    control_plane,
    containerd,
    kubelet,  # noqa: F811 - the fixture imported above
):
    """The agent died (or the API server went away) after the commit, before the Ready:
    the artifact is in the store, the PodSnapshot says Checkpointing. The agent that finds
    it marks it Ready from the artifact, with a true message, and an Event."""
    api, ns, sfx = kubelet.api, kubelet.ns, uuid.uuid4().hex[:6]
    _, ip, ctr = _pod(kubelet, f"late-{sfx}")
    await hand_over(control_plane, api, ns, f"late-{sfx}", f"late-{sfx}")
    async with await kube.api_client(str(control_plane.kubeconfig)) as client:
        agent = node_agent(client, containerd, kubelet)
        snap = await agent.snapshots.get(ns, f"late-{sfx}")
        assert snap is not None
        await agent.snapshots.patch_status(snap, decisions.checkpointing(snap))
        snap = await agent.snapshots.get(ns, f"late-{sfx}")
        out = decisions.artifact_dir(containerd.store, snap)
        out.parent.mkdir(parents=True, exist_ok=True)
        checkpoint(
            CheckpointRequest(
                output=out,
                leave_running=True,
                runc_container=RuncContainer(agent.cfg.runc_root, ctr, containerd.runc),
                pod=f"late-{sfx}",
                namespace=ns,
                pod_snapshot=f"late-{sfx}",
                pod_snapshot_uid=snap.metadata.uid,
            )
        )
        await resync(agent)
        await settle(agent)
    got = api.get(f"{snaps(ns)}/late-{sfx}").json()
    assert conditions(got)["Ready"] == ("True", "Captured"), got["status"]
    assert got["status"]["artifact"]["uri"] == f"file://{out}"
    assert (f"late-{sfx}", "Captured") in _events(api, ns)
    assert ask(ip, PORT, timeout=30)["count"], "the source serves on"


async def test_a_source_whose_wake_fails_is_reported_not_left_asleep_silently(
    control_plane,
    containerd,
    kubelet,  # noqa: F811 - the fixture imported above
):
    api, ns, sfx = kubelet.api, kubelet.ns, uuid.uuid4().hex[:6]
    env = [{"name": "STANDIN_MODE", "value": "wake-fails"}]
    _pod(kubelet, f"nowake-{sfx}", env, command=STANDIN_VLLM, ready=generate)
    quiesce = {"engine": "vllm", "port": PORT}
    await hand_over(
        control_plane,
        api,
        ns,
        f"nowake-{sfx}",
        f"nowake-{sfx}",
        keepSourceRunning=True,
        quiesce=quiesce,
    )
    async with await kube.api_client(str(control_plane.kubeconfig)) as client:
        agent = node_agent(client, containerd, kubelet)
        await resync(agent)
        await settle(agent)
        sample = agent.metrics.registry.get_sample_value
        assert sample("snapshot_agent_source_not_resumed_total") == 1
    snap = api.get(f"{snaps(ns)}/nowake-{sfx}").json()
    assert conditions(snap)["Ready"] == ("True", "Captured"), snap["status"]
    events = _events(api, ns)
    assert (f"nowake-{sfx}", SOURCE_NOT_RESUMED) in events  # the PodSnapshot and the pod
    items = api.get(f"/api/v1/namespaces/{ns}/events").json()["items"]
    kinds = {
        e["involvedObject"]["kind"]
        for e in items
        if e["reason"] == SOURCE_NOT_RESUMED and e["involvedObject"]["name"] == f"nowake-{sfx}"
    }
    assert kinds == {"PodSnapshot", "Pod"}, kinds


class ApiOutage:
    """A TCP proxy in front of the API server that the test can take down (every connection
    reset, the port refusing) and bring back on the same port: the agent sees an API server
    killed and restarted."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target, self.conns = target, []
        self.srv = self._listen(0)
        self.port = self.srv.getsockname()[1]
        self._serve()

    def _listen(self, port: int) -> socket.socket:
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", port))
        srv.listen(64)
        return srv

    def _serve(self) -> None:
        srv = self.srv

        def pipe(a: socket.socket, b: socket.socket) -> None:
            with contextlib.suppress(OSError):
                while data := a.recv(65536):
                    b.sendall(data)
            with contextlib.suppress(OSError):
                b.shutdown(socket.SHUT_WR)

        def accept() -> None:
            with contextlib.suppress(OSError):
                while True:
                    client, _ = srv.accept()
                    server = socket.create_connection(self.target)
                    self.conns += [client, server]
                    for a, b in ((client, server), (server, client)):
                        threading.Thread(target=pipe, args=(a, b), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()

    def down(self) -> None:
        with contextlib.suppress(OSError):  # wakes the accept() blocked on it
            self.srv.shutdown(socket.SHUT_RDWR)
        self.srv.close()
        for c in self.conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()
        self.conns = []

    def up(self) -> None:
        self.srv = self._listen(self.port)
        self._serve()


async def test_an_api_server_down_from_the_dump_to_after_the_commit_ends_ready(
    control_plane,
    containerd,
    kubelet,  # noqa: F811 - the fixture imported above
    tmp_path,
):
    """Faults round 2: the API server dies after the agent wrote Checkpointing and is back
    once the artifact is committed (no keepSourceRunning). Before, the Ready write was not
    retried, the next relist failed the PodSnapshot as "the agent restarted", which was
    false, and the source was already ended. Now the write is retried until it lands, the
    PodSnapshot ends Ready, and the source is ended only after that."""
    api, ns, sfx = kubelet.api, kubelet.ns, uuid.uuid4().hex[:6]
    _, _, ctr = _pod(kubelet, f"outage-{sfx}", [{"name": "COUNTER_EXTRA_MB", "value": "256"}])
    await hand_over(control_plane, api, ns, f"outage-{sfx}", f"outage-{sfx}")
    cfg = yaml.safe_load(control_plane.kubeconfig.read_text())
    server = cfg["clusters"][0]["cluster"]["server"]
    host, port = server.removeprefix("https://").rsplit(":", 1)
    proxy = ApiOutage((host, int(port)))
    cfg["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    kubeconfig = tmp_path / "through-proxy.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(cfg))
    runc = RuncContainer(DEFAULT_RUNC_ROOT, ctr, containerd.runc)
    async with await kube.api_client(str(kubeconfig)) as client:
        agent = node_agent(client, containerd, kubelet)
        await resync(agent)
        where = containerd.store / ns
        await _until(lambda: any(where.glob(f".outage-{sfx}-*.staging-*")), "the dump")
        proxy.down()  # the agent wrote Checkpointing; now it dumps, with no API server
        await _until(lambda: any(p.is_dir() for p in where.glob(f"outage-{sfx}-*")), "the commit")
        await asyncio.sleep(2)  # committed: the Ready write fails and is tried again
        pending = conditions(api.get(f"{snaps(ns)}/outage-{sfx}").json())["Ready"]
        assert pending == ("False", "Checkpointing")
        assert runc.state()["status"] == "running", "the source is not ended before Ready"
        proxy.up()
        await settle(agent)
        assert (
            agent.metrics.registry.get_sample_value(
                "snapshot_agent_checkpoints_total", {"result": "captured"}
            )
            == 1
        )
    proxy.down()
    snap = api.get(f"{snaps(ns)}/outage-{sfx}").json()
    assert conditions(snap)["Ready"] == ("True", "Captured"), snap["status"]
    assert "Failed" not in conditions(snap) or conditions(snap)["Failed"][0] != "True"
    wait_until(lambda: not _running(runc), what="the source ended after Ready", timeout=30)


async def _until(cond, what: str, timeout: float = 120.0) -> None:
    """Poll ``cond`` without blocking the event loop the agent under test runs on."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not seen after {timeout:g}s"
        await asyncio.sleep(0.002)


def _running(c: RuncContainer) -> bool:
    try:
        return c.state().get("status") == "running"
    except SnapshotError:  # containerd deleted it
        return False


async def test_a_handshake_timeout_fails_the_snapshot_with_its_condition_event_and_count(
    control_plane,
    containerd,
    kubelet,  # noqa: F811 - the fixture imported above
):
    """A workload that never says ready: through the agent's own entry point, the
    PodSnapshot ends Failed with reason CheckpointFailed and the handshake's error, a
    Warning Event says the same, the failed checkpoint is counted, and the source serves
    again once it answers."""
    api, ns, sfx = kubelet.api, kubelet.ns, uuid.uuid4().hex[:6]
    gate = [{"name": "COUNTER_QUIESCE_GATE", "value": "/snapshot-control/gate"}]
    pod, ip, _ = _pod(kubelet, f"mute-{sfx}", gate)
    before = int(ask(ip, PORT, timeout=30)["count"])
    await hand_over(control_plane, api, ns, f"mute-{sfx}", f"mute-{sfx}")
    async with await kube.api_client(str(control_plane.kubeconfig)) as client:
        agent = node_agent(client, containerd, kubelet, handshake_timeout_s=2)
        await resync(agent)
        await settle(agent)
        failed = agent.metrics.registry.get_sample_value(
            "snapshot_agent_checkpoints_total", {"result": "failed"}
        )
    assert failed == 1
    snap = api.get(f"{snaps(ns)}/mute-{sfx}").json()
    cond = next(c for c in snap["status"]["conditions"] if c["type"] == "Failed")
    assert (cond["status"], cond["reason"]) == ("True", "CheckpointFailed"), cond
    assert "ready-for-snapshot" in cond["message"] or "handshake" in cond["message"], cond
    assert (f"mute-{sfx}", "CheckpointFailed") in _events(api, ns)
    (decisions.control_dir(kubelet.root, pod["metadata"]["uid"]) / "gate").touch()
    assert int(ask(ip, PORT, timeout=30)["count"]) == before + 1, "the source serves again"


async def test_the_agent_runs_its_checkpoints_on_its_slots(
    control_plane,
    containerd,
    kubelet,  # noqa: F811 - the fixture imported above
):
    """Isolation round 3, a test that checked less: the fair slots were tested as a class
    only. With one slot on the node, of two PodSnapshots whose workloads hold the quiesce,
    the agent asks only one workload to quiesce; the other is asked once the first is
    captured."""
    api, ns, sfx = kubelet.api, kubelet.ns, uuid.uuid4().hex[:6]
    gate = [{"name": "COUNTER_QUIESCE_GATE", "value": "/snapshot-control/gate"}]
    pods = [_pod(kubelet, f"slot{i}-{sfx}", gate)[0] for i in (1, 2)]
    controls = [decisions.control_dir(kubelet.root, p["metadata"]["uid"]) for p in pods]
    for i in (1, 2):
        await hand_over(control_plane, api, ns, f"slot{i}-{sfx}", f"slot{i}-{sfx}")

    def asked() -> list[bool]:
        return [(c / CHECKPOINT_REQUESTED).exists() for c in controls]

    async with await kube.api_client(str(control_plane.kubeconfig)) as client:
        agent = node_agent(client, containerd, kubelet, max_checkpoints=1)
        await resync(agent)
        await _until(lambda: any(asked()), "a checkpoint request")
        await asyncio.sleep(2)  # the other waits for the slot, however long
        first = asked().index(True)
        assert asked().count(True) == 1, "two checkpoints on one slot"
        (controls[first] / "gate").touch()
        other = 1 - first
        await _until(lambda: asked()[other], "the second checkpoint's request", timeout=120)
        (controls[other] / "gate").touch()
        await settle(agent)
    for i in (1, 2):
        got = api.get(f"{snaps(ns)}/slot{i}-{sfx}").json()
        assert conditions(got)["Ready"] == ("True", "Captured"), got["status"]
