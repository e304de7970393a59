"""CPU benchmark (`make bench`): cold start vs checkpoint vs restore through the real node
stack: a private containerd with the CRI plugin, CNI networking, runc, CRIU and our shim.

For each workload (examples/cpu_demo/workload.py: the digits forest of `make demo`, and a
larger forest trained on a synthetic data set), in one run, RUNS times:
- cold start: a pod under handler snapshot, timed from RunPodSandbox to the first answer;
- checkpoint: the engine through runc (handshake, CRIU dump, pack), time and artifact size;
- restore: a pod with the artifact annotation, which the shim restores, timed the same way to
  the first *correct* answer (the prediction digest equals the source's before checkpoint),
  with the shim's phases (verify, setup, criu, cuda, wake) from its restore report.
Then N = 1, 2, 4 pods restore from one artifact at once.

    python -m bench.cpu [--runs 3] [--out bench/results]

Writes bench/results/bench-cpu.json; bench.report turns every result file into the table and
the plot."""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from api.handshake import RESTORE_REPORT
from devnode.containerd import Containerd, admitted
from devnode.cri import Crictl
from devnode.probe import first_response, parse
from examples.cpu_demo.run import PORT, start_pod
from restore_runtime.executor.checkpoint import CheckpointResult

WORKLOADS = {
    "digits": "random forest, 400 trees (scikit-learn digits)",
    "large": "random forest, 120 trees (synthetic, 60k x 30)",
}
PHASES = ("verify", "setup", "criu", "cuda", "wake")


def spread(xs: list[float]) -> dict:
    return {
        "median": round(statistics.median(xs), 3),
        "min": round(min(xs), 3),
        "max": round(max(xs), 3),
        "runs": [round(x, 3) for x in xs],
    }


class Bench:
    def __init__(self, node: Containerd, work: Path) -> None:
        self.node = node
        self.cri = Crictl(node.address, work)
        self.work = work
        self.pods: list[str] = []

    def control(self) -> Path:
        d = self.work / f"ctl-{uuid.uuid4().hex[:8]}"
        d.mkdir()
        return d

    def pod(self, name: str, control: Path, model: str, annotations: dict | None = None):
        pod, ctr, _ = start_pod(self.cri, name, control, annotations, model)
        self.pods.append(pod)
        return pod, ctr

    def cleanup(self) -> None:
        for p in self.pods:
            self.cri.remove_pod(p)
        self.pods.clear()

    def cold(self, model: str) -> tuple[float, str, str, int, Path]:
        ctl = self.control()
        t0 = time.monotonic()
        pod, ctr = self.pod("cold", ctl, model)
        seconds, line = first_response(self.cri.pod_ip(pod), PORT, t0, 600)
        answer = parse(line)
        return seconds, answer["digest"], ctr, int(answer["weights"]), ctl

    def restore(
        self,
        model: str,
        artifact: CheckpointResult,
        reference: str,
        t0: float | None = None,
        annotations: dict | None = None,
    ):
        """A pod restored from ``artifact`` (``annotations``: the webhook's, when not the
        store path's), timed to its first correct answer."""
        ctl = self.control()
        t0 = time.monotonic() if t0 is None else t0
        pod, _ = self.pod("restore", ctl, model, annotations or admitted(artifact))
        seconds, line = first_response(self.cri.pod_ip(pod), PORT, t0, 300)
        report = json.loads((ctl / RESTORE_REPORT).read_text())
        ok = parse(line)["digest"] == reference and report["outcome"] == "restored"
        return seconds, ok, report

    def workload(self, model: str, runs: int, concurrency: list[int]) -> dict:
        cold, ckpt, size, restore, phases, correct = [], [], [], [], [], []
        weights = 0
        artifact = None
        reference = ""
        for i in range(runs):
            cold_s, reference, ctr, weights, ctl = self.cold(model)
            cold.append(cold_s)
            t0 = time.monotonic()
            res = artifact = self.node.checkpoint(
                ctr, f"{model}-{i}-{uuid.uuid4().hex[:6]}", control_dir=ctl
            )
            ckpt.append(time.monotonic() - t0)
            size.append(res.manifest.size_bytes)
            seconds, ok, report = self.restore(model, artifact, reference)
            restore.append(seconds)
            correct.append(ok)
            phases.append(report["timings"])
            print(
                f"  {model} run {i + 1}: cold {cold_s:.2f}s, checkpoint {ckpt[-1]:.2f}s "
                f"({size[-1] / 1e6:.0f} MB), restore {seconds:.2f}s, correct={ok}",
                flush=True,
            )
            self.cleanup()
        conc = {}
        for n in concurrency:
            start = time.monotonic()
            with cf.ThreadPoolExecutor(n) as pool:
                futures = [
                    pool.submit(self.restore, model, artifact, reference, start) for _ in range(n)
                ]
                got = [f.result() for f in futures]
            times = [g[0] for g in got]
            conc[str(n)] = {"all_correct": all(g[1] for g in got), **spread(times)}
            print(f"  {model} x{n} at once: slowest {max(times):.2f}s", flush=True)
            self.cleanup()
        return {
            "description": WORKLOADS[model],
            "weights_bytes": weights,
            "checkpoint_bytes": int(statistics.median(size)),
            "cold_start_s": spread(cold),
            "checkpoint_s": spread(ckpt),
            "restore_s": spread(restore),
            "restore_phases_median_s": {
                k: round(statistics.median(p.get(k, 0.0) for p in phases), 3) for k in PHASES
            },
            "all_correct": all(correct),
            "speedup": round(statistics.median(cold) / statistics.median(restore), 2),
            "concurrency": conc,
        }


