"""The Helm chart through helm (built by tools/build-kube-tools.sh): rendered for tests, and
installed into devnode's cluster."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from devnode import project_image
from devnode.cri import TOOLS_BIN

if TYPE_CHECKING:
    from devnode.cluster import Cluster

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
    args = ["template", release, str(CHART), "-n", namespace, "--kube-version", KUBE_VERSION]
    for k, v in (set_values or {}).items():
        args += ["--set", f"{k}={v}"]
    for k, v in (set_strings or {}).items():  # label values: "true" must stay a string
        args += ["--set-string", f"{k}={v}"]
    p = helm(*args)
    if p.returncode != 0:
        raise RenderError(p.stderr.strip())
    return [d for d in yaml.safe_load_all(p.stdout) if d]


RELEASE, NAMESPACE = "snapshot", "snapshot-system"


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
    repo, tag = image.rsplit(":", 1)
    values = work / "values.yaml"
    values.write_text(yaml.safe_dump({**c.chart_values(),
                                      "image": {"repository": repo, "tag": tag}}))  # fmt: skip
    p = helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace", "-f",
             str(values), "--wait", "--timeout", "5m", kubeconfig=c.api.kubeconfig)  # fmt: skip
    if p.returncode != 0:
        raise RuntimeError(f"helm install: {p.stderr.strip()}")
    c.kubectl("-n", NAMESPACE, "rollout", "status", "daemonset", "--timeout=180s")
    return Installed(image, demo)
