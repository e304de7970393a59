"""The kind smoke, for real: what a platform team's CI runs before the chart reaches a GPU
cluster. A private Docker daemon (devnode/docker.py), a kind node image built on this
machine with nothing pulled (devnode/kind_node.py; cached after the first run), a kind
cluster of one node, our two images loaded with ``kind load image-archive``, the chart
installed with helm, and then the cluster story's core:

1. the agent registers the runtime in the node's containerd 2.x and marks the node ready;
2. a SnapshotJob of the CPU demo -> a Ready PodSnapshot;
3. a Deployment of two replicas, both restored, each answering on its own pod IP;
4. a tampered artifact -> a cold start under ``fallback``, with the reason on the pod;
5. every container of those pods (pause, restored, cold-started) in its pod's systemd slice,
   as the kubelet's systemd cgroup driver meant, and the kubelet's pod stats not zero;
6. the cluster deleted: no container, Docker network, iptables chain, link or mount more
   or fewer on the host than before.

Under ``make kind-smoke`` (SNAPSHOT_WRITE_RESULTS=1) the figures go to
bench/results/kind-smoke.json."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import pytest

from devnode import chart, docker, kind, kind_node, project_image
from devnode.probe import parse
from tests.helpers import example_manifest, one_replica_named, restored_condition, wait_for

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "kind-smoke.json"
NS, PORT = "demo", 8080
REPLICAS = "app=cpu-demo,pod-template-hash"

pytestmark = [
    pytest.mark.kind,
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.skipif(docker.missing() is not None, reason=docker.missing() or ""),
    pytest.mark.skipif(kind_node.missing() is not None, reason=kind_node.missing() or ""),
    pytest.mark.skipif(project_image.missing() is not None, reason=project_image.missing() or ""),
    pytest.mark.skipif(chart.missing() is not None, reason=chart.missing() or ""),
    # the first run on a machine builds the node image (minutes)
    pytest.mark.timeout(1500),
]
figures: dict = {"command": "make kind-smoke"}


class Smoke:
    def __init__(self, stack: contextlib.ExitStack, work: Path) -> None:
        self.stack, self.work = stack, work
        self.before = docker.Census.take()
        self.d = stack.enter_context(docker.daemon())
        self.names = {w: self.d.names(w) for w in ("containers", "networks")}
        image = kind_node.ensure(self.d)
        figures["node_image"] = {
            "ref": image.ref,
            "kubernetes": image.kubernetes,
            "built_s": image.built_s,
            "cached": image.built_s is None,
        }
        t0 = time.monotonic()
        self.c = stack.enter_context(kind.cluster(self.d, image, work))
        figures["create_cluster_s"] = round(time.monotonic() - t0, 1)
        t0 = time.monotonic()
        self.c.install_chart(self.c.load("snapshot", work), work)
        self.demo = self.c.load("cpu-demo", work)
        figures["load_and_install_s"] = round(time.monotonic() - t0, 1)
        self.kubectl("create", "namespace", NS)

    def kubectl(self, *args: str, input: str | None = None) -> str:
        return self.c.kubectl(*args, input=input).stdout

    def apply_example(self, name: str, **edits) -> None:
        self.kubectl("-n", NS, "apply", "-f", "-", input=example_manifest(name, self.demo, **edits))

    def pods(self, selector: str) -> list[dict]:
        return json.loads(self.kubectl("-n", NS, "get", "pods", "-l", selector, "-o", "json"))[
            "items"
        ]

    def diagnose(self) -> str:
        """The demo pods' states, events and logs, and the agent's last lines."""
        return "\n".join(
            [
                chart.diagnose(self.c, NS),
                chart.diagnose(self.c, chart.NAMESPACE, "app.kubernetes.io/component=agent"),
            ]
        )

    def answer(self, ip: str) -> dict | None:
        line = self.c.ask(ip, PORT)
        return parse(line) if line else None


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    with contextlib.ExitStack() as stack:
        yield Smoke(stack, tmp_path_factory.mktemp("kind"))


def test_1_the_agent_makes_the_kind_node_ready(smoke):
    node = json.loads(smoke.kubectl("get", "node", kind.NODE, "-o", "json"))
    assert node["metadata"]["labels"].get("snapshot.nvidia.com/ready") == "true", node["metadata"]
    info = json.loads(smoke.c.on_node("crictl info"))
    runtimes = info["config"]["containerd"]["runtimes"]
    assert runtimes["snapshot"]["runtimeType"] == "io.containerd.snapshot.v2", runtimes
    figures["kubelet_version"] = node["status"]["nodeInfo"]["kubeletVersion"]
    figures["container_runtime"] = node["status"]["nodeInfo"]["containerRuntimeVersion"]
    assert figures["container_runtime"].startswith("containerd://2."), figures


def test_2_a_snapshotjob_makes_a_ready_podsnapshot(smoke):
    t0 = time.monotonic()
    smoke.apply_example("snapshotjob")
    for cond in ("create", "condition=Ready"):
        smoke.kubectl("-n", NS, "wait", f"--for={cond}", "podsnapshot/cpu-demo", "--timeout=300s")
    figures["snapshot_ready_s"] = round(time.monotonic() - t0, 1)
    row = smoke.kubectl("-n", NS, "get", "podsnap", "cpu-demo", "--no-headers").split()
    assert row[:4] == ["cpu-demo", "True", "Captured", kind.NODE], row


def test_3_two_replicas_restore_on_their_own_pod_ips(smoke):
    t0 = time.monotonic()
    smoke.apply_example("deployment")
    answered: dict[str, tuple[float, dict]] = {}

    def both_answer() -> bool:
        for p in smoke.pods(REPLICAS):
            ip = p["status"].get("podIP")
            if ip and ip not in answered and (reply := smoke.answer(ip)):
                answered[ip] = (time.monotonic() - t0, reply)
        return len(answered) == 2

    wait_for("both replicas answering", both_answer, 300, 0.1, smoke.diagnose)
    first = sorted(answered.values(), key=lambda a: a[0])
    figures["restore_first_answer_s"] = round(first[0][0], 2)
    pods = wait_for(
        "the agent's report on both",
        lambda: (ps := smoke.pods(REPLICAS)) and all(restored_condition(p) for p in ps) and ps,
        180,
    )
    conds = {(restored_condition(p)["status"], restored_condition(p)["reason"]) for p in pods}
    assert conds == {("True", "RestoreSucceeded")}, conds
    assert len({p["status"]["podIP"] for p in pods}) == 2
    assert first[0][1]["digest"] == first[1][1]["digest"]
    smoke.digest = first[0][1]["digest"]
    for p in pods:
        log = smoke.kubectl("-n", NS, "logs", p["metadata"]["name"])
        assert f"resumed mode=restored podIP={p['status']['podIP']}" in log, log
        assert "model ready" not in log, log  # not trained again: restored
    figures["restored_pods"] = len(pods)


def test_4_a_tampered_artifact_cold_starts_under_fallback(smoke):
    podsnap = json.loads(smoke.kubectl("-n", NS, "get", "podsnap", "cpu-demo", "-o", "json"))
    art = podsnap["status"]["artifact"]["uri"].removeprefix("file://")
    # one flipped byte in the largest memory image, on the node that keeps the artifact
    pages = smoke.c.on_node(f"""set -e