def arguments(doc: str, extra: Callable[[argparse.ArgumentParser], None] | None = None):
    """The CPU benchmarks' common options (runs, workloads, where results go), and
    ``extra``'s; ``doc``: the benchmark's docstring, whose first line describes it."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workload", action="append", choices=list(WORKLOADS))
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    if extra is not None:
        extra(ap)
    return ap.parse_args()


@contextlib.contextmanager
def bench_node(module: str) -> Iterator[tuple[Bench, dict]]:
    """A private containerd with our shim, and the record of this run of
    ``python -m <module>`` (command, machine, start; ``workloads`` to fill). Everything it
    started is stopped and removed afterwards, also on failure."""
    work = Path(tempfile.mkdtemp(prefix="snapshot-bench-"))
    node = Containerd(
        Path(f"/tmp/snapshot-bench-cd-{uuid.uuid4().hex[:6]}"),
        bin_dirs=[str(Path(sys.executable).parent)],
    )
    result = {
        "command": " ".join([f"python -m {module}", *sys.argv[1:]]),
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "kernel": platform.release(),
            "python": platform.python_version(),
        },
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "workloads": {},
    }
    bench = None
    try:
        node.start()
        bench = Bench(node, work)
        yield bench, result
    finally:
        if bench is not None:
            bench.cleanup()
        node.stop()
        shutil.rmtree(work, ignore_errors=True)


def write_result(out: Path, name: str, result: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps(result, indent=2) + "\n")


def main() -> int:
    args = arguments(__doc__, lambda ap: ap.add_argument("--concurrency", default="1,2,4"))
    with bench_node("bench.cpu") as (bench, result):
        for model in args.workload or list(WORKLOADS):
            print(f"{model}: {WORKLOADS[model]}", flush=True)
            conc = [int(n) for n in args.concurrency.split(",") if n]
            result["workloads"][model] = bench.workload(model, args.runs, conc)
    write_result(args.out, "bench-cpu.json", result)
    ok = all(
        w["all_correct"] and all(c["all_correct"] for c in w["concurrency"].values())
        for w in result["workloads"].values()
    )
    print(
        json.dumps(
            {
                m: {k: w[k] for k in ("speedup", "all_correct")}
                for m, w in result["workloads"].items()
            }
        )
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
