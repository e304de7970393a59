"""GPU restore through containerd and the shim, on a GPU machine.

bench/gpu/proof.py proves the CUDA path with snapshotctl. This proves it where it runs in
production: a container started by containerd (through `ctr`, with the NVIDIA device nodes)
runs the torch.compile + CUDA-graph worker; the engine checkpoints it through runc; a second
container, annotated with the artifact, is started under runtime io.containerd.snapshot.v2
and the shim restores it (verify -> compat -> runc restore -> CUDA restore + unlock ->
restore-complete). Its first answer must equal the source's, bitwise; then exec and kill must
work on it as on any container.

    timeout -s INT 500 python3 bench/gpu/shim_proof.py --out DIR [--layers 24 --width 2048]

The containers' output goes to DIR/src.log and DIR/dst.log, the results to DIR/NAME.json (also
when interrupted).

Host networking (`ctr run --net-host`): the CRI pod network is covered on CPU by
tests/shim/test_cri_restore.py; here only the GPU part is new.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import fill_bench  # noqa: E402
import pages  # noqa: E402  (bench/gpu, beside this file)
import replicas  # noqa: E402
import sleep_mode  # noqa: E402
import thp  # noqa: E402
from model_size import gpt_params  # noqa: E402

from api.annotations import (  # noqa: E402
    ARTIFACT,
    CONTAINER_TYPE,
    MANIFEST_DIGEST,
    SANDBOX_NAMESPACE,
)
from api.handshake import RESTORE_REPORT  # noqa: E402
from api.node import FILL_THREADS_ENV, NodeConfig  # noqa: E402
from api.runtime import RUNTIME_TYPE  # noqa: E402
from devnode import wait_until, workloads  # noqa: E402
from devnode.containerd import BUSYBOX_IMAGE, RUNC_ROOT, Containerd  # noqa: E402
from devnode.probe import first_response  # noqa: E402
from restore_runtime.cuda.driver import host_libcuda  # noqa: E402

# unique ids: runc state of an interrupted earlier run must not collide
RUN = uuid.uuid4().hex[:6]
#: the Kubernetes namespace the proof plays: the artifact is bound to it
NAMESPACE = "gpu-proof"
SRC, DST = f"src-{RUN}", f"dst-{RUN}"
DEVICES = ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]


def shim_bin(work: Path, fill_threads: int = 0) -> Path:
    """containerd finds runtime io.containerd.snapshot.v2 as containerd-shim-snapshot-v2 on
    its PATH; without an installed package, a wrapper runs the module from this checkout, or
    the node bundle's launcher (with the node's fill-thread setting, as the installer's
    wrapper sets it)."""
    d = work / "bin"
    d.mkdir(parents=True, exist_ok=True)
    w = d / "containerd-shim-snapshot-v2"
    env = f"{FILL_THREADS_ENV}={fill_threads} " if fill_threads else ""
    # the node bundle's launcher (run-sizes.sh BUNDLE=1), as install-node's wrapper runs it
    # (its own CRIU, not the one this machine's checkpoints run: SNAPSHOT_CRIU unset)
    bundle = os.environ.get("SNAPSHOT_BUNDLE")
    shim = f"env -u SNAPSHOT_CRIU {bundle}" if bundle else f"{sys.executable} -m shim"
    w.write_text(f'#!/bin/sh\n{env}exec {shim} "$@"\n')
    w.chmod(0o755)
    return d


def state_digest(line: str) -> str:
    return next(t for t in line.split() if t.startswith("digest="))


def submounts(paths: list[str]) -> list[str]:
    """Every mount point under ``paths`` (the driver's squashfs under /usr/local/nvidia, say),
    parents first. Each is bound on its own: runc declares each bind mount to CRIU as
    external, whereas a submount carried in by an rbind is one CRIU must dump itself, and it
    cannot for an unknown filesystem ("mnt: FS mnt ... unsupported id")."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point != p and point.startswith(p.rstrip("/") + "/") for p in paths):
            out.append(point)
    return sorted(set(out), key=lambda m: (m.count("/"), m))


def libcuda_dir() -> str | None:
    """Where the host's libcuda.so.1 lives: Triton inside a busybox rootfs cannot run
    ``ldconfig -p`` to find it, so TRITON_LIBCUDA_PATH names it."""
    lib = host_libcuda(Path("/"))  # as the engine finds the host's driver
    return str(lib.parent) if lib else None


def run_args(
    ctl: Path, runtime: str, annotations: dict[str, str], log: Path, netns: str | None = None
) -> list[str]:
    # the host's /usr, its Python installation and this checkout, as devnode's workloads
    # (and the virtualenv this runs in, where torch is installed)
    paths = {
        *(m[0] for m in workloads.mounts()),
        sys.prefix,
        *os.environ.get("PYTHONPATH", "").split(":"),
    }
    ro = sorted(paths - {""})
    # the host's compiler (Triton builds its launcher at the first compile) and libcuda
    env = {"SNAPSHOT_CONTROL_DIR": "/snapshot-control", "HOME": "/tmp",
           "PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT)),
           "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}  # fmt: skip
    if cuda := libcuda_dir():
        env["TRITON_LIBCUDA_PATH"] = cuda
    net = ["--with-ns", f"network:{netns}"] if netns else ["--net-host"]
    args = ["run", "-d", *net, "--runtime", runtime, "--log-uri", f"file://{log}",
            "--mount", f"type=bind,src={ctl},dst=/snapshot-control,options=rbind:rw"]  # fmt: skip
    for k, v in env.items():
        args += ["--env", f"{k}={v}"]
    for p in [*ro, *submounts(ro)]:
        args += ["--mount", f"type=bind,src={p},dst={p},options=bind:ro"]
    for d in DEVICES:
        if Path(d).exists():
            args += ["--device", d]
    for k, v in annotations.items():
        args += ["--annotation", f"{k}={v}"]
    return args


def checkpoint(node: Containerd, container: str, ctl: Path,
               quiesce: list[str] | None = None) -> tuple[Path, dict]:  # fmt: skip
    """As the node agent does: into the node's store, signed, bound to a namespace; quiesced
    through the handshake in ``ctl``, or ``quiesce`` (snapshotctl's --quiesce options)."""
    art = node.store / NAMESPACE / f"proof-{uuid.uuid4().hex[:6]}"
    art.parent.mkdir(parents=True, exist_ok=True)
    ck = subprocess.run(
        [sys.executable, "-m", "restore_runtime.cli", "--verbose", "checkpoint",
         "--container", container, "--runc-root", str(RUNC_ROOT), "--output", str(art),
         *(quiesce or ["--control-dir", str(ctl)]), "--sign-key", str(node.sign_key),
         "--namespace", NAMESPACE,
         "--json"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    if ck.returncode != 0:
        raise RuntimeError(f"checkpoint failed: {ck.stderr}")
    out = json.loads(ck.stdout)
    # where the pack phase goes: the engine logs its steps ("  step NAME took 1.234s")
    out["steps"] = {m[1]: float(m[2]) for m in re.finditer(r"step (\S+) took ([\d.]+)s",
                                                          ck.stderr)}  # fmt: skip
    return art, out


def restore_annotations(art: Path, ck: dict) -> dict[str, str]:
    # ctr plays the CRI's part: the namespace annotation, and the webhook's two
    return {ARTIFACT: f"file://{art}", MANIFEST_DIGEST: ck["manifestDigest"],
            SANDBOX_NAMESPACE: NAMESPACE}  # fmt: skip


def stop(node: Containerd, container: str) -> None:
    """SIGKILL a running task and wait until it is seen stopped (a GPU process can take
    seconds to release the device), then delete it."""
    node.ctr("task", "kill", "-s", "KILL", container, check=False, timeout=30)
    for _ in range(60):
        ls = node.ctr("task", "ls", check=False, timeout=30).stdout
        if not any(line.split()[:1] == [container] and "RUNNING" in line
                   for line in ls.splitlines()):  # fmt: skip
            break
        time.sleep(0.5)
    remove(node, container)


#: the CRI's annotation that groups a pod's containers into its sandbox's shim (the shim's
#: bootstrap has the same literal; bench may not import the shim, tests/test_layering.py)
SANDBOX_ID = "io.kubernetes.cri.sandbox-id"


def remove(node: Containerd, container: str) -> None:
    """Kill and delete a container; a hung call is noted, not waited on for ever."""
    for args in (("task", "rm", "-f", container), ("container", "rm", container)):
        try:
            node.ctr(*args, check=False, timeout=60)
        except subprocess.TimeoutExpired:
            print(f"ctr {' '.join(args)}: no answer in 60 s", flush=True)


def _log_time(line: str) -> float:
    """A shim log line's asctime (local time, milliseconds) as a Unix time."""
    stamp, ms = line[:23].split(",")
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(ms) / 1000


def timeline(started: float, answered: float, shim_log: Path, report: dict) -> dict:
    """Where the seconds from ``ctr run`` to the first answer went (Unix times in; the shim's
    log and its report give the points between). A shim already serving a pod's sandbox
    counts from ``ctr run``."""
    serving = next(_log_time(x) for x in shim_log.read_text().splitlines() if " serving " in x)
    serving = max(serving, started)
    done = time.mktime(time.strptime(report["finishedAt"][:19], "%Y-%m-%dT%H:%M:%S"))
    done += float("0." + report["finishedAt"][20:-1]) - time.timezone
    begun = done - report["timings"]["total"]
    return {"ctr_run_to_shim_serving_s": round(serving - started, 3),
            "shim_serving_to_restore_s": round(begun - serving, 3),
            "restore_s": round(done - begun, 3),
            "restore_to_first_answer_s": round(answered - done, 3)}  # fmt: skip


#: /proc/vmstat counters that say where a fill's write time goes: huge pages faulted in or
#: not, direct compaction (a fault that waits for 2 MiB to be made contiguous), page faults
VMSTAT = ("thp_fault_alloc", "thp_fault_fallback", "compact_stall", "compact_fail",
          "pgfault", "pgmajfault", "numa_miss", "numa_foreign")  # fmt: skip


def vmstat() -> dict[str, int]:
    rows = (line.split() for line in Path("/proc/vmstat").read_text().splitlines())
    return {k: int(v) for k, v in rows if k in VMSTAT}


def start_sandbox(node: Containerd, pod: str) -> None:
    """A pod's sandbox under the shim, as the kubelet starts it before the pod's containers
    (the webhook gives the whole pod the runtime): its shim loads the engine meanwhile, and
    a container naming it as its sandbox is served by that same shim."""
    node.ctr("run", "-d", "--net-host", "--runtime", RUNTIME_TYPE,
             "--annotation", f"{CONTAINER_TYPE}=sandbox", "--annotation", f"{SANDBOX_ID}={pod}",
             BUSYBOX_IMAGE, pod, "sleep", "3600")  # fmt: skip

    def loaded() -> bool:
        log = shim_log_of(pod)
        return log is not None and "engine loaded" in log.read_text()

    # 20 s: the kubelet's image pull and pod setup take longer than the engine's load
    wait_until(loaded, what=f"the sandbox {pod}'s shim loading the engine", timeout=20, poll=0.05)


def restore_one(node: Containerd, args, art: Path, ck: dict, dst: str, work: Path,
                worker: list[str], ref: str, pod: str | None = None) -> dict:  # fmt: skip
    """One restore through the shim, timed from ``ctr run`` to the first answer; then exec
    into it, kill and delete it as any container. With ``pod``, the container is created in
    that sandbox's shim, already serving (as on Kubernetes); without, ``ctr run`` starts a
    shim for it (the worst case)."""
    ctl = work / f"ctl-{dst}"
    ctl.mkdir()
    annotations = restore_annotations(art, ck) | ({SANDBOX_ID: pod} if pod else {})
    t0, wall0, counters = time.monotonic(), time.time(), vmstat()
    started = node.ctr(*run_args(ctl, RUNTIME_TYPE, annotations, args.out / f"{dst}.log"),
                       BUSYBOX_IMAGE, dst, *worker, check=False)  # fmt: skip
    restore_s, digest = first_response("127.0.0.1", args.port, t0, 300)
    wall1 = time.time()
    counters = {k: v - counters.get(k, 0) for k, v in vmstat().items()}
    if args.smoke:  # the counter's answer changes with every request; its digest does not
        digest, ref = state_digest(digest), state_digest(ref)
    report = json.loads((ctl / RESTORE_REPORT).read_text())
    one = {"first_response_s": round(restore_s, 3), "identical": digest == ref,
           **worker_times(args.out / f"{dst}.log"),
           "start_rc": started.returncode, "start_stderr": started.stderr[-2000:],
           "report": report, "vmstat": counters}  # fmt: skip
    if log := shim_log_of(pod or dst):
        one["timeline"] = timeline(wall0, wall1, log, report)
    ex = node.ctr("task", "exec", "--exec-id", "probe", dst, "sh", "-c", "echo $((6*7))",
                  check=False)  # fmt: skip
    one["exec_in_restored"] = ex.stdout.strip()
    if log:  # the shim's delete removes its log
        shutil.copy(log, args.out / f"{args.name}-{log.name}")
    node.ctr("task", "kill", "-s", "KILL", dst, check=False)
    time.sleep(2)
    one["task_after_kill"] = node.ctr("task", "ls", check=False).stdout
    one["delete_rc"] = node.ctr("task", "rm", "-f", dst, check=False).returncode
    return one


def worker_times(log: Path) -> dict[str, float]:
    """The worker's own sleep and wake times (``sleep_s=``, ``wake_s=``), from its output."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return {}
    return {m[1]: float(m[2]) for m in re.finditer(r"\b(sleep_s|wake_s)=([\d.]+)", text)}


def shim_log_of(container: str) -> Path | None:
    return next(Path("/run/containerd/snapshot-shim").glob(f"*/shim-{container}.log"), None)


def concurrency(node: Containerd, args, worker: list[str], work: Path) -> dict:
    """N replicas at once from one artifact of a source that had its own network namespace."""
    src, src_ns = f"csrc-{RUN}", f"snap-csrc-{RUN}"
    ns = replicas.netns_add(src_ns)
    ctl = work / "ctl-csrc"
    ctl.mkdir()
    try:
        t0 = time.monotonic()
        node.ctr(*run_args(ctl, "io.containerd.runc.v2", {}, args.out / "csrc.log", ns),
                 BUSYBOX_IMAGE, src, *worker)  # fmt: skip
        cold_s, ref = replicas.answer_in(ns, args.port, t0, args.cold_timeout)
        if args.smoke:  # the counter's answer changes with every request; its digest not
            ref = state_digest(ref)
        art, ck = checkpoint(node, src, ctl)
    finally:
        remove(node, src)
        replicas.netns_del(src_ns)

    def start(c: str, netns: str) -> subprocess.CompletedProcess:
        d = work / f"ctl-{c}"
        d.mkdir()
        run = run_args(d, RUNTIME_TYPE, restore_annotations(art, ck), args.out / f"{c}.log",
                       netns)  # fmt: skip
        return node.ctr(*run, BUSYBOX_IMAGE, c, *worker, check=False, timeout=180)

    def report_of(c: str) -> dict:
        if log := shim_log_of(c):  # kept whatever the round's outcome
            shutil.copy(log, args.out / f"{args.name}-{log.name}")
        try:
            return json.loads((work / f"ctl-{c}" / RESTORE_REPORT).read_text())
        except (OSError, ValueError):
            return {}

    def same(answer: str) -> bool:
        return (state_digest(answer) if args.smoke else answer) == ref

    ledger = NodeConfig().fill_ledger_dir
    assert ledger is not None
    kw = dict(start=start, port=args.port, same=same, report_of=report_of, run=RUN,
              cleanup=lambda c: stop(node, c))  # fmt: skip
    ns = [int(n) for n in args.replicas.split(",")]

    # each round first with the node's fill ledger empty (every chunk hashed, by one replica
    # of those at once), then with it full (every chunk verified by an earlier restore)
    def wipe() -> None:
        shutil.rmtree(ledger, ignore_errors=True)

    rounds = replicas.curve(ns, before=wipe, **kw)
    rounds |= replicas.curve(ns, suffix="-warm", **kw)
    if args.replica_fill_threads:  # fewer fill threads per replica, when many restore at once
        t = args.replica_fill_threads
        shim_bin(work, t)  # read at each shim's start
        many = [n for n in ns if n > 1]
        rounds |= replicas.curve(many, suffix=f"-t{t}", before=wipe, **kw)
        rounds |= replicas.curve(many, suffix=f"-t{t}-warm", **kw)
        shim_bin(work)
    return {"cold_start_s": round(cold_s, 3), "rounds": rounds}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--port", type=int, default=18700)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-gb", type=float, default=16.0)
    ap.add_argument("--name", default="gpu-shim-proof")
    ap.add_argument("--restores", type=int, default=2, help="restores in a row, one at a time")
    ap.add_argument("--replicas", default="", help="then N at once, e.g. 1,2,4")
    ap.add_argument(
        "--replica-fill-threads",
        type=int,
        default=0,
        metavar="N",
        help="then the rounds of more than one replica again, N fill threads each",
    )
    ap.add_argument(
        "--thp-trial",
        action="store_true",
        help="one more restore with transparent huge pages 'always'",
    )
    ap.add_argument("--host-trials", default="",
                    help="then one restore under each host setting, e.g. "
                         "defrag=defer,enabled=never,compact (bench/gpu/thp.py)")  # fmt: skip
    ap.add_argument("--fill-threads", default="0",
                    help="the shim's fill threads for each restore in turn, e.g. 16,8,32 "
                         "(0: its default)")  # fmt: skip
    ap.add_argument(
        "--replay",
        action="store_true",
        help="then the artifact's fill into a fresh process (fill_bench.replay)",
    )
    ap.add_argument(
        "--cold-timeout",
        type=float,
        default=240.0,
        help="seconds to wait for the source's first answer (its output: src.log)",
    )
    ap.add_argument("--quiesce", choices=["handshake", "vllm"], default="handshake",
                    help="vllm: the worker serves vLLM's sleep-mode API on PORT+1, and "
                         "the checkpoint and the shim quiesce and wake it there")  # fmt: skip
    ap.add_argument("--in-pod", type=int, default=0,
                    help="then N restores into a pod's sandbox, its shim already serving "
                         "(as the kubelet creates a pod's containers)")  # fmt: skip
    ap.add_argument("--engines", type=int, default=1,
                    help="the worker as a front process and N CUDA engine processes")  # fmt: skip
    ap.add_argument("--pinned-gb", type=float, default=0.0,
                    help="the worker also holds this much pinned host memory, as an engine's "
                         "sleep mode keeps its weights (a shared mapping)")  # fmt: skip
    ap.add_argument("--sleep", type=sleep_mode.arg, default="",
                    help="the worker's weights in one virtual-memory range, kept on the GPU "
                         "asleep, or moved to pinned or pageable host memory; pageable-N: "
                         "N pinning threads (bench/gpu/sleep.py)")  # fmt: skip
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="run the CPU counter workload instead (checks the plumbing anywhere)",
    )
    args = ap.parse_args()
    fills = [int(n) for n in args.fill_threads.split(",")]
    work = Path(f"/dev/shm/snapshot-shim-proof-{uuid.uuid4().hex[:6]}")
    worker = [sys.executable, str(HERE / "worker.py"), "--port", str(args.port),
              "--layers", str(args.layers), "--width", str(args.width),
              "--heads", str(args.heads), "--kv-gb", str(args.kv_gb),
              "--engines", str(args.engines), "--pinned-gb", str(args.pinned_gb),
              *(["--sleep", args.sleep] if args.sleep else [])]  # fmt: skip
    if args.smoke:
        worker = [sys.executable, str(ROOT / "tests" / "workloads" / "counter_server.py"),
                  "0.0.0.0", str(args.port)]  # fmt: skip
    profile = None
    if args.quiesce == "vllm":
        worker += ["--api-port", str(args.port + 1)]
        profile = ["--quiesce", "vllm", "--quiesce-port", str(args.port + 1)]
    # on tmpfs: overlayfs snapshots work there even when / is itself an overlay
    node = Containerd(Path(f"/dev/shm/snapshot-gpu-{uuid.uuid4().hex[:6]}"),
                      bin_dirs=[str(shim_bin(work))])  # fmt: skip
    model = {"layers": args.layers, "width": args.width, "heads": args.heads,
             "kv_gb": args.kv_gb, "engines": args.engines, "pinned_gb": args.pinned_gb,
             "sleep": args.sleep or "torch allocator",
             "params": args.engines * gpt_params(args.layers, args.width)}  # fmt: skip
    res: dict = {"command": " ".join(sys.argv), "machine": platform.node(), "ok": False,
                 "quiesce": args.quiesce, "shim": os.environ.get("SNAPSHOT_BUNDLE", "checkout"),
                 "model": "counter (CPU smoke run)" if args.smoke else model}  # fmt: skip
    ctl_a = work / "ctl-a"
    args.out.mkdir(parents=True, exist_ok=True)
    ctl_a.mkdir(parents=True)
    dsts: list[str] = []
    try:
        node.start()
        t0 = time.monotonic()
        run_src = run_args(ctl_a, "io.containerd.runc.v2", {}, args.out / "src.log")
        src = node.ctr(*run_src, BUSYBOX_IMAGE, SRC, *worker, check=False)
        if src.returncode != 0:
            raise RuntimeError(f"ctr run src: {src.stderr.strip()}")
        cold_s, ref = first_response("127.0.0.1", args.port, t0, args.cold_timeout)
        res["cold_start_s"] = round(cold_s, 3)

        t0 = time.monotonic()
        art, ck = checkpoint(node, SRC, ctl_a, profile)
        res["checkpoint"] = {
            "seconds": round(time.monotonic() - t0, 3),
            "phases": ck["timings"],
            "steps": ck["steps"],
            "artifact_bytes": ck["sizeBytes"],
            **worker_times(args.out / "src.log"),
        }
        remove(node, SRC)
        try:
            res["pages"] = pages.stats(art / "criu")
        except Exception as e:  # a figure, not the proof
            res["pages"] = {"error": f"{type(e).__name__}: {e}"}

        restores = []
        for i in range(args.restores + args.thp_trial):
            dst = f"{DST}-{i}"
            dsts.append(dst)
            threads = fills[i % len(fills)]
            shim_bin(work, threads)  # read at each shim's start
            if i < args.restores:
                one = restore_one(node, args, art, ck, dst, work, worker, ref)
                restores.append({"fill_threads": threads or "default", **one})
                continue
            try:  # the node tuning: transparent huge pages "always"
                with thp.always() as before:
                    one = restore_one(node, args, art, ck, dst, work, worker, ref)
                res["restore_thp_always"] = {"host_setting": before, **one}
            except Exception as e:  # a trial, not the proof
                res["restore_thp_always"] = {"error": f"{type(e).__name__}: {e}"}
        res["restores"] = restores
        in_pod = []
        for i in range(args.in_pod):
            dst, pod = f"{DST}-p{i}", f"pod-{RUN}-{i}"
            dsts += [dst, pod]  # the container first: its sandbox goes last
            start_sandbox(node, pod)
            in_pod.append(restore_one(node, args, art, ck, dst, work, worker, ref, pod))
            remove(node, dst)
            remove(node, pod)
        if in_pod:
            res["restores_in_pod"] = in_pod
        shim_bin(work)
        for k, spec in enumerate(filter(None, args.host_trials.split(","))):
            dst = f"{DST}-t{k}"
            dsts.append(dst)
            try:  # a trial, not the proof
                with thp.trial(spec) as before:
                    one = restore_one(node, args, art, ck, dst, work, worker, ref)
                res.setdefault("host_trials", {})[spec] = {"before": before, **one}
            except Exception as e:
                res.setdefault("host_trials", {})[spec] = {"error": f"{type(e).__name__}: {e}"}
        if args.replay:
            try:  # a trial, not the proof
                res["replay"] = fill_bench.replay(art)
            except Exception as e:
                res["replay"] = {"error": f"{type(e).__name__}: {e}"}
        first = restores[0]
        res["restore"] = first  # the headline, named as in earlier results
        ok = [r["report"]["outcome"] == "restored" and r["identical"]
              and r["exec_in_restored"] == "42" for r in restores + in_pod]  # fmt: skip
        pages_bytes = res["pages"].get("bytes")
        res["summary"] = {
            "outcome": first["report"]["outcome"],
            "restore_vs_cold": round(cold_s / first["first_response_s"], 2),
            "identical": all(r["identical"] for r in restores),
            "exec_ok": all(r["exec_in_restored"] == "42" for r in restores),
            "in_pod_first_response_s": [r["first_response_s"] for r in in_pod],
            "page_restore_gb_s": [round(pages_bytes / r["report"]["timings"]["criu"] / 1e9, 2)
                                  for r in restores] if pages_bytes else None,
        }  # fmt: skip
        res["ok"] = all(ok)
        if args.replicas:
            try:
                res["concurrency"] = concurrency(node, args, worker, work)
            except Exception as e:  # keep the rest
                res["concurrency"] = {"error": f"{type(e).__name__}: {e}"}
    except Exception as e:  # keep what was measured
        res["error"] = f"{type(e).__name__}: {e}"
    finally:
        for c in (SRC, *dsts):
            remove(node, c)
        for c in dsts:
            if log := shim_log_of(c):
                shutil.copy(log, args.out / f"{args.name}-{log.name}")
        try:
            node.stop()
        except Exception as e:  # the result matters more than a tidy machine
            res.setdefault("error", f"cleanup: {type(e).__name__}: {e}")
        shutil.rmtree(work, ignore_errors=True)
        # written on every way out, a `timeout -s INT` included
        (args.out / f"{args.name}.json").write_text(json.dumps(res, indent=2))
    print(json.dumps(res.get("summary", res), indent=2))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
