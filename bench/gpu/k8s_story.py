"""Issue 43's story: a GPU Deployment restored through a kubelet, the NVIDIA device plugin and
CDI, timed from ``kubectl apply`` to the first bitwise-identical answer, beside a cold start
of the same pod in the same run; and a tampered artifact falling back to a cold start.

A one-node cluster as ``make cluster`` runs one (devnode/cluster.py: etcd, the control plane,
containerd 2.x with CDI on, a kubelet), the chart installed with helm from the project's image,
and on the GPU machine the device plugin (bench/gpu/k8s_node.py). Per size:

1. a SnapshotJob of the stand-in (bench/gpu/worker.py, ``nvidia.com/gpu: 1``) -> Ready;
2. a Deployment of one replica annotated ``nvidia.com/restore-from`` -> its first answer,
   the agent's condition and Event (the restore's phases);
3. the same Deployment without the annotation (a cold start) -> its first answer; the two
   digests must be equal;
and once, for the first size: a byte flipped in the artifact's largest memory image -> a cold
start under ``fallback``, its reason on the pod, and a correct answer from the GPU.

With one GPU, one replica runs at a time: each Deployment is deleted before the next.

    # the GPU machine (bench/gpu/k8s-run.sh unpacks bench/gpu/k8s-carry.sh's parts first)
    python3 bench/gpu/k8s_story.py --out DIR --image-archive A --image-tag T 1.3b 6.65b
    # here: a CPU dry run of the same steps (the CPU demo, no device plugin)
    .venv/bin/python bench/gpu/k8s_story.py --cpu --out DIR
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import k8s_node  # noqa: E402  (beside this file; it puts the checkout on sys.path)

from api.annotations import RESTORE_FROM  # noqa: E402
from devnode import (  # noqa: E402
    chart,
    condition,
    project_image,
    restored_condition,
    tamper_pages,
    wait_for,
)
from devnode.cluster import NODE, Cluster, cluster  # noqa: E402
from devnode.probe import ask_line, parse  # noqa: E402

NS = "gpu"
SIZES = {  # as bench/gpu/run-sizes.sh; "tiny" checks the path in seconds
    "tiny": ["--layers", "2", "--width", "256", "--heads", "4", "--kv-gb", "0.1"],
    "1.3b": ["--layers", "24", "--width", "2048", "--heads", "16", "--kv-gb", "16"],
    "6.65b": ["--layers", "32", "--width", "4096", "--heads", "32", "--kv-gb", "16"],
}
IMAGE = "snapshot.local/snapshot/snapshot"
#: a container in one of these states will not start by waiting
STUCK = {
    "CreateContainerError",
    "CreateContainerConfigError",
    "RunContainerError",
    "CrashLoopBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
}
DEMO = k8s_node.ROOT / "examples" / "cpu_demo" / "k8s" / "snapshotjob.yaml"


class CpuDemo:
    """The CPU dry run's workload: the CPU demo's container from its example manifest."""

    port = 8080

    def __init__(self, image: str) -> None:
        doc = yaml.safe_load(DEMO.read_text())
        self.spec = doc["spec"]["podTemplate"]["spec"]["containers"][0]
        self.spec.update(image=image, imagePullPolicy="Never")

    def container(self, _image: str) -> dict:
        return self.spec

    def volumes(self) -> list[dict]:
        return []


def layout_archive(name: str, work: Path) -> tuple[Path, str]:
    """devnode's project image ``name`` as an OCI archive (what k8s-carry.sh stages)."""
    layout = work / f"layout-{name}"
    tag = project_image.write_layout(name, layout)
    archive = work / f"{name}.tar"
    subprocess.run(["tar", "-C", str(layout), "-chf", str(archive), "."], check=True)
    return archive, tag


