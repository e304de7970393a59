"""Control-plane API load at idle: the Kubernetes API requests per minute that the controller
and one node agent make with 10, 100 and 1,000 PodSnapshots in the cluster (all Ready, nothing
to do), against the real kube-apiserver. Both count their own requests (the
``*_api_requests_total`` metrics); a minute is ``60 / interval`` passes at the chart's default
interval, measured over several passes.

    python -m bench.control_plane_load [--counts 10,100,1000] [--passes 5] [--out bench/results]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from agent.run import Agent, AgentConfig
from controller.loop import Controller
from devnode import apiserver
from kubeclient import api as kube

INTERVAL_S = 2.0  # the chart's controller.intervalSeconds and agent.intervalSeconds
NODE = "node-a"
CREATED = "2026-12-03T00:00:00Z"


def ready_status(ns: str, name: str) -> dict:
    return {
        "conditions": [{"type": "Ready", "status": "True", "reason": "Captured", "message": "",
                        "lastTransitionTime": CREATED}],
        "artifact": {"uri": f"file:///var/lib/snapshot/artifacts/{ns}/{name}",
                     "manifestDigest": "sha256:" + "ab" * 32, "sizeBytes": 4096},
        "source": {"nodeName": NODE},
    }  # fmt: skip


def populate(cp: apiserver.ControlPlane, ns: str, count: int, have: int) -> None:
    """PodSnapshots have..count-1, each Ready with its artifact (and the finalizer the
    controller would have added), plus their source pod."""
    snaps = f"/apis/nvidia.com/v1alpha1/namespaces/{ns}/podsnapshots"
    with cp.client() as c:
        for i in range(have, count):
            name = f"snap-{i:04d}"
            spec = {"source": {"podRef": {"name": "src"}, "containers": ["main"]}}
            r = c.post(snaps, json={"apiVersion": "nvidia.com/v1alpha1", "kind": "PodSnapshot",
                                    "metadata": {"name": name,
                                                 "finalizers": ["snapshot.nvidia.com/artifact"]},
                                    "spec": spec})  # fmt: skip
            r.raise_for_status()
            r = c.patch(f"{snaps}/{name}/status", json={"status": ready_status(ns, name)},
                        headers={"Content-Type": "application/merge-patch+json"})  # fmt: skip
            r.raise_for_status()


def per_pass(counter) -> float:
    return sum(s.value for m in counter.collect() for s in m.samples if s.name.endswith("_total"))


async def measure(cp: apiserver.ControlPlane, passes: int) -> tuple[float, float, float]:
    """(controller requests per pass, agent requests per pass, seconds per controller pass)"""
    # two clients, as two processes would have: each counts its own requests
    async with await kube.api_client(str(cp.kubeconfig)) as api, \
            await kube.api_client(str(cp.kubeconfig)) as agent_api:  # fmt: skip
        controller = Controller(api)
        agent = Agent(agent_api, AgentConfig(node=NODE, store=Path("/nonexistent")))
        await controller.reconcile_all()  # warm-up: nothing may remain to do
        await agent.pass_once()
        c0, a0 = per_pass(controller.metrics.api_requests), per_pass(agent.metrics.api_requests)
        t0 = time.monotonic()
        for _ in range(passes):
            await controller.reconcile_all()
        seconds = (time.monotonic() - t0) / passes
        for _ in range(passes):
            await agent.pass_once()
        c1, a1 = per_pass(controller.metrics.api_requests), per_pass(agent.metrics.api_requests)
    return (c1 - c0) / passes, (a1 - a0) / passes, seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--counts", default="10,100,1000")
    p.add_argument("--passes", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    args = p.parse_args(argv)
    counts = [int(c) for c in args.counts.split(",")]
    ctl, agt, pass_s = {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="snapshot-bench-load-") as tmp, \
            apiserver.control_plane(Path(tmp) / "kube") as cp:  # fmt: skip
        cp.install_crds()
        ns = "load"
        with cp.client() as c:
            c.post("/api/v1/namespaces", json={"metadata": {"name": ns}})
            c.post(f"/api/v1/namespaces/{ns}/pods", json={
                "metadata": {"name": "src"}, "spec": {"nodeName": NODE, "containers": [
                    {"name": "main", "image": "registry.local/x:1"}]}})  # fmt: skip
        have = 0
        for n in counts:
            populate(cp, ns, n, have)
            have = n
            c_req, a_req, seconds = asyncio.run(measure(cp, args.passes))
            per_min = 60 / INTERVAL_S
            ctl[str(n)], agt[str(n)] = round(c_req * per_min, 1), round(a_req * per_min, 1)
            pass_s[str(n)] = round(seconds, 3)
            print(f"{n:5d} PodSnapshots: controller {ctl[str(n)]}/min, agent {agt[str(n)]}/min, "
                  f"controller pass {seconds:.3f}s", flush=True)  # fmt: skip
    out = {
        "command": " ".join(["python -m bench.control_plane_load", *(argv or sys.argv[1:])]),
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "mode": f"polling: a full pass every {INTERVAL_S:g}s (before watches)",
        "controller_requests_per_min": ctl,
        "agent_requests_per_min": agt,
        "controller_pass_seconds": pass_s,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "control-plane-load.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
