"""``make demo``: cold start vs checkpoint vs restore of a real CPU model on this machine.

It starts the scikit-learn workload (examples/cpu_demo/workload.py) in its own PID and mount
namespace, times its cold start to the first correct answer, checkpoints it through the
engine (handshake, CRIU dump, signed artifact), restores it and times the restore to the
first correct answer. It prints a table, then one JSON line. Everything it started is
removed on the way out, including on failure or Ctrl-C.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

from restore_runtime import sandbox
from restore_runtime.artifact import signing
from restore_runtime.executor import CheckpointRequest, RestoreRequest, checkpoint, restore
from restore_runtime.probe import first_response, parse
from restore_runtime.progress import human

HOST = "127.0.0.1"


def _port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def run(work: Path, pids: list[int]) -> dict:
    port, ctl = _port(), work / "control"
    ctl.mkdir()
    priv, pub = work / "demo.key", work / "demo.pub"
    signing.generate_keypair(priv, pub)

    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "examples.cpu_demo.workload", HOST, str(port)]
    root = Path(__file__).resolve().parents[2]
    pid = sandbox.start(
        cmd, work / "workload.log", env={"SNAPSHOT_CONTROL_DIR": str(ctl)}, cwd=root
    )
    pids.append(pid)
    cold_s, line = first_response(HOST, port, t0, 300)
    reference = parse(line)["digest"]

    t0 = time.monotonic()
    art = checkpoint(
        CheckpointRequest(
            pid=pid,
            output=work / "artifact",
            control_dir=ctl,
            sign_key=signing.load_private_key(priv),
        )
    )
    checkpoint_s = time.monotonic() - t0

    t0 = time.monotonic()
    report = restore(
        RestoreRequest(artifact=art.path, control_dir=ctl, verify_key=signing.load_public_key(pub))
    )
    pids.append(report.pid)
    restore_s, line = first_response(HOST, port, t0, 120)
    ok = parse(line)["digest"] == reference
    return {
        "cold_start_s": round(cold_s, 3),
        "checkpoint_s": round(checkpoint_s, 3),
        "restore_s": round(restore_s, 3),
        "first_response_ok": ok,
        "speedup": round(cold_s / restore_s, 2),
        "artifact_bytes": art.manifest.size_bytes,
        "restore_phases": report.timings,
    }


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="snapshot-demo-"))
    pids: list[int] = []
    try:
        r = run(work, pids)
    except KeyboardInterrupt:
        print("interrupted; cleaning up", file=sys.stderr)
        return 130
    finally:
        for p in pids:
            _kill(p)
        shutil.rmtree(work, ignore_errors=True)
    phases = ", ".join(f"{k} {v:.2f}s" for k, v in r["restore_phases"].items() if k != "total")
    print("Snapshot CPU demo: scikit-learn random forest (digits), engine path")
    print(f"  {'cold start to first answer':34} {r['cold_start_s']:8.2f} s")
    print(f"  {'checkpoint (' + human(r['artifact_bytes']) + ')':34} {r['checkpoint_s']:8.2f} s")
    print(f"  {'restore to first correct answer':34} {r['restore_s']:8.2f} s   ({phases})")
    print(f"  {'speed-up':34} {r['speedup']:8.1f} x")
    print(f"  {'answer identical to the source':34} {r['first_response_ok']!s:>8}")
    keys = ("cold_start_s", "checkpoint_s", "restore_s", "first_response_ok")
    print(json.dumps({k: r[k] for k in keys}))
    return 0 if r["first_response_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
