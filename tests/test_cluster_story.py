"""The user story through helm and kubectl only, on devnode's cluster (kube-apiserver,
controller-manager, scheduler, kube-proxy, containerd 2.x, kubelet): the README's Kubernetes
walkthrough, command for command.

The chart runs from the project image built without Docker (devnode/project_image.py) and
pushed to the loopback registry; its agent's init container registers runtime ``snapshot``
in this node's containerd 2.x config and restarts containerd. Then:

1. a SnapshotJob of the CPU demo (examples/cpu_demo/k8s) -> a Ready PodSnapshot;
2. its Deployment, two replicas restored by the shim, each answering on its own pod IP;
3. ``kubectl logs`` and ``exec``, the readiness probe, and a killed container restarted cold;
4. a tampered artifact -> a cold start under ``fallback`` with the reason on the pod, and a
   clear failure under ``strict``;
5. deleting the PodSnapshot deletes the artifact; ``helm uninstall`` leaves containerd working.

Between 3 and 4: every component's /metrics, scraped through the API server, carries what
the chart's alerts read, and ``helm upgrade`` keeps the key and the CAs; after 5,
``snapshot-agent uninstall-node`` leaves the node as it was.

Under ``make cluster-smoke`` (SNAPSHOT_WRITE_RESULTS=1) the figures go to
bench/results/cluster-smoke.json, which it then prints."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from api import annotations as ann
from devnode import chart, cluster, project_image, smoke_report, tamper_pages
from devnode.cri import Crictl
from devnode.probe import ask_line, parse
from tests.conftest import cluster_marks
from tests.helpers import (
    ask,
    example_manifest,
    one_replica_named,
    restored_condition,
    shim_pids,
    wait_for,
)

ROOT = Path(__file__).resolve().parent.parent
NS, RELEASE, SYSTEM = "demo", chart.RELEASE, chart.NAMESPACE
PORT = 8080
#: the Deployment's pods (the SnapshotJob's source pod has the same app label)
REPLICAS = "app=cpu-demo,pod-template-hash"


pytestmark = [
    *cluster_marks(),
    pytest.mark.skipif(project_image.missing() is not None, reason=project_image.missing() or ""),
    # the first run on a machine builds the two images' base layers (Debian packages, wheels)
    pytest.mark.timeout(900),
]
figures: dict = {}


class Story:
    def __init__(self, c: cluster.Cluster, demo_image: str):
        self.c, self.demo_image = c, demo_image

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        return self.c.kubectl(*args, input=input, check=check).stdout

    def apply_example(self, name: str, image: str | None = None, **edits) -> None:
        """``kubectl apply -f examples/cpu_demo/k8s/NAME.yaml``, with the demo image pushed
        to this cluster's registry."""
        manifest = example_manifest(name, image or self.demo_image, **edits)
        self.kubectl("-n", NS, "apply", "-f", "-", input=manifest)

    def helm(self, *args: str) -> str:
        p = chart.helm(*args, kubeconfig=self.c.api.kubeconfig)
        assert p.returncode == 0, f"helm {' '.join(args)}: {p.stderr}"
        return p.stdout

    def pod(self, name: str) -> dict:
        return json.loads(self.kubectl("-n", NS, "get", "pod", name, "-o", "json"))

    def pods(self, selector: str) -> list[dict]:
        out = self.kubectl("-n", NS, "get", "pods", "-l", selector, "-o", "json")
        return json.loads(out)["items"]

    def restored(self, pod: dict) -> dict | None:
        return restored_condition(pod)

    def cri(self) -> Crictl:
        return Crictl(self.c.node.address, self.c.node.base)


