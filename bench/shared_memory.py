"""Restoring shared memory (`python -m bench.shared_memory`): a process whose bulk is a
shared anonymous mapping and a memfd (an engine's pinned host buffers are such objects),
checkpointed twice in one run: with the memory file carrying the shared objects (the
default), and with ``--no-split-memory`` (CRIU restores every page itself, on one thread).
Each artifact is restored RUNS times with ``snapshotctl restore`` and a fill ledger (the
first restore hashes every chunk, the later ones trust it, as a node's later restores do);
the result gives both restores' phases, the bytes CRIU and the fill each wrote per second
(first and later restores), and their ratio. Every
restore must answer with the digest the source gave.

    python -m bench.shared_memory [--mib 1024] [--runs 3] [--out bench/results]

Writes bench/results/shared-memory.json. Root and CRIU needed."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.cpu import spread, write_result
from devnode import free_port
from devnode.probe import first_response
from restore_runtime import procs, sandbox

WORKLOAD = Path(__file__).resolve().parent / "workloads" / "shared_memory.py"
ROOT = Path(__file__).resolve().parent.parent


def snapshotctl(*args: str) -> dict:
    p = subprocess.run([sys.executable, "-m", "restore_runtime.cli", *args, "--json"],
                       capture_output=True, text=True, cwd=ROOT, check=False)  # fmt: skip
    if p.returncode:
        raise SystemExit(f"snapshotctl {args[0]} failed: {p.stderr[-2000:]}")
    return json.loads(p.stdout)


def ask(port: int, timeout: float = 60.0) -> str:
    return first_response("127.0.0.1", port, time.monotonic(), timeout)[1]


def artifact(work: Path, mib: int, split: bool) -> tuple[Path, int, str, dict]:
    """The workload started, asked, and checkpointed (ended by its checkpoint)."""
    port, ready = free_port(), work / f"ready-{split}"
    argv = [sys.executable, str(WORKLOAD), str(mib), str(port), str(ready)]
    pid = sandbox.start(argv, work / f"workload-{split}.log")
    while not ready.exists():
        time.sleep(0.05)
    digest = ask(port)
    art = work / ("split" if split else "criu-only")
    extra = [] if split else ["--no-split-memory"]
    made = snapshotctl("checkpoint", "--pid", str(pid), "--output", str(art), *extra)
    return art, port, digest, made["timings"]


def restore(art: Path, port: int, digest: str, work: Path) -> dict:
    """One restore; the node's ledger (a directory of this run's) lets every restore after
    the first trust the chunks the first verified, as a node's later restores do."""
    pidfile, ledger = work / "restored.pid", work / "ledger"
    ledger.mkdir(mode=0o700, exist_ok=True)
    report = snapshotctl("restore", str(art), "--pidfile", str(pidfile),
                         "--fill-ledger-dir", str(ledger))  # fmt: skip
    pid = int(pidfile.read_text())
    try:
        if ask(port) != digest:
            raise SystemExit(f"{art.name}: the restored process answered another digest")
    finally:
        procs.kill_tree(pid, 10.0)
        pidfile.unlink()
    return report["timings"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=1024, help="MiB of each shared object")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args()
    gb = 2 * args.mib * (1 << 20) / 1e9
    result: dict = {"command": " ".join(sys.argv), "machine": f"{platform.node()}, "
                    f"{os.cpu_count()} CPUs", "shared_gb": round(gb, 3)}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-shm-") as tmp:
        work = Path(tmp)
        for split in (True, False):
            art, port, digest, made = artifact(work, args.mib, split)
            runs = [restore(art, port, digest, work) for _ in range(args.runs)]
            key = "memory_file" if split else "criu_only"
            result[key] = {
                "checkpoint_s": made.get("total"),
                "restore_s": spread([r["total"] for r in runs]),
                "criu_s": spread([r["criu"] for r in runs]),
                "fill_s": spread([r.get("fill", 0.0) for r in runs]),
            }
            print(key, json.dumps(result[key]), flush=True)
    mf, co = result["memory_file"], result["criu_only"]
    result["criu_only_gb_s"] = round(gb / co["criu_s"]["median"], 2)
    result["fill_gb_s_hashing"] = round(gb / mf["fill_s"]["runs"][0], 2)
    result["fill_gb_s_ledger"] = round(gb / min(mf["fill_s"]["runs"][1:] or [1e9]), 2)
    result["restore_ratio"] = round(co["restore_s"]["median"] / mf["restore_s"]["median"], 2)
    write_result(args.out, "shared-memory.json", result)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