f=$(find {art} -name 'pages-*.img' -printf '%s %p\\n' | sort -n | tail -1 | cut -d' ' -f2)
b=$(dd if="$f" bs=1 skip=4096 count=1 2>/dev/null | od -An -tu1 | tr -d ' ')
printf "$(printf '\\\\%03o' $((b ^ 255)))" | dd of="$f" bs=1 seek=4096 conv=notrunc 2>/dev/null
echo "$f" """).strip()
    smoke.apply_example("deployment", **one_replica_named("tampered"))
    pod = wait_for(
        "the fallback report",
        lambda: next((p for p in smoke.pods("app=tampered") if restored_condition(p)), None),
        180,
        why=smoke.diagnose,
    )
    cond = restored_condition(pod)
    assert (cond["status"], cond["reason"]) == ("False", "FellBackToColdStart"), cond
    assert f"{Path(pages).relative_to(art)}: blake3 mismatch" in cond["message"], cond
    ip = pod["status"]["podIP"]
    reply = wait_for("the cold start's answer", lambda: smoke.answer(ip), 180, 1, smoke.diagnose)
    assert reply["digest"] == smoke.digest  # cold, and correct
    figures["fallback_ok"] = True
    figures["fallback_reason"] = cond["message"]


def test_5_every_snapshot_pod_sits_in_its_own_pod_cgroup(smoke):
    """The kind node's kubelet uses the systemd cgroup driver: each container of RuntimeClass
    ``snapshot`` must run in a scope under its pod's slice (not under containerd's own
    service, where a cgroupfs reading of ``slice:prefix:name`` puts it), so that the pod's
    accounting, limits and eviction see it."""
    pods = smoke.pods(REPLICAS) + smoke.pods("app=tampered")
    assert len(pods) == 3 and all(p["spec"]["runtimeClassName"] == "snapshot" for p in pods)
    # runc reading "slice:prefix:name" as a cgroupfs path makes a directory of that name
    stray = smoke.c.on_node("find /sys/fs/cgroup -name '*:cri-containerd:*' -type d").split()
    assert stray == [], f"{len(stray)} cgroups outside their pod's, such as {stray[:3]}"
    placed = {}
    for p in pods:
        name, uid = p["metadata"]["name"], p["metadata"]["uid"].replace("-", "_")
        # each container's scope under the pod's slice, holding its processes
        scopes = smoke.c.on_node(
            f"for d in $(find /sys/fs/cgroup -type d -name '*pod{uid}.slice'"
            " -exec find {} -name 'cri-containerd-*.scope' \\;); do"
            ' grep -q . "$d/cgroup.procs" && echo "$d"; done; true'
        ).split()
        assert len(scopes) >= 2, f"{name}: pause and its container in the pod slice: {scopes}"
        placed[name] = {"scopes": len(scopes)}

    def pod_memory() -> dict | None:
        """The kubelet's pod-level working set of each pod, once none is zero (its stats
        of a new pod cgroup come with cAdvisor's next housekeeping, seconds later)."""
        raw = smoke.kubectl("get", "--raw", f"/api/v1/nodes/{kind.NODE}/proxy/stats/summary")
        stats = {s["podRef"]["name"]: s for s in json.loads(raw)["pods"]}
        got = {n: stats.get(n, {}).get("memory", {}).get("workingSetBytes", 0) for n in placed}
        return got if all(got.values()) else None

    memory = wait_for("non-zero pod-level memory in the kubelet's stats", pod_memory, 120, 2)
    for name, working_set in memory.items():
        placed[name]["working_set_bytes"] = working_set
    figures["pod_cgroups"] = placed


def test_6_deleting_the_cluster_leaves_the_host_as_it_was(smoke):
    kind.delete(smoke.c)
    names = {w: smoke.d.names(w) for w in smoke.names}
    left = {w: sorted(names[w] ^ smoke.names[w]) for w in names}
    smoke.stack.close()  # the private daemon stops, and its mounts go
    after = docker.Census.take()
    figures["host_before"] = {
        **smoke.before.counts(),
        **{w: len(n) for w, n in smoke.names.items()},
    }
    figures["host_after"] = {**after.counts(), **{w: len(n) for w, n in names.items()}}
    assert left == {"containers": [], "networks": []}, left
    assert smoke.before.diff(after) == {}, smoke.before.diff(after)
    if os.environ.get("SNAPSHOT_WRITE_RESULTS"):
        RESULTS.write_text(json.dumps(figures, indent=2) + "\n")
