"""GPU proof: cold start vs checkpoint vs restore of a torch.compile + CUDA-graph worker,
through ``snapshotctl``, on one machine, in one run. Also times the raw path (``criu
restore`` + CUDA restore/unlock called directly, no verification) in the same run, and
checks that a source checkpointed with --leave-running keeps serving the same output.

    python bench/gpu/proof.py --out DIR [--layers 24 --width 2048 --kv-gb 16]

Results go to DIR/gpu-proof.json. Every response is compared bitwise (sha256 of the logits)
with the source's output before its checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from model_size import gpt_params  # noqa: E402

from api.handshake import RESTORE_COMPLETE, RestoreComplete  # noqa: E402
from devnode.probe import first_response  # noqa: E402
from restore_runtime.criu import options  # noqa: E402

CTL = [sys.executable, "-m", "restore_runtime.cli"]
STARTED: list[int] = []  # workers started here, killed on the way out


def sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(map(str, cmd)), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{cmd[3] if len(cmd) > 3 else cmd}: rc={p.returncode}\n{p.stderr}")
    return p


def kill_tree(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    for _ in range(500):
        if not Path(f"/proc/{pid}").exists():
            break
        time.sleep(0.01)
    time.sleep(1.0)  # let the driver release the GPU memory


def gpu_used_mib() -> str:
    p = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    )
    return p.stdout.strip()


def start_worker(args, port: int, ctl: Path, log: Path) -> int:
    ctl.mkdir(parents=True, exist_ok=True)
    cmd = [
        *CTL,
        "run",
        "--log",
        str(log),
        "--control-dir",
        str(ctl),
        "--",
        sys.executable,
        str(HERE / "worker.py"),
        "--port",
        str(port),
        "--layers",
        str(args.layers),
        "--width",
        str(args.width),
        "--heads",
        str(args.heads),
        "--kv-gb",
        str(args.kv_gb),
    ]
    return int(sh(cmd).stdout.strip())


def raw_fill(art: Path, pid: int) -> int:
    """The memory file into the stopped tree, as the engine's fill phase does (hashing each
    chunk as it goes unless the node's ledger has it, as the shim's: the raw path is ours
    without containerd, runc and the checks around)."""
    from api.manifest import Manifest
    from api.memory import MEMORY_INDEX, MEMORY_PAGES, MemoryIndex
    from api.node import NodeConfig
    from restore_runtime import memfill, procs
    from restore_runtime.fill_ledger import Ledger

    manifest = Manifest.from_json((art / "manifest.json").read_bytes())
    entry = next((f for f in manifest.files if f.path == MEMORY_PAGES), None)
    if entry is None:  # an artifact without a memory file: CRIU restored every page
        return 0
    index = MemoryIndex.from_json((art / MEMORY_INDEX).read_bytes())
    ledger_dir = NodeConfig().fill_ledger_dir  # the shim's, so both find the same marks
    fd = os.open(art / MEMORY_PAGES, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:  # one descriptor for the ledger and the fill, as the engine's restore has
        ledger = (
            Ledger.open(ledger_dir, fd, manifest.file_digest, entry.digests)
            if ledger_dir is not None
            else None
        )
        return memfill.fill(
            fd,
            manifest.chunk_size,
            entry.digests,
            manifest.file_digest,
            index.ranges,
            procs.host_pids_by_ns_pid(pid),
            ledger=ledger,
        ).bytes
    finally:
        os.close(fd)


def raw_restore(art: Path, ctl: Path, work: Path, port: int, expect: str) -> dict:
    """The lab notes' raw path: criu restore (stopped), the memory fill, CUDA restore/unlock,
    nothing else."""
    from cuda.bindings import driver as drv

    from restore_runtime import procs

    (err,) = drv.cuInit(0)
    assert err == drv.CUresult.CUDA_SUCCESS, f"cuInit: {err}"
    shutil.rmtree(work, ignore_errors=True)
    imgs = work / "images"
    imgs.mkdir(parents=True)
    for f in (art / "criu").iterdir():
        (imgs / f.name).symlink_to(f)
    for f in ctl.iterdir():
        f.unlink()
    t0 = time.monotonic()
    o = options.RestoreOptions(
        images_dir=imgs, work_dir=work, pidfile=work / "pid", leave_stopped=True
    )
    subprocess.run([os.environ.get("SNAPSHOT_CRIU", "criu"), *options.restore_args(o)], check=True)
    t_criu = time.monotonic() - t0
    pid = int((work / "pid").read_text())
    filled = raw_fill(art, pid)
    t_fill = time.monotonic() - t0 - t_criu
    procs.continue_tree(pid)
    states = {p: drv.cuCheckpointProcessGetState(p) for p in procs.tree(pid)}
    cuda = [p for p, (e, _) in states.items() if e == drv.CUresult.CUDA_SUCCESS]
    print("raw restore: tree states", states, flush=True)
    for p in cuda:
        (err,) = drv.cuCheckpointProcessRestore(p, None)
        assert err == drv.CUresult.CUDA_SUCCESS, f"restore {p}: {err}"
    for p in cuda:
        (err,) = drv.cuCheckpointProcessUnlock(p, None)
        assert err == drv.CUresult.CUDA_SUCCESS, f"unlock {p}: {err}"
    t_cuda = time.monotonic() - t0 - t_criu - t_fill
    msg = RestoreComplete(pod_ip=None, hostname="raw", restored_at="", timings={})
    (ctl / RESTORE_COMPLETE).write_bytes(msg.to_json())
    t, d = first_response("127.0.0.1", port, t0, 300)
    kill_tree(pid)
    return {
        "criu_s": round(t_criu, 3),
        "fill_s": round(t_fill, 3),
        "fill_bytes": filled,
        "cuda_s": round(t_cuda, 3),
        "first_response_s": round(t, 3),
        "identical": d == expect,
    }


def sparse_copy(art: Path, dst: Path, res: dict) -> Path:
    """The artifact as the engine now checkpoints by default (criu/sparse.py: zero pages of
    private anonymous memory left out), made from the dense one this run checkpointed with
    --keep-zero-pages, so the raw path compares both on one dump."""
    from restore_runtime.criu.sparse import elide_zero_pages

    shutil.copytree(art, dst)
    t0 = time.monotonic()
    r = elide_zero_pages(dst / "criu")
    res["sparse"] = {
        "seconds": round(time.monotonic() - t0, 3),
        "pages": r.pages,
        "dropped_pages": r.dropped,
        "dropped_bytes": r.dropped_bytes,
    }
    return dst


def thp_trial(art: Path, ctl: Path, work: Path, port: int, expect: str) -> dict:
    """The raw path again with transparent huge pages ``always`` (bench/gpu/thp.py)."""
    import thp

    try:
        with thp.always() as before:
            return {"host_setting": before, **raw_restore(art, ctl, work, port, expect)}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def restore_once(art: Path, ctl: Path, port: int, expect: str, pidfile: Path) -> dict:
    for f in ctl.iterdir():
        f.unlink()
    t0 = time.monotonic()
    rep = json.loads(
        sh(
            [
                *CTL,
                "restore",
                str(art),
                "--control-dir",
                str(ctl),
                "--json",
                "--pidfile",
                str(pidfile),
            ]
        ).stdout
    )
    t, d = first_response("127.0.0.1", port, t0, 300)
    pid = int(pidfile.read_text())
    used = gpu_used_mib()
    kill_tree(pid)
    return {
        "first_response_s": round(t, 3),
        "identical": d == expect,
        "phases": rep["timings"],
        "gpu_used_after_restore": used,
    }


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the worker does
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def run(args) -> dict:
    if not port_free(args.port):
        raise RuntimeError(f"port {args.port} is taken: a worker from an earlier run is alive")
    base = Path(args.workdir)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    # The first cold start compiles from nothing: torch.compile's and Triton's caches live in
    # this run's (empty) directory, not in a machine-wide one an earlier run has filled. The
    # --leave-running cold start reuses them: that is the "warm compile cache" column.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(base / "inductor-cache")
    os.environ["TRITON_CACHE_DIR"] = str(base / "triton-cache")
    ctl, art, port = base / "ctl", base / "artifact", args.port
    res: dict = {
        "model": {
            "layers": args.layers,
            "width": args.width,
            "heads": args.heads,
            "kv_gb": args.kv_gb,
            "params": gpt_params(args.layers, args.width),
        }
    }

    t0 = time.monotonic()
    pid = start_worker(args, port, ctl, base / "worker.log")
    STARTED.append(pid)
    cold_s, ref = first_response("127.0.0.1", port, t0, 900)
    res["cold_start_s"] = round(cold_s, 3)
    res["reference_digest"] = ref
    res["gpu_used_before_checkpoint"] = gpu_used_mib()

    dense = ["--keep-zero-pages"] if args.sparse_trial else []
    out = sh(
        [
            *CTL,
            "checkpoint",
            "--pid",
            str(pid),
            "--output",
            str(art),
            "--control-dir",
            str(ctl),
            "--json",
            *dense,
        ]
    )
    ck = json.loads(out.stdout)
    res["checkpoint"] = {
        "phases": ck["timings"],
        "artifact_bytes": ck["sizeBytes"],
        "cuda": ck["cuda"],
    }
    res["gpu_used_after_checkpoint"] = gpu_used_mib()
    res["verify"] = sh([*CTL, "verify", str(art)]).stdout.strip()
    res["restore"] = [restore_once(art, ctl, port, ref, base / "pid") for _ in range(2)]
    try:
        res["raw_restore"] = raw_restore(art, ctl, base / "raw", port, ref)
    except Exception as e:
        res["raw_restore"] = {"error": f"{type(e).__name__}: {e}", "first_response_s": None}
    if args.sparse_trial:
        art = sparse_copy(art, base / "artifact-sparse", res)
        res["raw_restore_sparse"] = raw_restore(art, ctl, base / "raw", port, ref)
    if args.thp_trial:  # on the sparse images when there are
        res["raw_restore_thp_always"] = thp_trial(art, ctl, base / "raw", port, ref)

    if args.leave_running:
        t0 = time.monotonic()
        pid = start_worker(args, port, ctl, base / "worker2.log")
        STARTED.append(pid)
        warm_s, d = first_response("127.0.0.1", port, t0, 900)
        res["cold_start_warm_cache_s"] = round(warm_s, 3)
        res["cold_start_warm_cache_identical"] = d == ref
        art2 = base / "artifact2"
        ck2 = json.loads(
            sh(
                [
                    *CTL,
                    "checkpoint",
                    "--pid",
                    str(pid),
                    "--output",
                    str(art2),
                    "--control-dir",
                    str(ctl),
                    "--leave-running",
                    "--json",
                ]
            ).stdout
        )
        t_after = time.monotonic()
        _, d2 = first_response("127.0.0.1", port, t_after, 60)
        res["leave_running"] = {
            "phases": ck2["timings"],
            "source_still_serving": True,
            "identical": d2 == ref,
        }
        kill_tree(pid)
    r0 = res["restore"][0]["first_response_s"]
    res["summary"] = {
        "restore_vs_cold": round(cold_s / r0, 2),
        "engine_vs_raw": round(r0 / raw, 3)
        if (raw := res["raw_restore"]["first_response_s"])
        else None,
        "all_identical": all(r["identical"] for r in res["restore"])
        and res["raw_restore"].get("identical", True),
    }
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--workdir", default="/dev/shm/snapshot-proof")
    ap.add_argument("--port", type=int, default=18000)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-gb", type=float, default=16.0)
    ap.add_argument("--leave-running", action="store_true")
    ap.add_argument(
        "--thp-trial",
        action="store_true",
        help="the raw path once more with transparent huge pages 'always'",
    )
    ap.add_argument(
        "--sparse-trial",
        action="store_true",
        help="checkpoint with the zero pages; the raw path also without them",
    )
    ap.add_argument("--name", default="gpu-proof")
    args = ap.parse_args()
    res = {
        "command": " ".join(sys.argv),
        "machine": platform.node(),
        "kernel": platform.release(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        res.update(run(args))
        res["ok"] = True
    except Exception as e:  # the partial results are still worth keeping
        res["ok"] = False
        res["error"] = f"{type(e).__name__}: {e}"
    finally:
        for pid in STARTED:
            kill_tree(pid)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"{args.name}.json").write_text(json.dumps(res, indent=2))
    print(json.dumps(res, indent=2))
    sys.exit(0 if res["ok"] else 1)


if __name__ == "__main__":
    main()
