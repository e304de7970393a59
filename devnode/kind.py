"""A kind cluster of one node from the locally built node image (devnode/kind_node.py), the
project's images loaded as a user loads them (``kind load image-archive``), and the chart
installed with helm: what a platform team's CI smoke test does before a chart reaches a GPU
cluster.

    with docker.daemon() as d, kind.cluster(d, kind_node.ensure(d), work) as c:
        c.kubectl("get", "nodes")

Leaving the block deletes the cluster and the network kind made."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import chart, project_image
from .cri import TOOLS_BIN
from .docker import Docker
from .kind_node import POD_SUBNET, NodeImage, kind_binary

NAME = "snapshot-smoke"
NODE = f"{NAME}-control-plane"
#: the signer's Service address: the cluster has no DNS (kubeadm's CoreDNS addon is skipped,
#: its image is not built), so agents reach the signer at a fixed ClusterIP, as on devnode's
SIGNER_IP = "10.96.0.50"
#: where a project image is named inside the node (never pulled: pullPolicy Never)
REGISTRY = "snapshot.local"


def config(image: NodeImage) -> dict:
    """kind's cluster configuration: the local node image, the image's bridge CNI instead of
    kindnet, no DNS addon, and a kubelet that runs on cgroup v1 hosts (Kubernetes 1.35 and
    later refuse v1 unless told). The cgroup driver stays kind's (systemd, kubeadm's default),
    which devnode's cluster (cgroupfs) does not cover."""
    return {
        "kind": "Cluster",
        "apiVersion": "kind.x-k8s.io/v1alpha4",
        "networking": {"disableDefaultCNI": True, "podSubnet": POD_SUBNET},
        "nodes": [{"role": "control-plane", "image": image.ref}],
        "kubeadmConfigPatches": [
            yaml.safe_dump({"kind": "KubeletConfiguration", "failCgroupV1": False}),
            # kind skips preflight there itself: a patch replaces the whole list
            yaml.safe_dump(
                {"kind": "InitConfiguration", "skipPhases": ["preflight", "addon/coredns"]}
            ),
        ],
    }


@dataclass
class KindCluster:
    docker: Docker
    kubeconfig: Path
    name: str = NAME

    def kind(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        p = subprocess.run(
            [str(kind_binary()), *args],
            env=self.docker.env,
            text=True,
            capture_output=True,
            timeout=timeout,
        )
        if p.returncode:
            raise RuntimeError(f"kind {' '.join(args)}: {p.stderr.strip()[-3000:]}")
        return p

    def kubectl(self, *args: str, input: str | None = None, check: bool = True):
        p = subprocess.run(
            [str(TOOLS_BIN / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
        )
        if check and p.returncode:
            raise RuntimeError(f"kubectl {' '.join(args)}: {p.stderr.strip()}")
        return p

    def on_node(self, script: str, check: bool = True) -> str:
        """A shell script on the node (its network namespace holds the pod network)."""
        p = self.docker.run("exec", NODE, "bash", "-c", script, check=check)
        return p.stdout.decode()

    def ask(self, ip: str, port: int, timeout: float = 2) -> str | None:
        """The line a pod's server sends on connect, asked from the node; None if none yet."""
        p = self.docker.run(
            "exec",
            NODE,
            "timeout",
            str(timeout),
            "bash",
            "-c",
            f"exec 3<>/dev/tcp/{ip}/{port} && head -1 <&3",
            check=False,
        )
        if p.returncode:
            return None
        return p.stdout.decode().strip() or None

    def load(self, name: str, work: Path) -> str:
        """A project image, built here, loaded into the node; its reference."""
        layout = project_image.CACHE / f"layout-{name}"
        tag = project_image.write_layout(name, layout)
        ref = f"{REGISTRY}/snapshot/{name}:{tag}"
        archive = work / f"{name}.tar"
        subprocess.run(
            ["skopeo", "copy", "--quiet", f"oci:{layout}:{tag}", f"docker-archive:{archive}:{ref}"],
            check=True,
        )
        try:
            self.kind("load", "image-archive", str(archive), "--name", self.name)
        finally:
            archive.unlink()
        return ref

    def install_chart(self, image: str, work: Path) -> None:
        """The README's helm install, with the image loaded into the node."""
        repo, tag = image.rsplit(":", 1)
        values = work / "kind-values.yaml"
        image_values = {"repository": repo, "tag": tag, "pullPolicy": "Never"}
        values.write_text(
            yaml.safe_dump({**chart.one_node_values(SIGNER_IP), "image": image_values})
        )
        chart.install_release(self, values, self.kubeconfig)


@contextlib.contextmanager
def cluster(docker: Docker, image: NodeImage, work: Path) -> Iterator[KindCluster]:
    cfg = work / "kind.yaml"
    cfg.write_text(yaml.safe_dump(config(image)))
    c = KindCluster(docker, work / "kubeconfig")
    delete(c)  # an interrupted run's
    try:
        c.kind(
            "create",
            "cluster",
            "--name",
            c.name,
            "--config",
            str(cfg),
            "--kubeconfig",
            str(c.kubeconfig),
            "--wait",
            "180s",
        )
        yield c
    finally:
        delete(c)


def delete(c: KindCluster) -> None:
    """The cluster, and the Docker network kind made for it (kind keeps it for the next)."""
    with contextlib.suppress(RuntimeError):
        c.kind("delete", "cluster", "--name", c.name, "--kubeconfig", str(c.kubeconfig))
    if "kind" in c.docker.names("networks") and not c.docker.names("containers"):
        c.docker.run("network", "rm", "kind")
