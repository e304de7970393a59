"""Two `snapshot-controller --leader-elect` processes against the real API server: one
leads; SIGKILL it, and the other takes over within the lease duration and reconciles what
the dead one left (here: a PodSnapshot of a missing pod gets Failed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from devnode import stop_process

pytestmark = pytest.mark.slow
LEASE_S = 3.0
GROUP = "/apis/nvidia.com/v1alpha1"


def holder(c, ns: str, name: str) -> str | None:
    r = c.get(f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}")
    return r.json()["spec"].get("holderIdentity") if r.status_code == 200 else None


def wait_for(cond, timeout: float) -> float:
    t0 = time.monotonic()
    while not (value := cond()):
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.1)
    return value


def test_the_standby_takes_over_from_a_killed_leader(control_plane, tmp_path):
    ns, lease = f"ha-{uuid.uuid4().hex[:5]}", "snapshot-controller"
    procs = {}
    with control_plane.client() as c:
        c.post("/api/v1/namespaces", json={"metadata": {"name": ns}})
        try:
            for who in ("a", "b"):
                log = (tmp_path / f"{who}.log").open("wb")
                procs[who] = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "controller.cli",
                        "--kubeconfig",
                        str(control_plane.kubeconfig),
                        "--leader-elect",
                        "--lease-namespace",
                        ns,
                        "--lease-duration",
                        str(LEASE_S),
                        "--metrics-port",
                        "0",
                        "--resync",
                        "5",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, "POD_NAME": who},
                )
            leader = wait_for(lambda: holder(c, ns, lease), 20)
            standby = "b" if leader == "a" else "a"
            procs[leader].send_signal(signal.SIGKILL)
            procs[leader].wait()
            spec = {"source": {"podRef": {"name": "nope"}, "containers": ["main"]}}
            c.post(
                f"{GROUP}/namespaces/{ns}/podsnapshots",
                json={
                    "apiVersion": "nvidia.com/v1alpha1",
                    "kind": "PodSnapshot",
                    "metadata": {"name": "orphan"},
                    "spec": spec,
                },
            )
            # the standby leads once the dead leader's lease ran out (liveness, with a
            # loaded machine's slack), and only then handles the new object
            wait_for(lambda: holder(c, ns, lease) == standby, LEASE_S * 6)

            def failed():
                snap = c.get(f"{GROUP}/namespaces/{ns}/podsnapshots/orphan").json()
                conds = {x["type"]: x for x in snap.get("status", {}).get("conditions", [])}
                return conds.get("Failed", {}).get("reason") == "InvalidSource"

            wait_for(failed, 10)
        finally:
            for p in procs.values():
                stop_process(p, 5)