@pytest.fixture(scope="module")
def story(tmp_path_factory):
    work = tmp_path_factory.mktemp("story")
    with cluster.cluster(work) as c:
        installed = chart.install(c, work)  # the README's helm install, this node's paths
        s = Story(c, installed.demo_image)
        s.kubectl("create", "namespace", NS)
        yield s
        info = json.loads(s.kubectl("get", "node", cluster.NODE, "-o", "json"))["status"]
        figures["kubelet_version"] = info["nodeInfo"]["kubeletVersion"]
        if os.environ.get("SNAPSHOT_WRITE_RESULTS"):  # make cluster-smoke, not make test
            smoke_report.RESULTS.write_text(json.dumps(
                {"command": "make cluster-smoke", **figures}, indent=2) + "\n")  # fmt: skip


def test_1_helm_install_registers_the_runtime_with_containerd2(story):
    info = json.loads(story.cri().run("info").stdout)
    runtimes = info["config"]["containerd"]["runtimes"]
    assert runtimes["snapshot"]["runtimeType"] == "io.containerd.snapshot.v2"
    version = story.cri().run("version").stdout
    figures["containerd_version"] = next(
        line.split()[-1] for line in version.splitlines() if line.startswith("RuntimeVersion")
    )
    assert figures["containerd_version"].lstrip("v").startswith("2.")
    pods = json.loads(story.kubectl("-n", SYSTEM, "get", "pods", "-o", "json"))["items"]
    ready = [p["metadata"]["name"] for p in pods
             if all(c["ready"] for c in p["status"].get("containerStatuses", []))]  # fmt: skip
    assert len(ready) == len(pods) == 6, pods  # webhook x2, controller x2, agent, signer
    # the agent said its node runs restore pods; the RuntimeClass schedules them only there
    labels = json.loads(story.kubectl("get", "node", cluster.NODE, "-o", "json"))["metadata"][
        "labels"]  # fmt: skip
    assert labels.get("snapshot.nvidia.com/ready") == "true", labels
    rc = json.loads(story.kubectl("get", "runtimeclass", "snapshot", "-o", "json"))
    assert rc["scheduling"]["nodeSelector"] == {"snapshot.nvidia.com/ready": "true"}
    # a pod of the class is not scheduled onto a node that is not ready, and is once it is
    story.kubectl("label", "node", cluster.NODE, "snapshot.nvidia.com/ready-")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "waits", "namespace": NS},
           "spec": {"runtimeClassName": "snapshot", "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "c", "image": story.demo_image,
                                    "command": ["sleep", "3600"]}]}}  # fmt: skip
    try:
        story.kubectl("apply", "-f", "-", input=json.dumps(pod))
        why = wait_for("the scheduler's reason", lambda: next((
            c["message"] for c in story.pod("waits")["status"].get("conditions", [])
            if c["type"] == "PodScheduled" and c["status"] == "False"), None), 60)  # fmt: skip
        assert "node affinity/selector" in why, why
    finally:
        story.kubectl("label", "node", cluster.NODE, "snapshot.nvidia.com/ready=true")
    wait_for("scheduled once ready", lambda: story.pod("waits")["spec"].get("nodeName"), 60)
    story.kubectl("-n", NS, "delete", "pod", "waits", "--wait=false")


def test_2_a_snapshotjob_makes_a_ready_podsnapshot(story):
    story.apply_example("snapshotjob")
    # the job makes the PodSnapshot once its source pod is Ready
    for cond in ("create", "condition=Ready"):
        story.kubectl("-n", NS, "wait", f"--for={cond}", "podsnapshot/cpu-demo", "--timeout=300s")
    row = story.kubectl("-n", NS, "get", "podsnap", "cpu-demo", "--no-headers").split()
    assert row[:4] == ["cpu-demo", "True", "Captured", cluster.NODE], row  # Ready, Reason
    assert int(row[4]) > 0, row
    assert row[5] == "handshake", row  # the printer's Quiesce column: the default
    # signed by the signer, for the agent of this node (the node holds no private key)
    log = story.kubectl("-n", SYSTEM, "logs", f"deploy/{RELEASE}-signer")
    assert f"of PodSnapshot {NS}/cpu-demo" in log and f"for node {cluster.NODE}" in log, log


