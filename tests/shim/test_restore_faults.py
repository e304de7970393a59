"""A shim killed mid-restore leaves nothing behind (shim/process/state_dir.py), through
containerd's CRI, real runc and CRIU, on both containerd lines.

The restore's work directory (its images view, mounted; CRIU's logs) lives in the container's
own state directory, which ``shim delete`` removes: containerd runs that when a shim dies.
The test kills the shim (SIGKILL) at a moment it chooses by watching the node: once the
images view is mounted (CRIU about to run), and once CRIU writes its restore log. Then no
work directory, mount, runc log or restored process of that container is left, and the next
restore of the same artifact works.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from devnode.containerd import admitted
from tests.helpers import ask
from tests.shim.test_cri_restore import PORT, checkpoint_pod_a, start_pod
from tests.shim.test_cri_restore import pytestmark as cri_marks

pytestmark = cri_marks
STATE = Path("/run/containerd/snapshot-shim/k8s.io")


def _shim_pids(pod: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", "--", f"-id {pod} .*serve"], capture_output=True,
                         text=True).stdout  # fmt: skip
    return [int(p) for p in out.split()]


def _mounts_under(path: Path) -> list[str]:
    return [ln.split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines()
            if ln.split()[4].startswith(str(path))]  # fmt: skip


def _processes(pattern: str) -> set[str]:
    out = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True).stdout
    return {ln for ln in out.splitlines() if "pgrep" not in ln}


@pytest.mark.parametrize("moment", ["images staged", "criu running"])
def test_a_shim_killed_mid_restore_leaves_nothing(cri, containerd, tmp_path, moment):
    c, pods = cri
    art, _, _ = checkpoint_pod_a(cri, containerd)
    uid_pods_before = set(pods)
    workloads_before = _processes("counter_server")
    dirs_before = set(STATE.iterdir())

    result: dict = {}
    t = threading.Thread(target=lambda: result.setdefault(
        "start", start_pod(cri, "victim", annotations=admitted(art))))  # fmt: skip
    t.start()
    deadline = time.monotonic() + 60
    pod = ctr = None
    while time.monotonic() < deadline:
        new = set(pods) - uid_pods_before
        pod = next(iter(new), None)
        if pod and (dirs := [d.parent for d in STATE.glob("*/restore")
                             if d.parent not in dirs_before]):  # fmt: skip
            work = dirs[0] / "restore"
            ready = (_mounts_under(work / "images") if moment == "images staged"
                     else (work / "restore.log").exists())  # fmt: skip
            if ready:
                ctr = dirs[0].name
                break
        time.sleep(0.002)
    assert pod and ctr, f"never saw the restore's {moment}"
    for pid in _shim_pids(pod):
        os.kill(pid, signal.SIGKILL)
    t.join(120)
    _, _, r = result["start"]
    assert r.returncode != 0, "the start cannot succeed without its shim"
    c.remove_pod(pod)
    pods.remove(pod)

    deadline = time.monotonic() + 30
    while (left := [*_mounts_under(STATE / ctr), *map(str, STATE.glob(f"*{ctr}*")),
                    *_processes(ctr), *(_processes("counter_server") - workloads_before)]
           ) and time.monotonic() < deadline:  # fmt: skip
        time.sleep(0.1)
    assert left == [], "left behind by the killed restore"

    pod2, _, r = start_pod(cri, "again", annotations=admitted(art))
    assert r.returncode == 0, r.stderr
    assert ask(c.pod_ip(pod2), PORT, timeout=30)["count"] == "4"
