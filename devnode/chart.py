"""The Helm chart through helm (built by tools/build-kube-tools.sh): rendered for tests, and
installed into devnode's cluster."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import yaml

from devnode import project_image
from devnode.cri import TOOLS_BIN

if TYPE_CHECKING:
    from devnode.cluster import Cluster


class Kubectl(Protocol):
    """A cluster the chart's helpers can ask: devnode's, or a kind cluster."""

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess: ...


HELM = TOOLS_BIN / "helm"
CHART = Path(__file__).resolve().parent.parent / "charts" / "snapshot"
KUBE_VERSION = "1.37.2"  # the API server the tests run (tools/kube/go.mod)


class RenderError(Exception):
    pass


def missing() -> str | None:
    return None if HELM.exists() else f"{HELM} not built (make tools)"


def helm(*args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess:
    """helm, against ``kubeconfig``'s cluster when given."""
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)} if kubeconfig else None
    return subprocess.run([str(HELM), *args], capture_output=True, text=True, env=env)


def render(
    namespace: str = "snapshot-system",
    release: str = "snap",
    set_values: dict | None = None,
    set_strings: dict | None = None,
) -> list[dict]:
    text = render_text(namespace, release, set_values, set_strings)
    return [d for d in yaml.safe_load_all(text) if d]


def render_text(
    namespace: str = "snapshot-system",
    release: str = "snap",
    set_values: dict | None = None,
    set_strings: dict | None = None,
) -> str:
    """``helm template``'s output, as a GitOps tool gets it."""
    args = ["template", release, str(CHART), "-n", namespace, "--kube-version", KUBE_VERSION]
    for k, v in (set_values or {}).items():
        args += ["--set", f"{k}={v}"]
    for k, v in (set_strings or {}).items():  # label values: "true" must stay a string
        args += ["--set-string", f"{k}={v}"]
    p = helm(*args)
    if p.returncode != 0:
        raise RenderError(p.stderr.strip())
    return p.stdout


RELEASE, NAMESPACE = "snapshot", "snapshot-system"


def one_node_values(signer_ip: str, **agent) -> dict:
    """Helm values for a cluster of one node, with no DNS for Services: the node is the
    control plane's too (the chart's defaults keep the control plane off restore nodes), and
    agents reach the signer at the fixed ClusterIP ``signer_ip``. ``agent``: this node's
    paths."""
    return {
        "agent": {**agent, "readyBesideControlPlane": True},
        "signer": {"clusterIP": signer_ip, "affinity": None, "replicas": 1},
        "controller": {"affinity": None},
        "webhook": {"affinity": None},
    }


@dataclass(frozen=True)
class Installed:
    image: str  # the project image the chart runs
    demo_image: str  # the CPU demo's image, for examples/cpu_demo/k8s


def install(c: Cluster, work: Path) -> Installed:
    """The README's install on devnode's cluster: the project and demo images built and pushed
    to the cluster's registry, then ``helm install`` with this node's paths in a values file;
    returns once the agent (and so the shim) is in place."""
    image = project_image.push(c.registry, "snapshot")
    demo = project_image.push(c.registry, "cpu-demo")
    c.check_mounts()  # building the images must not have changed the node's mounts
    repo, tag = image.rsplit(":", 1)
    values = work / "values.yaml"
    values.write_text(
        yaml.safe_dump({**c.chart_values(), "image": {"repository": repo, "tag": tag}})
    )
    install_release(c, values, c.api.kubeconfig)
    return Installed(image, demo)


def install_release(c: Kubectl, values: Path, kubeconfig: Path) -> None:
    """``helm install`` with ``values``; returns once every component's pods are Ready."""
    p = helm(
        "install",
        RELEASE,
        str(CHART),
        "-n",
        NAMESPACE,
        "--create-namespace",
        "-f",
        str(values),
        "--wait",
        "--timeout",
        "5m",
        kubeconfig=kubeconfig,
    )
    if p.returncode != 0:
        raise RuntimeError(f"helm install: {p.stderr.strip()}\n{diagnose(c, NAMESPACE)}")
    # not `rollout status`: with one node and maxUnavailable 1, a DaemonSet whose only pod
    # cannot start counts as rolled out (and so does `helm install --wait`)
    for component in ("signer", "agent", "webhook", "controller"):
        wait_ready(c, f"app.kubernetes.io/component={component}", 180)


def _ready(pod: dict) -> bool:
    conds = pod.get("status", {}).get("conditions", [])
    return any(k["type"] == "Ready" and k["status"] == "True" for k in conds)


def wait_ready(c: Kubectl, selector: str, timeout: float, namespace: str = NAMESPACE) -> None:
    """Until at least one pod matches ``selector`` and every one is Ready; on timeout the
    error carries each pod's state, events and last log lines."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = c.kubectl("-n", namespace, "get", "pods", "-l", selector, "-o", "json", check=False)
        pods = json.loads(out.stdout)["items"] if out.returncode == 0 else []
        if pods and all(_ready(p) for p in pods):
            return
        time.sleep(1)
    raise RuntimeError(
        f"pods {selector} in {namespace} not Ready after {timeout:g}s:\n"
        f"{diagnose(c, namespace, selector)}"
    )


def diagnose(c: Kubectl, namespace: str, selector: str | None = None) -> str:
    """What an operator would look at: each pod's containers' states, its events, and the
    last lines each of its containers logged."""
    sel = ["-l", selector] if selector else []
    out = c.kubectl("-n", namespace, "get", "pods", *sel, "-o", "json", check=False)
    if out.returncode != 0:
        return f"(kubectl get pods: {out.stderr.strip()})"
    parts = []
    for pod in json.loads(out.stdout)["items"]:
        name, status = pod["metadata"]["name"], pod.get("status", {})
        parts.append(f"pod {name}: {status.get('phase')}")
        for cs in status.get("initContainerStatuses", []) + status.get("containerStatuses", []):
            state = next(iter(cs.get("state", {}).items()), ("unknown", {}))
            parts.append(
                f"  container {cs['name']}: {state[0]} {state[1].get('reason', '')} "
                f"{state[1].get('message', '')}".rstrip()
            )
        events = c.kubectl(
            "-n",
            namespace,
            "get",
            "events",
            "--field-selector",
            f"involvedObject.name={name}",
            "--sort-by=.lastTimestamp",
            check=False,
        ).stdout
        parts.append("  events:\n" + "\n".join(f"    {ln}" for ln in events.splitlines()[-10:]))
        logs = c.kubectl(
            "-n", namespace, "logs", name, "--all-containers", "--prefix", "--tail=20", check=False
        )
        tail = (logs.stdout + logs.stderr).splitlines()[-40:]
        parts.append("  logs:\n" + "\n".join(f"    {ln}" for ln in tail))
    return "\n".join(parts) or f"(no pods{' matching ' + selector if selector else ''})"