def test_3_deployment_replicas_restore_with_the_source_state(story):
    t0 = time.monotonic()
    story.apply_example("deployment")
    answered: dict[str, tuple[float, dict]] = {}  # pod IP -> (seconds since apply, reply)

    def both_answer() -> bool:
        for p in story.pods(REPLICAS):
            ip = p["status"].get("podIP")
            # short timeouts: a pod IP whose network is not up yet gets no reply at all
            line = ask_line(ip, PORT, timeout=0.3) if ip and ip not in answered else None
            if line:
                answered[ip] = (time.monotonic() - t0, parse(line))
        return len(answered) == 2

    wait_for("both replicas answering", both_answer, 180, 0.02)
    first = sorted(answered.values(), key=lambda a: a[0])
    # SnapshotJob-made artifact -> the first correct answer of a Deployment pod
    figures["restore_s"] = round(first[0][0], 2)
    figures["restore_both_s"] = round(first[1][0], 2)
    story.kubectl("-n", NS, "rollout", "status", "deployment/cpu-demo", "--timeout=120s")
    pods = wait_for("the agent's report on both", lambda: [
        p for p in story.pods(REPLICAS) if story.restored(p)] if all(
        story.restored(p) for p in story.pods(REPLICAS)) else [])  # fmt: skip
    assert {(story.restored(p)["status"], story.restored(p)["reason"]) for p in pods} == {
        ("True", "RestoreSucceeded")}  # fmt: skip
    figures["restored_pods"] = len(pods)
    story.digest = first[0][1]["digest"]
    assert first[0][1]["digest"] == first[1][1]["digest"]  # the same model in both
    for p in pods:
        name, ip = p["metadata"]["name"], p["status"]["podIP"]
        # the restored process itself: it resumed (no training: no "model ready"), learned
        # its own pod IP, and runc wrote nothing into its log
        log = story.kubectl("-n", NS, "logs", name)
        assert f"resumed mode=restored podIP={ip}" in log and "model ready" not in log, log
        assert "WARNING" not in log, log
        describe = story.kubectl("-n", NS, "describe", "pod", name)
        assert "RestoreSucceeded" in describe and "criu" in describe, describe
    # the shims serving them run from the node bundle the image installed, through its loader
    prefix = Path(story.c.chart_values()["agent"]["shimPrefix"])
    loader = str(prefix / os.readlink(prefix / "current") / "lib" / "ld-linux")
    for p in pods:
        sandbox = story.cri().run("pods", "-q", "--name", p["metadata"]["name"]).stdout.split()
        pids = shim_pids(sandbox[0])
        assert pids and all(os.readlink(f"/proc/{pid}/exe").startswith(loader)
                            for pid in pids), (pids, loader)  # fmt: skip


def test_3b_helm_upgrade_keeps_the_key_and_an_earlier_artifact_still_restores(story):
    """Operations issue: the chart rendered the signing key and the CAs (a GitOps sync, or a
    helm template, made new ones). Now the components keep them in Secrets of their own: a
    helm upgrade that restarts every component leaves the key, the CAs and the webhook's
    caBundle as they were, and a replica started after it restores the artifact made before."""

    def kept() -> tuple[str, str, str]:
        secret = json.loads(story.kubectl("-n", SYSTEM, "get", "secret",
                                          f"{RELEASE}-signing", "-o", "json"))  # fmt: skip
        cm = json.loads(story.kubectl("-n", SYSTEM, "get", "configmap", f"{RELEASE}-signer-ca",
                                      "-o", "json"))  # fmt: skip
        mwc = json.loads(story.kubectl("get", "mutatingwebhookconfiguration",
                                       f"{RELEASE}-webhook", "-o", "json"))  # fmt: skip
        return (secret["data"]["private.pem"], cm["data"]["ca.crt"],
                mwc["webhooks"][0]["clientConfig"]["caBundle"])  # fmt: skip

    before = kept()
    story.helm("upgrade", RELEASE, str(chart.CHART), "-n", SYSTEM, "--reuse-values",
               "--set", "webhook.timeoutSeconds=9", "--wait", "--timeout", "5m")  # fmt: skip
    for kind in ("deployment/" + f"{RELEASE}-{c}" for c in ("signer", "webhook", "controller")):
        story.kubectl("-n", SYSTEM, "rollout", "restart", kind)
        story.kubectl("-n", SYSTEM, "rollout", "status", kind, "--timeout=180s")
    assert kept() == before
    story.kubectl("-n", NS, "scale", "deployment/cpu-demo", "--replicas=3")
    story.kubectl("-n", NS, "rollout", "status", "deployment/cpu-demo", "--timeout=180s")
    pods = wait_for("the agent's report on the third replica", lambda: [
        p for p in story.pods(REPLICAS) if story.restored(p)] if len(
        [p for p in story.pods(REPLICAS) if story.restored(p)]) == 3 else [])  # fmt: skip
    assert {story.restored(p)["reason"] for p in pods} == {"RestoreSucceeded"}
    story.kubectl("-n", NS, "scale", "deployment/cpu-demo", "--replicas=2")
    wait_for("the third replica gone", lambda: len(story.pods(REPLICAS)) == 2, 120)


