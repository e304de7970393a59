"""``python -m devnode.sweep`` after a killed run: a real cluster (control plane, registry,
containerd 2.x, kubelet, kube-proxy) with a pod running is SIGKILLed, as an OOM kill or a
closed terminal would end ``make cluster``; the sweep must leave the machine's network
namespaces, veths, mounts, iptables chains, devnode processes and /tmp/snapshot-* as they
were before that run, and must not touch what a live run (this test session) owns."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from devnode import OWNER_ENV
from devnode.containerd import Containerd
from tests.conftest import cluster_marks

ROOT = Path(__file__).resolve().parent.parent

pytestmark = cluster_marks()

#: the killed run: a cluster with one pod (its network namespace, veth, mounts), then it waits
RUN = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from devnode.cluster import cluster
    with cluster(Path(sys.argv[1])) as c:
        c.kubectl("run", "victim", "--image=localhost/snapshot/busybox:1",
                  "--image-pull-policy=Never", "--restart=Never", "--", "sleep", "3600")
        c.kubectl("wait", "--for=condition=Ready", "pod/victim", "--timeout=120s")
        print("READY", flush=True)
        time.sleep(3600)
""")


def chains() -> list[str]:
    out = []
    for family in ("iptables", "ip6tables"):
        for table in ("filter", "nat", "mangle", "raw"):
            dump = subprocess.run([f"{family}-save", "-t", table], capture_output=True, text=True)
            out += [
                f"{family}:{table}:{ln[1:].split()[0]}"
                for ln in dump.stdout.splitlines()
                if ln.startswith(":")
            ]
    return sorted(out)


def orphans() -> list[str]:
    """Processes marked by a devnode run that is gone."""
    found = []
    for p in Path("/proc").iterdir():
        try:
            env = (p / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(f"{OWNER_ENV}=".encode()):
                owner = int(item.split(b"=", 1)[1])
                if not Path(f"/proc/{owner}").exists():
                    found.append((p / "cmdline").read_bytes().replace(b"\0", b" ").decode())
    return found


def machine() -> dict[str, list[str]]:
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    netns = Path("/run/netns")
    mountinfo = Path("/proc/self/mountinfo").read_text()
    return {
        "netns": sorted(os.listdir(netns)) if netns.is_dir() else [],
        "links": sorted(ln.split()[0] for ln in links.splitlines()),
        "mounts": sorted(ln.split()[4] for ln in mountinfo.splitlines()),
        "chains": chains(),
        "processes": orphans(),
        "tmp": sorted(str(p) for p in Path("/tmp").glob("snapshot-*")),
    }


def sweep() -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "devnode.sweep"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.timeout(400)
def test_sweep_after_a_killed_cluster_leaves_the_machine_as_before(tmp_path):
    # a live run's node (this test's): the sweep must keep it
    live = Containerd(
        Path(f"/tmp/snapshot-sweep-{os.getpid()}"), bridge="snapbr8", subnet="10.233.8.0/24"
    )
    try:
        live.start()
        before = machine()
        run = subprocess.Popen(
            [sys.executable, "-c", RUN, str(tmp_path / "run")],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            lines = []
            for line in run.stdout:
                lines.append(line)
                if line.strip() == "READY":
                    break
            else:
                pytest.fail("the cluster run ended before its pod ran:\n" + "".join(lines[-40:]))
        finally:
            run.send_signal(signal.SIGKILL)
            run.wait()
        left = machine()
        for key in ("netns", "links", "mounts", "chains", "processes", "tmp"):
            assert left[key] != before[key], f"the killed run left no {key}: this proves nothing"

        done = sweep()
        assert done.returncode == 0, done.stderr
        assert machine() == before, done.stdout
        assert str(live.base) not in done.stdout
        assert live.proc.poll() is None and live.base.is_dir()
        again = sweep()  # nothing is left for a second one
        assert again.returncode == 0 and "removing" not in again.stdout, again.stdout
    finally:
        live.stop()
    assert not live.base.exists()
