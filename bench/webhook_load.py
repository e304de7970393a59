"""Webhook load: AdmissionReviews for restore pods, posted over TLS on loopback at a fixed
concurrency to `snapshot-webhook` (its own process), which looks up each pod's PodSnapshot
in a real kube-apiserver + etcd. Reports requests/s, p50/p99 latency and errors, measured
in one run on this machine.

    python -m bench.webhook_load [--concurrency 16] [--seconds 20] [--out bench/results]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import ssl
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from devnode import apiserver
from devnode.webhook import webhook_process

NS = "load"
SNAPSHOT = "warm"


def snapshot_status() -> dict:
    return {
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Captured",
                "message": "",
                "lastTransitionTime": "2026-12-03T00:00:00Z",
            }
        ],
        "artifact": {
            "uri": f"file:///var/lib/snapshot/artifacts/{NS}/{SNAPSHOT}",
            "manifestDigest": "sha256:" + "ab" * 32,
            "sizeBytes": 4096,
        },
        "source": {
            "nodeName": "node-a",
            "arch": "x86_64",
            "gpus": [{"uuid": "GPU-1", "product": "NVIDIA H200", "memoryMiB": 143771}],
        },
    }


def review() -> bytes:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"r-{uuid.uuid4().hex[:8]}",
            "namespace": NS,
            "annotations": {"nvidia.com/restore-from": SNAPSHOT},
        },
        "spec": {"containers": [{"name": "main", "image": "registry.local/llm:1"}]},
    }
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": str(uuid.uuid4()),
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE",
                "namespace": NS,
                "object": pod,
                "userInfo": {"username": "bench"},
            },
        }
    ).encode()


async def load(url: str, ca: Path, concurrency: int, seconds: float) -> dict:
    ctx = ssl.create_default_context(cafile=str(ca))
    latencies: list[float] = []
    errors: list[str] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, verify=ctx, limits=limits, timeout=30) as c:
        deadline = time.monotonic() + seconds

        async def worker() -> None:
            while time.monotonic() < deadline:
                body = review()
                t0 = time.monotonic()
                try:
                    r = await c.post(
                        "/mutate", content=body, headers={"Content-Type": "application/json"}
                    )
                    resp = r.json()["response"] if r.status_code == 200 else None
                    ok = resp is not None and resp["allowed"] and resp.get("patch")
                except (httpx.HTTPError, ValueError, KeyError) as e:
                    ok, r = False, e
                latencies.append(time.monotonic() - t0)
                if not ok:
                    errors.append(str(r)[:200])

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.monotonic() - started
    q = statistics.quantiles(latencies, n=100)
    return {
        "requests": len(latencies),
        "requests_per_s": round(len(latencies) / wall, 1),
        "p50_ms": round(q[49] * 1000, 2),
        "p99_ms": round(q[98] * 1000, 2),
        "errors": len(errors),
        "first_errors": errors[:3],
    }


def run(work: Path, concurrency: int, seconds: float) -> dict:
    """A control plane with one Ready PodSnapshot, the webhook, a warm-up, then the load."""
    with apiserver.control_plane(work / "kube") as cp:
        cp.install_crds()
        snaps = f"/apis/nvidia.com/v1alpha1/namespaces/{NS}/podsnapshots"
        with cp.client() as c:
            c.post("/api/v1/namespaces", json={"metadata": {"name": NS}})
            spec = {"source": {"podRef": {"name": "src"}, "containers": ["main"]}}
            c.post(
                snaps,
                json={
                    "apiVersion": "nvidia.com/v1alpha1",
                    "kind": "PodSnapshot",
                    "metadata": {"name": SNAPSHOT},
                    "spec": spec,
                },
            )
            r = c.patch(
                f"{snaps}/{SNAPSHOT}/status",
                json={"status": snapshot_status()},
                headers={"Content-Type": "application/merge-patch+json"},
            )
            r.raise_for_status()
        with webhook_process(work, cp.kubeconfig) as w:
            asyncio.run(load(w.url, w.ca, concurrency, 2.0))  # warm-up
            return asyncio.run(load(w.url, w.ca, concurrency, seconds))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="snapshot-bench-webhook-") as tmp:
        result = run(Path(tmp), args.concurrency, args.seconds)
    out = {
        "command": " ".join(["python -m bench.webhook_load", *(argv or sys.argv[1:])]),
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "concurrency": args.concurrency,
        "seconds": args.seconds,
        "case": "restore pod, PodSnapshot lookup in kube-apiserver, TLS on loopback",
        **result,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "webhook-load.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0 if result["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
