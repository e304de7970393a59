"""The restore path's start-up, from ``ctr run`` to the restore's first step, of two checkouts
measured in turn on this machine (they alternate, so drift hits both): the CPU smoke run of
bench/gpu/shim_proof.py, through containerd and each checkout's shim.

    python bench/startup_ab.py --before /path/to/old/checkout --rounds 4 \\
        --out bench/results/shim-startup-cpu.json

A checkout is run with PYTHONPATH set to it (the shim's wrapper runs ``python -m shim``,
which containerd starts with that environment)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POINTS = ("ctr_run_to_shim_serving_s", "shim_serving_to_restore_s")


def one(checkout: Path, out: Path) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    cmd = [
        sys.executable,
        str(checkout / "bench/gpu/shim_proof.py"),
        "--smoke",
        "--out",
        str(out),
        "--name",
        "smoke",
    ]
    subprocess.run(cmd, env=env, cwd=checkout, capture_output=True, timeout=300, check=True)
    res = json.loads((out / "smoke.json").read_text())
    return [r["timeline"] for r in res["restores"]]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--after", type=Path, default=ROOT)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for _ in range(args.rounds):
        for name in ("before", "after"):
            with tempfile.TemporaryDirectory() as d:
                runs[name] += one(getattr(args, name), Path(d))
    summary = {}
    for name, rows in runs.items():
        summary[name] = {p: round(statistics.median(r[p] for r in rows), 3) for p in POINTS}
        summary[name]["to_restore_s"] = round(
            statistics.median(r[POINTS[0]] + r[POINTS[1]] for r in rows), 3
        )
    res = {
        "command": " ".join(sys.argv),
        "machine": os.uname().nodename,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "median": summary,
        "runs": runs,
        "after_vs_before": round(
            summary["after"]["to_restore_s"] / summary["before"]["to_restore_s"], 3
        ),
    }
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(summary, indent=2), res["after_vs_before"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