class Story:
    def __init__(self, c: Cluster, workload, image: str) -> None:
        self.c, self.w, self.image = c, workload, image

    def kubectl(self, *args: str, input: str | None = None) -> str:
        return self.c.kubectl("-n", NS, *args, input=input).stdout

    def apply(self, doc: dict) -> float:
        t0 = time.monotonic()
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
        return t0

    def get(self, kind: str, name: str) -> dict | None:
        p = self.c.kubectl("-n", NS, "get", kind, name, "-o", "json", check=False)
        return json.loads(p.stdout) if p.returncode == 0 else None

    def stuck(self, app: str) -> None:
        """A pod of ``app`` that cannot start (unschedulable, its container refused, or
        exited) ends the wait at once, instead of at the SnapshotJob's deadline."""
        for p in self.pods(app):
            if p["metadata"].get("deletionTimestamp"):  # the controller's, after the capture
                continue
            for cond in p["status"].get("conditions") or []:
                if cond["type"] == "PodScheduled" and cond.get("reason") == "Unschedulable":
                    raise RuntimeError(
                        f"pod {p['metadata']['name']}: Unschedulable: {cond.get('message')}\n"
                        f"{self.diagnose()}"
                    )
            for st in p["status"].get("containerStatuses") or []:
                waiting = st["state"].get("waiting") or {}
                if waiting.get("reason") in STUCK or st["state"].get("terminated"):
                    why = waiting.get("message") or st["state"].get("terminated")
                    raise RuntimeError(
                        f"pod {p['metadata']['name']}: {waiting.get('reason')}: {why}\n"
                        f"{self.diagnose()}"
                    )

    def pods(self, app: str) -> list[dict]:
        return json.loads(self.kubectl("get", "pods", "-l", f"app={app}", "-o", "json"))["items"]

    def diagnose(self) -> str:
        return "\n".join(
            [
                chart.diagnose(self.c, NS),
                chart.diagnose(self.c, chart.NAMESPACE, "app.kubernetes.io/component=agent"),
            ]
        )

    def wait(self, what: str, probe, timeout: float, every: float = 0.5):
        return wait_for(what, probe, timeout, every, self.diagnose)

    def template(self, app: str, annotations: dict[str, str] | None = None) -> dict:
        return {
            "metadata": {"labels": {"app": app}, "annotations": annotations or {}},
            "spec": {
                "containers": [self.w.container(self.image)],
                "volumes": self.w.volumes(),
                "terminationGracePeriodSeconds": 5,
            },
        }

    def snapshot(self, name: str) -> dict:
        t0 = self.apply(
            {
                "apiVersion": "nvidia.com/v1alpha1",
                "kind": "SnapshotJob",
                "metadata": {"name": name},
                "spec": {
                    "activeDeadlineSeconds": 900,
                    "podSnapshotTemplate": {"targetContainers": [self.w.container("")["name"]]},
                    "podTemplate": self.template(f"{name}-source"),
                },
            }
        )
        step(f"SnapshotJob {name} applied")

        def outcome():
            """The PodSnapshot once Ready; a failed capture ends the wait at once."""
            snap, job = self.get("podsnapshot", name), self.get("snapshotjob", name)
            self.stuck(f"{name}-source")
            for obj in (snap, job):
                failed = condition(obj, "Failed")
                if failed and failed["status"] == "True":
                    raise RuntimeError(f"{name}: {failed['message']}\n{self.diagnose()}")
            ready = condition(snap, "Ready")
            return snap if ready and ready["status"] == "True" else None

        snap = self.wait(f"PodSnapshot {name} Ready", outcome, 900, 1)
        ready_s = time.monotonic() - t0
        step(f"PodSnapshot {name} Ready after {ready_s:.1f}s")
        # the controller deletes the source pod: with one GPU, the next pod waits for it
        self.wait("the source pod gone", lambda: not self.pods(f"{name}-source"), 120)
        return {"snapshot_ready_s": round(ready_s, 2), "status": snap["status"]}

    def replica(self, name: str, app: str, restore_from: str | None) -> dict:
        """A Deployment of one replica, timed to its first answer; deleted afterwards."""
        annotations = {RESTORE_FROM: restore_from} if restore_from else {}
        t0 = self.apply(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": name},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {"app": app}},
                    "template": self.template(app, annotations),
                },
            }
        )

        def answer():
            self.stuck(app)
            for p in self.pods(app):
                if (ip := p["status"].get("podIP")) and (line := ask_line(ip, self.w.port, 30)):
                    return time.monotonic() - t0, line, p["metadata"]["name"]
            return None

        step(f"Deployment {name} applied")
        first_s, line, pod_name = self.wait(f"{name}'s first answer", answer, 900, 0.02)
        step(f"{name} answered after {first_s:.2f}s")
        out = {"apply_to_answer_s": round(first_s, 2), "digest": parse(line).get("digest", line)}
        if restore_from:
            pod = self.wait(
                f"{name}'s restore report",
                lambda: next((p for p in self.pods(app) if restored_condition(p)), None),
                180,
            )
            out["condition"] = restored_condition(pod)
            events = json.loads(
                self.kubectl(
                    "get", "events", "--field-selector", f"involvedObject.name={pod_name}",
                    "-o", "json",
                )
            )["items"]  # fmt: skip
            out["events"] = [
                {"reason": e["reason"], "message": e["message"]}
                for e in events
                if e.get("source", {}).get("component", "") != "kubelet"
                or e["reason"] in ("Failed", "BackOff")
            ]
        self.kubectl("delete", "deployment", name, "--wait=true", "--timeout=120s")
        self.wait(f"{name}'s pod gone", lambda: not self.pods(app), 120)
        return out

    def tamper(self, snap: dict) -> str:
        """One flipped byte in the largest memory image of the artifact, in the node's store."""
        art = Path(snap["status"]["artifact"]["uri"].removeprefix("file://"))
        return str(tamper_pages(art).relative_to(art))

    def size(self, size: str, fallback: bool, out: dict) -> None:
        """One size's story into ``out``, filled as it goes: an interrupted run keeps the
        steps that finished."""
        name = f"worker-{size.replace('.', '-')}"
        out.update(self.snapshot(name))
        out["restore"] = self.replica(f"{name}-restored", f"{name}-r", restore_from=name)
        out["cold"] = self.replica(f"{name}-cold", f"{name}-c", restore_from=None)
        out["identical"] = out["restore"]["digest"] == out["cold"]["digest"]
        out["cold_over_restore"] = round(
            out["cold"]["apply_to_answer_s"] / out["restore"]["apply_to_answer_s"], 1
        )
        if fallback:
            flipped = self.tamper(out)
            fb = self.replica(f"{name}-tampered", f"{name}-t", restore_from=name)
            fb["flipped"] = flipped
            fb["answer_correct"] = fb["digest"] == out["cold"]["digest"]
            out["fallback"] = fb
        out["status"].pop("conditions", None)


