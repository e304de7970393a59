"""``make demo``: the whole node path on this machine, with a real model.

It starts a private containerd 2.x (the line current Kubernetes supports) with the
``snapshot`` runtime (our shim) registered and CNI bridge networking, then through the CRI
API (crictl, as the kubelet would):

1. runs pod A with the scikit-learn workload (examples/cpu_demo/workload.py, a random forest
   trained on the digits data set that ships inside scikit-learn) and times its cold start
   to the first correct answer on its pod IP, from its sandbox's start (as the kubelet
   creates a container in a running sandbox), and with the sandbox counted too;
2. checkpoints pod A's container through the engine (workload handshake, runc + CRIU, a
   signed and verified artifact);
3. runs pod B, annotated with the artifact, under the shim, which restores it; times pod B
   to its first correct answer on its own pod IP and compares the answer with pod A's.

It prints a table and, as its last line, one JSON object. Everything it started is stopped
and removed on the way out, on failure and on Ctrl-C too.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

from api.handshake import RESTORE_REPORT
from devnode import claim, workloads
from devnode.containerd import Containerd, admitted
from devnode.cri import Crictl
from devnode.probe import first_response, parse
from restore_runtime.progress import human
from restore_runtime.timing import phases_text

PORT = 8080
IMAGE = "localhost/snapshot/busybox:1"


def start_pod(
    cri: Crictl, name: str, control: Path, annotations: dict | None = None, model: str = "digits"
) -> tuple[str, str, float]:
    """A pod with the workload (``model``: digits or large) under handler snapshot; with the
    artifact annotation, the shim restores it instead. Returns (pod, container, the
    monotonic time its sandbox was up: where the kubelet starts a container)."""
    uid = uuid.uuid4().hex
    pod, cfg = cri.run_pod(f"{name}-{uid[:5]}", "snapshot", annotations, uid=uid)
    sandbox_up = time.monotonic()
    mounts = (*workloads.mounts(), workloads.control_mount(control, uid))
    command = workloads.command(["-m", "examples.cpu_demo.workload"], PORT, model)
    ctr = cri.create(
        pod, cfg, "model", IMAGE, command, mounts, env={"SNAPSHOT_CONTROL_DIR": "/snapshot-control"}
    )
    cri.run("start", ctr)
    return pod, ctr, sandbox_up


def run(work: Path, node: Containerd) -> dict:
    node.start()
    cri = Crictl(node.address, work)
    ctl_a, ctl_b = work / "control-a", work / "control-b"
    ctl_a.mkdir()
    ctl_b.mkdir()

    t0 = time.monotonic()
    pod_a, ctr_a, up_a = start_pod(cri, "model-a", ctl_a)
    ip_a = cri.pod_ip(pod_a)
    cold_s, line = first_response(ip_a, PORT, up_a, 300)
    reference = parse(line)["digest"]
    cold_pod_s = cold_s + (up_a - t0)

    t0 = time.monotonic()
    art = node.checkpoint(ctr_a, f"model-a-{uuid.uuid4().hex[:6]}", control_dir=ctl_a)
    checkpoint_s = time.monotonic() - t0

    t0 = time.monotonic()
    pod_b, _, up_b = start_pod(cri, "model-b", ctl_b, admitted(art))
    ip_b = cri.pod_ip(pod_b)
    restore_s, line = first_response(ip_b, PORT, up_b, 120)
    restore_pod_s = restore_s + (up_b - t0)
    report = json.loads((ctl_b / RESTORE_REPORT).read_text())
    return {
        "cold_start_s": round(cold_s, 3),
        "checkpoint_s": round(checkpoint_s, 3),
        "restore_s": round(restore_s, 3),
        # with the pod's sandbox (and its CNI) counted in both
        "cold_start_with_sandbox_s": round(cold_pod_s, 3),
        "restore_with_sandbox_s": round(restore_pod_s, 3),
        "first_response_ok": parse(line)["digest"] == reference and report["outcome"] == "restored",
        "speedup": round(cold_s / restore_s, 2),
        "artifact_bytes": art.manifest.size_bytes,
        "pod_ips": [ip_a, ip_b],
        "restore_report": report,
    }


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="snapshot-demo-"))
    claim(work)
    node = Containerd(
        Path(f"/tmp/snapshot-demo-cd-{uuid.uuid4().hex[:6]}"),
        bin_dirs=[str(Path(sys.executable).parent)],
        major=2,
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        r = run(work, node)
    except KeyboardInterrupt:
        print("interrupted; cleaning up", file=sys.stderr)
        return 130
    finally:
        node.stop()
        shutil.rmtree(work, ignore_errors=True)
    rep = r["restore_report"]
    phases = phases_text(rep["timings"])
    print("Snapshot CPU demo: scikit-learn random forest (digits) in a pod, containerd + shim")
    print("  (each container started in its pod's running sandbox, as the kubelet starts it)")
    print(f"  {'pod A cold start to first answer':36} {r['cold_start_s']:8.2f} s")
    print(f"  {'checkpoint (' + human(r['artifact_bytes']) + ')':36} {r['checkpoint_s']:8.2f} s")
    print(f"  {'pod B restore to first correct answer':36} {r['restore_s']:8.2f} s")
    print(f"  {'  shim restore phases':36} {phases}")
    print(f"  {'speed-up':36} {r['speedup']:8.1f} x")
    with_sandbox = r["cold_start_with_sandbox_s"] / r["restore_with_sandbox_s"]
    print(
        f"  {'  with the sandboxes counted':36} {with_sandbox:8.1f} x "
        f"({r['cold_start_with_sandbox_s']:.2f} s / {r['restore_with_sandbox_s']:.2f} s)"
    )
    print(f"  {'pod IPs (A -> B)':36} {r['pod_ips'][0]} -> {r['pod_ips'][1]}")
    print(f"  {'answer identical, report restored':36} {r['first_response_ok']!s:>8}")
    keys = (
        "cold_start_s",
        "checkpoint_s",
        "restore_s",
        "cold_start_with_sandbox_s",
        "restore_with_sandbox_s",
        "first_response_ok",
    )
    print(json.dumps({k: r[k] for k in keys}))
    return 0 if r["first_response_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
