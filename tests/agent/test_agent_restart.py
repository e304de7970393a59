"""An agent killed mid-checkpoint recovers as it starts again (faults round 2), through the
real agent process, a real kube-apiserver, containerd's CRI (both lines), runc and CRIU.

The agent runs as ``snapshot-agent run`` in a session of its own (as its container is:
killing it kills the runc and CRIU it started). The test kills it with SIGKILL at a moment it
picks by watching the node: while the workload quiesces (it answers ready only when a gate
opens, which never happens), while CRIU holds the container frozen (a source with 1 GiB
more memory makes the dump last a second; the test reads the freezer's file every
millisecond), and while the rootfs diff is packed. Then it starts the
agent again. Before the fix, that start crash-looped (``asyncio.run()`` inside the agent's
running loop, in its recovery); now, for each moment:
- the agent keeps running, and its /metrics counts one recovered checkpoint;
- the source answers with its state (its counter goes on);
- the PodSnapshot ends Failed, saying the agent restarted and what was given back;
- no journal, staging or work directory is left in the store.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest

from agent import decisions
from api.handshake import CHECKPOINT_REQUESTED
from api.paths import DEFAULT_RUNC_ROOT
from devnode import wait_until
from restore_runtime.executor.recovery import journals
from restore_runtime.executor.tree_access import RuncContainer
from tests.conftest import CRI_NODE
from tests.controller.objects import conditions
from tests.helpers import ROOT, ask
from tests.kube_support import hand_over
from tests.shim.test_checkpoint_faults import freezer_file, is_frozen
from tests.test_node_flow import IMAGE, NODE, PORT, kubelet, snaps  # noqa: F401 - fixture

pytestmark = CRI_NODE


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_agent(control_plane, containerd, kubelet_root, port: int, log) -> subprocess.Popen:
    argv = [
        sys.executable,
        "-m",
        "agent.cli",
        "run",
        "--node",
        NODE,
        "--store",
        str(containerd.store),
        "--kubelet-root",
        str(kubelet_root),
        "--sign-key",
        str(containerd.sign_key),
        "--kubeconfig",
        str(control_plane.kubeconfig),
        "--metrics-port",
        str(port),
        "--resync",
        "2",
        "--handshake-timeout",
        "300",
    ]
    # the runc of this containerd line comes first on its PATH
    return subprocess.Popen(
        argv,
        cwd=ROOT,
        env=containerd.env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _metric(port: int, name: str) -> float | None:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in body.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def _staging_left(store, ns: str) -> list[str]:
    d = store / ns
    found = [str(p) for p in d.iterdir() if ".staging-" in p.name] if d.is_dir() else []
    return found + [str(j) for j in journals(store)]


def _until_frozen(freezer, agent: subprocess.Popen, logs) -> None:
    """Busy-polls the freezer's file (a few microseconds a read): CRIU holds the freeze only
    while it seizes the tree, milliseconds of a dump that lasts about a second."""
    deadline = time.monotonic() + 120
    while not is_frozen(freezer):
        if agent.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"never saw the source frozen:\n{logs.read_text()[-3000:]}")


@pytest.mark.parametrize("moment", ["quiesce", "dump", "pack"])
async def test_an_agent_killed_mid_checkpoint_recovers_when_it_starts_again(
    control_plane,
    containerd,
    kubelet,  # noqa: F811 - the fixture imported above
    tmp_path,
    moment,
):
    api, sfx = kubelet.api, uuid.uuid4().hex[:6]
    env = {
        "quiesce": [{"name": "COUNTER_QUIESCE_GATE", "value": "/snapshot-control/gate"}],
        "dump": [{"name": "COUNTER_EXTRA_MB", "value": "1024"}],
        "pack": [],
    }[moment]
    pod = api.post(
        f"/api/v1/namespaces/{kubelet.ns}/pods",
        json={
            "metadata": {"name": f"src-{sfx}"},
            "spec": {"containers": [{"name": "main", "image": IMAGE, "env": env}]},
        },
    ).json()
    sandbox, ctr = kubelet.start(pod)
    ip = kubelet.crictl.pod_ip(sandbox)
    if moment == "pack":  # a rootfs diff that takes a while to pack
        kubelet.crictl.run("exec", ctr, "sh", "-c", "head -c 150000000 /dev/urandom > /big")
    before = int(ask(ip, PORT, timeout=30)["count"])
    control = decisions.control_dir(kubelet.root, pod["metadata"]["uid"])
    snap_url = snaps(kubelet.ns)
    pid = RuncContainer(DEFAULT_RUNC_ROOT, ctr, containerd.runc).state()["pid"]
    freezer = freezer_file(pid)
    store, logs = containerd.store, tmp_path / "agent.log"
    port = _free_port()
    # the dump's fault must land while CRIU holds the container frozen (the recovery under
    # test is the thaw); on a loaded machine CRIU may thaw first: then the attempt is
    # recovered as a quiesced one and the fault injected again, three tries as its twin
    tries = 3 if moment == "dump" else 1
    with open(logs, "ab") as log:
        for attempt in range(tries):
            name = f"cut-{sfx}-{attempt}"
            await hand_over(control_plane, api, kubelet.ns, name, f"src-{sfx}")
            ready = conditions(api.get(f"{snap_url}/{name}").json())["Ready"]
            assert ready[1] == "CheckpointPending"
            first = _start_agent(control_plane, containerd, kubelet.root, port, log)
            try:
                if moment == "quiesce":
                    wait_until(
                        lambda: (control / CHECKPOINT_REQUESTED).exists(),
                        [first],
                        "the checkpoint request",
                        logs,
                        timeout=120,
                        poll=0.01,
                    )
                elif moment == "dump":
                    _until_frozen(freezer, first, logs)
                else:
                    wait_until(
                        lambda: any((store / kubelet.ns).glob(".*staging-*/rootfs-diff.tar")),
                        [first],
                        "the rootfs diff being packed",
                        logs,
                        timeout=120,
                        poll=0.002,
                    )
            finally:
                os.killpg(first.pid, signal.SIGKILL)
                first.wait(10)
            # read from the cgroup itself, right after the kill
            frozen_at_kill = moment == "dump" and is_frozen(freezer)
            if moment == "quiesce":  # the workload answers ready now, to nobody
                (control / "gate").touch()

            second = _start_agent(control_plane, containerd, kubelet.root, port, log)
            try:

                def failed(name=name) -> bool:
                    snap = api.get(f"{snap_url}/{name}").json()
                    return conditions(snap).get("Failed", ("",))[0] == "True"

                wait_until(failed, [second], "the PodSnapshot failed", logs, timeout=90)
                assert second.poll() is None, logs.read_text()[-3000:]
                assert _metric(port, "snapshot_agent_recovered_total") == 1.0
                snap = api.get(f"{snap_url}/{name}").json()
                message = next(
                    c["message"] for c in snap["status"]["conditions"] if c["type"] == "Failed"
                )
                assert "the agent restarted during the checkpoint" in message, message
                assert "artifact" not in snap["status"]
                if moment == "dump" and not frozen_at_kill:
                    continue  # the fault missed its window: recovered, injected again
                # killed while CRIU held the freeze, the cgroup stayed frozen: thawed;
                # at the other moments, the workload was only quiesced: resumed
                gave_back = "thawed container" if moment == "dump" else "resumed the quiesced"
                assert gave_back in message, message
                break
            finally:
                os.killpg(second.pid, signal.SIGKILL)
                second.wait(10)
        else:
            pytest.fail(f"the kill never landed while CRIU held the container frozen ({tries})")
    assert int(ask(ip, PORT, timeout=30)["count"]) == before + 1, "the source lost its state"
    assert _staging_left(store, kubelet.ns) == []
    assert not list((store / kubelet.ns).glob(f"cut-{sfx}-*")), "no artifact at its name"
