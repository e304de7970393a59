"""A shim killed mid-restore leaves nothing behind (shim/process/state_dir.py), through
containerd's CRI, real runc and CRIU, on both containerd lines.

The restore's work directory (its images view, mounted; CRIU's logs) lives in the container's
own state directory, which ``shim delete`` removes: containerd runs that when a shim dies.
The test kills the shim (SIGKILL) at a moment it chooses by watching the node: once the
images view is mounted (CRIU about to run), once CRIU writes its restore log, and once runc
wrote the restored tree's PID while the shim still verifies its pages (the tree stopped; a
source with 512 MiB of memory makes that take a while). Then no
work directory, mount, runc log, runc state (faults round 2: a runc restore killed before it
wrote its state.json left its directory under the runc root, with runc >= 1.2 the
container's rootfs still mounted at its criu-root) or restored process of that container is
left, and the next restore of the same artifact works.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest

from devnode import workloads
from devnode.containerd import RUNC_ROOT, admitted
from tests.helpers import ask, processes, shim_pids
from tests.shim.test_cri_restore import COUNTER, IMAGE, PORT, start_pod
from tests.shim.test_cri_restore import pytestmark as cri_marks

pytestmark = cri_marks
STATE = Path("/run/containerd/snapshot-shim/k8s.io")


def _mounts_under(path: Path) -> list[str]:
    return [
        ln.split()[4]
        for ln in Path("/proc/self/mountinfo").read_text().splitlines()
        if ln.split()[4].startswith(str(path))
    ]


def _source(cri, containerd):
    """A counter with 512 MiB more memory, asked three times, checkpointed as the agent
    does."""
    c, pods = cri
    pod, cfg = c.run_pod(f"big-{uuid.uuid4().hex[:6]}", "runc")
    pods.append(pod)
    ctr = c.create(
        pod, cfg, "main", IMAGE, COUNTER, tuple(workloads.mounts()), env={"COUNTER_EXTRA_MB": "512"}
    )
    c.run("start", ctr)
    for _ in range(3):
        ask(c.pod_ip(pod), PORT, timeout=30)
    return containerd.checkpoint(ctr, f"snap-{uuid.uuid4().hex[:6]}")


def _at(moment: str, ctr_dir: Path) -> bool:
    work = ctr_dir / "restore"
    if moment == "images staged":
        return bool(_mounts_under(work / "images"))
    if moment == "criu running":
        return (work / "restore.log").exists()
    pidfile = ctr_dir / "init.pid"  # runc restore returned; the shim verifies the pages
    return pidfile.exists() and work.is_dir()


@pytest.mark.parametrize("moment", ["images staged", "criu running", "tree stopped"])
def test_a_shim_killed_mid_restore_leaves_nothing(cri, containerd, tmp_path, moment):
    c, pods = cri
    art = _source(cri, containerd)
    uid_pods_before = set(pods)
    workloads_before = set(processes("counter_server"))
    dirs_before = set(STATE.iterdir())

    result: dict = {}
    t = threading.Thread(
        target=lambda: result.setdefault(
            "start", start_pod(cri, "victim", annotations=admitted(art))
        )
    )
    t.start()
    deadline = time.monotonic() + 60
    pod = ctr = None
    while time.monotonic() < deadline:
        new = set(pods) - uid_pods_before
        pod = next(iter(new), None)
        dirs = [d.parent for d in STATE.glob("*/restore") if d.parent not in dirs_before]
        if pod and dirs and _at(moment, dirs[0]):
            ctr = dirs[0].name
            break
        time.sleep(0.002)
    assert pod and ctr, f"never saw the restore's {moment}"
    for pid in shim_pids(pod):
        os.kill(pid, signal.SIGKILL)
    t.join(120)
    _, _, r = result["start"]
    assert r.returncode != 0, "the start cannot succeed without its shim"
    c.remove_pod(pod)
    pods.remove(pod)

    deadline = time.monotonic() + 30
    while (
        left := [
            *_mounts_under(STATE / ctr),
            *map(str, STATE.glob(f"*{ctr}*")),
            *map(str, RUNC_ROOT.glob(f"{ctr}*")),
            *_mounts_under(RUNC_ROOT / ctr),
            *processes(ctr),
            *(set(processes("counter_server")) - workloads_before),
        ]
    ) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], "left behind by the killed restore"

    pod2, _, r = start_pod(cri, "again", annotations=admitted(art))
    assert r.returncode == 0, r.stderr
    assert ask(c.pod_ip(pod2), PORT, timeout=30)["count"] == "4"
