"""Shim overheads against containerd's runc shim, measured in one run on this machine:
memory (RSS) of the shim process per pod, and the start latency of a pod (RunPodSandbox +
CreateContainer + StartContainer through crictl) under each runtime handler.

    python -m bench.shim_overhead [--pods 5] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from devnode.containerd import Containerd
from devnode.cri import Crictl

IMAGE = "localhost/snapshot/busybox:1"


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def shim_pid(sandbox: str) -> int:
    out = subprocess.run(["pgrep", "-f", "--", f"-id {sandbox}"], capture_output=True, text=True)
    pids = [int(p) for p in out.stdout.split()]
    # one match each (the start process of ours has exited): take the oldest
    return min(pids) if pids else 0


def measure(cri: Crictl, handler: str, pods: int) -> dict:
    starts, rss = [], []
    made = []
    for _ in range(pods):
        t0 = time.monotonic()
        pod, cfg = cri.run_pod(f"ovh-{handler}-{uuid.uuid4().hex[:5]}", handler)
        ctr = cri.create(pod, cfg, "main", IMAGE, ["sleep", "1000"])
        cri.run("start", ctr)
        starts.append(time.monotonic() - t0)
        made.append(pod)
        time.sleep(0.3)
        rss.append(rss_kib(shim_pid(pod)))
    for p in made:
        cri.remove_pod(p)
    return {
        "start_s_median": round(statistics.median(starts), 3),
        "start_s_all": [round(s, 3) for s in starts],
        "shim_rss_mib_median": round(statistics.median(rss) / 1024, 1),
        "shim_rss_mib_all": [round(r / 1024, 1) for r in rss],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pods", type=int, default=5)
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    node = Containerd(
        Path(f"/tmp/snapshot-ovh-{uuid.uuid4().hex[:6]}"),
        bin_dirs=[str(Path(sys.executable).parent)],
    )
    try:
        node.start()
        cri = Crictl(node.address, node.base)
        res = {h: measure(cri, h, args.pods) for h in ("runc", "snapshot", "runc", "snapshot")}
    finally:
        node.stop()
    res = {"runc": res["runc"], "snapshot": res["snapshot"]}  # second, warm round of each
    res["start_latency_added_s"] = round(
        res["snapshot"]["start_s_median"] - res["runc"]["start_s_median"], 3
    )
    res["command"] = " ".join(["python -m bench.shim_overhead", *sys.argv[1:]])
    res["machine"] = f"{platform.node()} {platform.machine()} {platform.release()}"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "shim-overhead.json").write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