def test_3c_every_component_exports_what_the_alerts_read(story):
    """Operations issue: the alerts' expressions checked against the metrics the running
    components serve (scraped through the API server's pod proxy, as Prometheus would reach
    them), after a restore was reported."""
    from tests.chart.test_alerts import alert_reads, families, unknown

    ports = {"agent": "9400", "controller": "9401", "webhook": "https:8443",
             "signer": "https:8443"}  # fmt: skip
    scraped: dict[str, set[str]] = {}
    for component, port in ports.items():
        pods = json.loads(story.kubectl("-n", SYSTEM, "get", "pods", "-l",
                                        f"app.kubernetes.io/component={component}",
                                        "-o", "json"))["items"]  # fmt: skip
        name = pods[0]["metadata"]["name"]
        scheme, _, number = port.rpartition(":")
        target = f"{scheme}:{name}:{number}" if scheme else f"{name}:{number}"
        text = story.kubectl(
            "get", "--raw", f"/api/v1/namespaces/{SYSTEM}/pods/{target}/proxy/metrics"
        )
        found = families(text)
        assert any(n.startswith(f"snapshot_{component}_") for n in found), (component, text)
        for metric, labels in found.items():
            scraped.setdefault(metric, set()).update(labels)
    assert "snapshot_agent_restore_seconds_bucket" in scraped, "the restores were timed"
    objs = chart.render(set_values={"metrics.prometheusRule": "true"})
    assert unknown(alert_reads(objs), scraped) == []


def test_4_exec_probe_and_a_killed_container_restarts_cold(story):
    p = story.pods(REPLICAS)[0]
    name, ip = p["metadata"]["name"], p["status"]["podIP"]
    assert story.kubectl("-n", NS, "exec", name, "--", "echo", "alive").strip() == "alive"
    assert all(c["ready"] for c in p["status"]["containerStatuses"])  # the readiness probe
    cid = p["status"]["containerStatuses"][0]["containerID"].split("://")[1]
    pid = json.loads(story.cri().run("inspect", cid).stdout)["info"]["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(
        "the kubelet's restart",
        lambda: (
            story.pod(name)["status"]["containerStatuses"][0]["restartCount"] == 1
            and story.pod(name)["status"]["containerStatuses"][0]["ready"]
        ),
        180,
    )
    log = story.kubectl("-n", NS, "logs", name)
    assert "model ready" in log, log  # trained again: a cold start
    assert ask(ip, PORT, timeout=30)["digest"] == story.digest


