"""A real one-node Kubernetes cluster on this machine: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler (devnode's control plane), containerd 2.x with the
CRI plugin, CNI bridge and the ``snapshot`` runtime, and a kubelet registered as node
``snapnode`` with the GPU feature-discovery labels the webhook's node affinity asks for.

    with cluster(workdir) as c:   # c.kubectl("get", "nodes"), c.api (the control plane)
        ...

Everything it started is stopped on the way out, also on failure or Ctrl-C: pods through the
CRI (so the CNI plugin frees their namespaces), the kubelet and its mounts, containerd, the
control plane. These VMs use cgroup v1, which Kubernetes >= 1.35 accepts only with
``failCgroupV1: false``; real nodes run cgroup v2."""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import apiserver, free_port, stop_process, wait_until
from .containerd import Containerd
from .cri import TOOLS_BIN

NODE = "snapnode"
#: what GPU feature discovery puts on a GPU node (the webhook's affinity and the agent's
#: nodeSelector read them); this node has no GPU, the labels only let pods land here
NODE_LABELS = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "cpu-only",
               "snapshot.nvidia.com/shim": "true"}  # fmt: skip
TOOLS = ("kubelet", "kube-scheduler", "kube-controller-manager", "kubectl")


def missing() -> str | None:
    why = apiserver.missing()
    if why:
        return why
    absent = [t for t in TOOLS if not (TOOLS_BIN / t).exists()]
    return f"{', '.join(absent)} not built (make tools)" if absent else None


@dataclass
class Cluster:
    api: apiserver.ControlPlane
    node: Containerd
    kubelet_root: Path

    def kubectl(self, *args: str, check: bool = True, input: str | None = None):
        p = subprocess.run([str(TOOLS_BIN / "kubectl"), "--kubeconfig", str(self.api.kubeconfig),
                            *args], capture_output=True, text=True, input=input)  # fmt: skip
        if check and p.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {p.stderr.strip()}")
        return p

    def node_ready(self) -> bool:
        p = self.kubectl("get", "node", NODE, "-o", "json", check=False)
        if p.returncode != 0:
            return False
        conds = json.loads(p.stdout)["status"].get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def kubelet_config(node: Containerd, port: int, healthz: int) -> dict:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "failCgroupV1": False, "failSwapOn": False, "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": f"unix://{node.address}",
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},  # test only: a loopback cluster
        "readOnlyPort": 0, "port": port, "healthzPort": healthz,
        "enforceNodeAllocatable": [], "evictionHard": {},
        "localStorageCapacityIsolation": False,
        "imageGCHighThresholdPercent": 100, "imageMinimumGCAge": "24h",
    }  # fmt: skip


@contextlib.contextmanager
def cluster(work: Path, bin_dirs: list[str]) -> Iterator[Cluster]:
    work.mkdir(parents=True, exist_ok=True)
    base = Path(f"/tmp/snapshot-k8s-{uuid.uuid4().hex[:6]}")  # short: unix socket paths
    node = Containerd(base, bridge="snapbr5", subnet="10.233.5.0/24", bin_dirs=bin_dirs, major=2)
    root = base / "kubelet"
    procs: list[subprocess.Popen] = []
    log = work / "cluster.log"
    with apiserver.control_plane(work / "kube") as cp, log.open("ab") as logf:
        c = Cluster(cp, node, root)
        try:
            cp.install_crds()
            kc = str(cp.kubeconfig)
            for cmd in (
                [str(TOOLS_BIN / "kube-controller-manager"), f"--kubeconfig={kc}",
                 "--leader-elect=false", "--bind-address=127.0.0.1",
                 f"--secure-port={free_port()}", "--controllers=*,-serviceaccount-token",
                 "--use-service-account-credentials=false"],
                [str(TOOLS_BIN / "kube-scheduler"), f"--kubeconfig={kc}",
                 "--leader-elect=false", "--bind-address=127.0.0.1",
                 f"--secure-port={free_port()}"],
            ):  # fmt: skip
                procs.append(subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT))
            node.start()
            cfg = work / "kubelet.yaml"
            cfg.write_text(yaml.safe_dump(kubelet_config(node, free_port(), free_port())))
            labels = ",".join(f"{k}={v}" for k, v in NODE_LABELS.items())
            procs.append(subprocess.Popen(
                [str(TOOLS_BIN / "kubelet"), f"--config={cfg}", f"--kubeconfig={kc}",
                 f"--root-dir={root}", f"--cert-dir={work / 'kubelet-pki'}",
                 f"--hostname-override={NODE}", f"--node-labels={labels}"],
                stdout=logf, stderr=subprocess.STDOUT, env=node.env(),
            ))  # fmt: skip
            wait_until(c.node_ready, procs, "the kubelet's node", log, 90, 0.5)
            yield c
        finally:
            # the kubelet and the control plane's controllers first, then the node's pods
            # through the CRI, and the mounts the kubelet leaves under its --root-dir (both in
            # node.stop: the root dir lies under the node's base)
            for p in reversed(procs):
                stop_process(p, 15)
            node.stop()


def main() -> int:
    """`make cluster`: start the cluster, print how to reach it, keep it until Ctrl-C."""
    import signal
    import sys
    import tempfile
    import threading

    venv_bin = str(Path(sys.executable).parent)
    with (
        tempfile.TemporaryDirectory(prefix="snapshot-cluster-") as tmp,
        cluster(Path(tmp), [venv_bin]) as c,
    ):
        print(f"node {NODE} is Ready; kubectl: {TOOLS_BIN / 'kubectl'} --kubeconfig "
              f"{c.api.kubeconfig}\nCtrl-C stops everything it started.", flush=True)  # fmt: skip
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):  # also when started in the background
            signal.signal(sig, lambda *_: stop.set())
        stop.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
