"""Hashing the page images during the dump (`python -m bench.checkpoint_follow`): a process
holding MiB of private memory (random, not zero) is checkpointed, left running, with the
page files' chunks hashed as CRIU writes them (artifact/follow.py, the default) and without,
alternated RUNS times in one run; the result gives both checkpoints' phases (the CRIU dump,
the pack whose hashing the follower takes over) and the ratio of their medians. Each
artifact is verified before it is removed.

    python -m bench.checkpoint_follow [--mib 1536] [--runs 4] [--out bench/results]

Writes bench/results/checkpoint-follow.json. Root and CRIU needed."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.cpu import spread, write_result
from restore_runtime import procs, sandbox
from restore_runtime.artifact.verify import verify
from restore_runtime.executor.checkpoint import CheckpointRequest, checkpoint

HOLDER = """
import os, sys, time
block = os.urandom(1 << 20)
pieces = [bytearray(block * 64) for _ in range(int(sys.argv[1]) // 64)]
open(sys.argv[2], "w").write("ready")
time.sleep(3600)
"""


def once(pid: int, work: Path, follow: bool) -> dict:
    art = work / f"art-{follow}-{time.monotonic_ns()}"
    try:
        made = checkpoint(
            CheckpointRequest(pid=pid, output=art, leave_running=True, follow_pages=follow)
        )
        if problems := verify(art)[1]:
            raise SystemExit(f"the artifact does not verify: {problems[:3]}")
        return made.manifest.timings or {}
    finally:
        shutil.rmtree(art, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=1536, help="MiB of private memory to dump")
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args()
    result: dict = {"command": " ".join(sys.argv), "machine": f"{platform.node()}, "
                    f"{os.cpu_count()} CPUs", "mib": args.mib}  # fmt: skip
    runs: dict[bool, list[dict]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="bench-follow-", dir="/var/tmp") as tmp:
        work = Path(tmp)
        (work / "holder.py").write_text(HOLDER)
        ready = work / "ready"
        argv = [sys.executable, str(work / "holder.py"), str(args.mib), str(ready)]
        pid = sandbox.start(argv, work / "holder.log")
        try:
            while not ready.exists():
                time.sleep(0.05)
            for _ in range(args.runs):
                for follow in (True, False):
                    runs[follow].append(once(pid, work, follow))
                    print("follow" if follow else "after", json.dumps(runs[follow][-1]))
        finally:
            procs.kill_tree(pid, 10.0)
    for follow, key in ((True, "hashed_during_dump"), (False, "hashed_after_dump")):
        result[key] = {
            phase: spread([r.get(phase, 0.0) for r in runs[follow]])
            for phase in ("total", "criu", "pack")
        }
    during, after = result["hashed_during_dump"], result["hashed_after_dump"]
    result["checkpoint_ratio"] = round(
        after["total"]["median"] / during["total"]["median"], 2
    )  # > 1: hashing during the dump is faster
    write_result(args.out, "checkpoint-follow.json", result)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
