"""The NVIDIA container toolkit's way in: containerd's runc shim runs a runc-compatible
wrapper named by ``BinaryName`` (nvidia-container-runtime on GPU Operator nodes). Our runtime
type is not runc's, so containerd hands it no runc options; the node's setting
(``SNAPSHOT_RUNTIME_BINARY``, install-node's ``--runtime-binary``, the chart's
``agent.runtimeBinary``) names it instead. Here a wrapper that logs each call and then
execs runc is named, on a containerd of each line of its own, and the calls for a cold
start, an exec and a restore all go through it (the toolkit itself cannot run here: it
needs a GPU and its driver)."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest

from api.handshake import RESTORE_REPORT
from devnode.containerd import Containerd, admitted
from devnode.cri import Crictl
from tests.conftest import CONTAINERD2_PROBLEM, CONTAINERD_PROBLEM, CRI_NODE, VENV_BIN
from tests.helpers import ask
from tests.shim.test_cri_restore import PORT, start_pod

pytestmark = CRI_NODE
NETS = {1: ("snapbr5", "10.233.5.0/24"), 2: ("snapbr6", "10.233.6.0/24")}


@pytest.fixture(params=[1, 2], ids=["containerd1.7", "containerd2"])
def node(request, tmp_path):
    if CONTAINERD_PROBLEM or (request.param == 2 and CONTAINERD2_PROBLEM):
        pytest.skip(CONTAINERD_PROBLEM or CONTAINERD2_PROBLEM)
    log = tmp_path / "calls.log"
    wrapper = tmp_path / "logging-runtime"
    bridge, subnet = NETS[request.param]
    base = Path(f"/tmp/snapshot-rb-{uuid.uuid4().hex[:6]}")
    c = Containerd(
        base,
        bin_dirs=[VENV_BIN],
        major=request.param,
        bridge=bridge,
        subnet=subnet,
        node_settings={"runtime_binary": str(wrapper)},
    )
    runc = shutil.which("runc", path=c.env()["PATH"])
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec {runc} "$@"\n')
    wrapper.chmod(0o755)
    c.start()
    cri = Crictl(c.address, tmp_path)
    pods: list[str] = []
    try:
        yield c, cri, pods, log
    finally:
        for p in pods:
            cri.remove_pod(p)
        c.stop()
        shutil.rmtree(base, ignore_errors=True)


def calls(log: Path) -> list[str]:
    """The runc subcommand of each call the wrapper saw (after runc's global flags)."""
    out = []
    for line in log.read_text().splitlines():
        args = line.split()
        skip = {"--root", "--log", "--log-format"}
        i = 0
        while i < len(args) and args[i].startswith("--"):
            i += 2 if args[i] in skip else 1
        out.append(args[i] if i < len(args) else "")
    return out


def test_create_start_exec_and_restore_go_through_the_named_runtime(node, tmp_path):
    c, cri, pods, log = node

    def start(name: str, annotations=None, control=None):
        pod, ctr, r = start_pod((cri, pods), name, annotations=annotations, control=control)
        assert r.returncode == 0, r.stderr
        return pod, ctr

    pod_a, ctr_a = start("src")
    for _ in range(2):
        before = ask(cri.pod_ip(pod_a), PORT, timeout=30)
    assert cri.run("exec", ctr_a, "true", check=False).returncode == 0
    seen = calls(log)
    assert {"create", "start", "exec"} <= set(seen), seen

    art = c.checkpoint(ctr_a, f"snap-{uuid.uuid4().hex[:6]}")  # the agent's runc, as on a node
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    pod_b, _ = start("dst", annotations=admitted(art), control=ctl)
    after = ask(cri.pod_ip(pod_b), PORT, timeout=30)
    assert after["count"] == str(int(before["count"]) + 1), "restored, not cold-started"
    assert json.loads((ctl / RESTORE_REPORT).read_text())["outcome"] == "restored"
    assert "restore" in calls(log), calls(log)