_T0 = time.monotonic()


def step(what: str) -> None:
    """Progress as it happens: a GPU call that runs out of time still says how far it got."""
    print(f"[{time.monotonic() - _T0:6.1f}s] {what}", flush=True)


def node_facts(c: Cluster) -> dict:
    info = json.loads(c.kubectl("get", "node", NODE, "-o", "json").stdout)["status"]
    return {
        "kubelet": info["nodeInfo"]["kubeletVersion"],
        "container_runtime": info["nodeInfo"]["containerRuntimeVersion"],
        "allocatable_gpus": info["allocatable"].get(k8s_node.GPU, "0"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sizes", nargs="*", help=f"of the GPU stand-in: {', '.join(SIZES)}")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--name", default="gpu-k8s-story")
    ap.add_argument("--cpu", action="store_true", help="a dry run: the CPU demo, no GPU")
    ap.add_argument("--image-archive", type=Path, help="the project image (k8s-carry.sh)")
    ap.add_argument("--image-tag")
    args = ap.parse_args()
    if unknown := set(args.sizes) - set(SIZES):
        ap.error(f"unknown sizes {sorted(unknown)}: {', '.join(SIZES)}")
    sizes = ["cpu-demo"] if args.cpu else args.sizes or ["tiny"]
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "nvidia.log"  # nvidia-ctk and the device plugin
    result: dict = {"command": " ".join(sys.argv), "sizes": {}}
    work = Path(tempfile.mkdtemp(prefix="snapshot-gpu-k8s-"))
    # the GPU node's own labels (no GPU feature discovery) and the device plugin's CDI specs
    gpu = {}
    if not args.cpu:
        gpu = {"labels": k8s_node.gpu_labels(), "cdi_dirs": (str(k8s_node.CDI_DIR),)}
    if not args.cpu:
        k8s_node.generate_cdi(log)
    try:
        with (
            cluster(work / "cluster", registry=False, **gpu) as c,
            contextlib.nullcontext() if args.cpu else k8s_node.device_plugin(c, log),
        ):
            step(f"node {NODE} Ready, {k8s_node.allocatable_gpus(c)} GPU(s) allocatable")
            archive, tag = (
                (args.image_archive, args.image_tag)
                if args.image_archive
                else layout_archive("snapshot", work)
            )
            t0 = time.monotonic()
            k8s_node.import_image(c, archive, IMAGE)
            if args.cpu:
                demo, demo_tag = layout_archive("cpu-demo", work)
                k8s_node.import_image(c, demo, "snapshot.local/snapshot/cpu-demo")
                workload = CpuDemo(f"snapshot.local/snapshot/cpu-demo:{demo_tag}")
                image = ""
            else:
                image = k8s_node.worker_image(c, work)
            step("images imported")
            values = work / "values.yaml"
            values.write_text(
                yaml.safe_dump(
                    {
                        **c.chart_values(),
                        "image": {"repository": IMAGE, "tag": tag, "pullPolicy": "Never"},
                    }
                )
            )
            chart.install_release(c, values, c.api.kubeconfig)
            result["images_and_chart_s"] = round(time.monotonic() - t0, 1)
            step("chart installed")
            result["node"] = node_facts(c)
            c.kubectl("create", "namespace", NS)
            for i, size in enumerate(sizes):
                w = workload if args.cpu else k8s_node.Worker(SIZES[size])
                story = Story(c, w, image)
                story.size(size, fallback=i == 0, out=result["sizes"].setdefault(size, {}))
                (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    except BaseException as e:  # an interrupted run (the call's time) says so too
        result["error"] = f"{type(e).__name__}: {e}"[:4000]
        raise
    finally:
        (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
        # the control plane's and kubelet's output, gone with the work directory otherwise
        for f in [work / "cluster" / "cluster.log", *(work / "cluster" / "kube").glob("*.log")]:
            with contextlib.suppress(OSError):
                (args.out / f"node-{f.name}").write_bytes(f.read_bytes()[-8_000_000:])
        subprocess.run(["rm", "-rf", str(work)], check=False)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