def test_5_a_tampered_artifact_cold_starts_under_fallback_and_fails_under_strict(story):
    art = json.loads(story.kubectl("-n", NS, "get", "podsnap", "cpu-demo", "-o", "json"))[
        "status"]["artifact"]["uri"].removeprefix("file://")  # fmt: skip
    pages = tamper_pages(Path(art))  # one flipped byte in the largest memory image

    story.apply_example("deployment", **one_replica_named("tampered"))
    pod = wait_for(
        "the fallback report",
        lambda: next((p for p in story.pods("app=tampered") if story.restored(p)), None),
        180,
    )
    cond = story.restored(pod)
    assert (cond["status"], cond["reason"]) == ("False", "FellBackToColdStart"), cond
    assert f"{pages.relative_to(art)}: blake3 mismatch" in cond["message"], cond  # readable
    assert "FellBackToColdStart" in story.kubectl("-n", NS, "describe", "pod",
                                                  pod["metadata"]["name"])  # fmt: skip
    ip = story.pod(pod["metadata"]["name"])["status"]["podIP"]
    assert ask(ip, PORT, timeout=120)["digest"] == story.digest  # cold, and correct
    figures["fallback_ok"] = True

    policy = {ann.RESTORE_FROM: "cpu-demo", ann.RESTORE_POLICY: "strict"}
    story.apply_example(
        "deployment",
        **one_replica_named("strict", **{"spec.template.metadata.annotations": policy}),
    )
    pod = wait_for(
        "the strict failure",
        lambda: next((p for p in story.pods("app=strict") if story.restored(p)), None),
        180,
    )
    cond = story.restored(pod)
    assert (cond["status"], cond["reason"]) == ("False", "RestoreFailed"), cond
    status = story.pod(pod["metadata"]["name"])["status"]
    assert not any(c["ready"] for c in status["containerStatuses"])  # never cold-started
    assert "model ready" not in story.kubectl("-n", NS, "logs", pod["metadata"]["name"],
                                              check=False)  # fmt: skip


def test_6_deleting_the_podsnapshot_deletes_the_artifact_and_uninstall_keeps_containerd(story):
    art = Path(json.loads(story.kubectl("-n", NS, "get", "podsnap", "cpu-demo", "-o", "json"))[
        "status"]["artifact"]["uri"].removeprefix("file://"))  # fmt: skip
    assert art.exists()
    story.kubectl("-n", NS, "delete", "podsnapshot", "cpu-demo", "--timeout=120s")
    wait_for("the artifact's removal", lambda: not art.exists(), 60)

    story.helm("uninstall", RELEASE, "-n", SYSTEM, "--wait", "--timeout", "3m")
    # the chart's pre-delete hook took the readiness label off the node first
    labels = json.loads(story.kubectl("get", "node", cluster.NODE, "-o", "json"))["metadata"][
        "labels"]  # fmt: skip
    assert "snapshot.nvidia.com/ready" not in labels, labels
    # what the chart's installer put on the node comes off with uninstall-node (the docs'
    # last step), which restarts containerd
    values = story.c.chart_values()["agent"]
    config = Path(values["containerdConfig"])
    assert "runtime handler 'snapshot'" in config.read_text()
    p = subprocess.run([sys.executable, "-m", "agent.cli", "uninstall-node", "--host-root=/",
                        f"--prefix={values['shimPrefix']}", f"--bin-dir={values['shimBinDir']}",
                        f"--containerd-config={config}",
                        # the chart's command, from the host (not a container's /host)
                        f"--restart-command=kill $(cat {story.c.node.base}/containerd.pid)"],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "containerd restarted" in p.stdout, p.stdout
    assert "snapshot" not in json.loads(story.cri().run("info").stdout)["config"]["containerd"][
        "runtimes"]  # fmt: skip
    assert not Path(values["shimPrefix"]).exists()
    # the node's containerd still runs pods (under runc: the RuntimeClass went with the chart)
    story.apply_example(
        "deployment", **one_replica_named("plain", **{"spec.template.metadata.annotations": {}})
    )
    story.kubectl("-n", NS, "rollout", "status", "deployment/plain", "--timeout=180s")
    assert story.cri().run("version").returncode == 0
