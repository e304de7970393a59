"""Nothing left behind: a demo-sized flow on a node of its own (containerd + CRI + CNI + the
shim: a pod, its checkpoint, a restored pod and a pod that falls back from a tampered
artifact), then devnode's teardown. The machine must be as it was before: no network
namespaces, veths, mounts or processes of that node, no /tmp/snapshot-* left.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

from api.handshake import RESTORE_REPORT
from devnode import workloads
from devnode.containerd import Containerd, admitted
from devnode.cri import Crictl
from tests.conftest import CRI_NODE, VENV_BIN
from tests.helpers import ask, processes

pytestmark = CRI_NODE
PORT = 8080
COUNTER = workloads.command(["tests/workloads/counter_server.py"], PORT)


def machine_state(ignore: set[str]) -> dict[str, list[str]]:
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    netns = Path("/run/netns")
    return {
        "netns": sorted(os.listdir(netns)) if netns.is_dir() else [],
        "veths": sorted(ln.split()[0] for ln in links.splitlines() if ln.startswith("veth")),
        "mounts": sorted(
            m
            for m in mounts
            if m.startswith(("/tmp/snapshot-", "/run/netns/"))
            and not any(m.startswith(i) for i in ignore)
        ),
        "tmp": sorted(str(p) for p in Path("/tmp").glob("snapshot-*") if str(p) not in ignore),
    }


def test_a_demo_sized_flow_leaves_the_machine_as_it_was(containerd, tmp_path):
    # the session's own node (and its pods) lives on: only this node's traces count
    ignore = {str(containerd.base)}
    before = machine_state(ignore)
    base = Path(f"/tmp/snapshot-leak-{uuid.uuid4().hex[:6]}")
    node = Containerd(
        base, subnet="10.233.9.0/24", bridge="snapbr9", bin_dirs=[VENV_BIN], major=containerd.major
    )
    work = tmp_path / "work"
    work.mkdir()
    try:
        node.start()
        cri = Crictl(node.address, work)

        def pod(name: str, annotations: dict | None = None) -> tuple[str, Path, str]:
            ctl = work / f"ctl-{name}"
            ctl.mkdir()
            uid = uuid.uuid4().hex
            sandbox, cfg = cri.run_pod(f"{name}-{uid[:5]}", "snapshot", annotations, uid=uid)
            mounts = (*workloads.mounts(), workloads.control_mount(ctl, uid))
            ctr = cri.create(
                sandbox,
                cfg,
                "main",
                "localhost/snapshot/busybox:1",
                COUNTER,
                mounts,
                env={"SNAPSHOT_CONTROL_DIR": "/snapshot-control"},
            )
            cri.run("start", ctr)
            return sandbox, ctl, ctr

        a, ctl_a, ctr_a = pod("a")
        ask(cri.pod_ip(a), PORT, timeout=30)
        art = node.checkpoint(ctr_a, "warm", control_dir=ctl_a)
        b, ctl_b, _ = pod("b", admitted(art))
        assert ask(cri.pod_ip(b), PORT, timeout=30)["count"] == "2"
        assert json.loads((ctl_b / RESTORE_REPORT).read_text())["outcome"] == "restored"
        bad = node.store / "default" / "tampered"
        shutil.copytree(art.path, bad)
        next((bad / "criu").glob("core-*.img")).write_bytes(b"tampered")
        c, ctl_c, _ = pod("c", admitted(art) | {"snapshot.nvidia.com/artifact": str(bad)})
        assert ask(cri.pod_ip(c), PORT, timeout=30)["count"] == "1"
        assert json.loads((ctl_c / RESTORE_REPORT).read_text())["outcome"] == "fell-back"
        assert machine_state(ignore) != before, "the flow made namespaces, veths, mounts"
    finally:
        node.stop()
    assert processes(str(base)) == []
    assert machine_state(ignore) == before
