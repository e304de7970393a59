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
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from restore_runtime.mounts import propagation_problem

from . import apiserver, chart, claim, free_port, iptables, oci_registry, stop_process, wait_until
from .containerd import Containerd
from .cri import TOOLS_BIN
from .oci_registry import Registry

NODE = "snapnode"
#: what GPU feature discovery puts on a GPU node (the webhook's affinity and the agent's
#: nodeSelector read them); this node has no GPU, the labels only let pods land here
NODE_LABELS = {
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.product": "cpu-only",
    "snapshot.nvidia.com/shim": "true",
}
TOOLS = ("kubelet", "kube-scheduler", "kube-controller-manager", "kube-proxy", "kubectl")


def missing() -> str | None:
    why = apiserver.missing() or oci_registry.missing()
    if why:
        return why
    absent = [t for t in TOOLS if not (TOOLS_BIN / t).exists()]
    return f"{', '.join(absent)} not built (make tools)" if absent else None


#: the host address the control plane serves pods on: an interface of ours, so nothing
#: listens on the machine's own network
API_IFACE, API_ADDRESS = "snapapi0", "10.233.250.1"
POD_SUBNET = "10.233.5.0/24"
#: the signer Service's ClusterIP (in the API server's service range, devnode/apiserver.py)
SIGNER_IP = "10.96.0.200"


@dataclass
class Cluster:
    api: apiserver.ControlPlane
    node: Containerd
    kubelet_root: Path
    registry: Registry | None  # None where images are imported into containerd instead

    def kubectl(self, *args: str, check: bool = True, input: str | None = None):
        p = subprocess.run(
            [str(TOOLS_BIN / "kubectl"), "--kubeconfig", str(self.api.kubeconfig), *args],
            capture_output=True,
            text=True,
            input=input,
        )
        if check and p.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {p.stderr.strip()}")
        return p

    def node_ready(self) -> bool:
        p = self.kubectl("get", "node", NODE, "-o", "json", check=False)
        if p.returncode != 0:
            return False
        conds = json.loads(p.stdout)["status"].get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    def check_mounts(self) -> None:
        """The node's base must stay a shared mount: containerd refuses the agent's
        HostToContainer mounts of the kubelet root otherwise (CreateContainerError)."""
        if why := propagation_problem(self.kubelet_root):
            raise RuntimeError(f"devnode's cluster: {why}")

    @property
    def shim_bin_dir(self) -> Path:
        """Where the chart's installer puts the shim: on containerd's PATH."""
        return self.node.base / "bin"

    @property
    def restart_containerd(self) -> str:
        """What restarts this node's containerd, run by the chart's init container (which has
        the host's / at /host, and its PIDs): devnode's supervisor starts it again when it
        exits, as systemd does on a real node."""
        return f"kill $(cat /host{self.node.base}/containerd.pid)"

    def chart_values(self) -> dict:
        """Helm values that fit this node's paths (the rest are the chart's defaults)."""
        return chart.one_node_values(
            SIGNER_IP,
            containerdConfig=str(self.node.base / "config.toml"),
            containerdRestartCommand=self.restart_containerd,
            containerdStateDir=str(self.node.base / "state"),
            containerdRootDir=str(self.node.base / "root"),
            shimPrefix=str(self.node.base / "opt/snapshot"),
            shimBinDir=str(self.shim_bin_dir),
            artifactStore=str(self.node.store),
            kubeletRoot=str(self.kubelet_root),
        )


def kubelet_config(node: Containerd, port: int, healthz: int) -> dict:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "failSwapOn": False,
        "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": f"unix://{node.address}",
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},  # test only: a loopback cluster
        "readOnlyPort": 0,
        "port": port,
        "healthzPort": healthz,
        "enforceNodeAllocatable": [],
        "evictionHard": {},
        "localStorageCapacityIsolation": False,
        "imageGCHighThresholdPercent": 100,
        "imageMinimumGCAge": "24h",
        "podLogsDir": str(node.base / "pod-logs"),  # not /var/log/pods: removed with the node
    }


@contextlib.contextmanager
def _api_interface() -> Iterator[None]:
    subprocess.run(["ip", "link", "del", API_IFACE], capture_output=True, check=False)
    # a bridge without ports: the dummy module is not in every kernel (not in these VMs)
    subprocess.run(["ip", "link", "add", API_IFACE, "type", "bridge"], check=True)
    try:
        subprocess.run(["ip", "addr", "add", f"{API_ADDRESS}/32", "dev", API_IFACE], check=True)
        subprocess.run(["ip", "link", "set", API_IFACE, "up"], check=True)
        yield
    finally:
        subprocess.run(["ip", "link", "del", API_IFACE], capture_output=True, check=False)


def _supervise(node: Containerd, stopping: threading.Event) -> None:
    """systemd's Restart=always for devnode's containerd: the chart's installer stops it to
    load the new runtime, and it comes back with the new config."""
    while not stopping.wait(0.2):
        if node.proc is not None and node.proc.poll() is not None and not stopping.is_set():
            node.start(import_images=False)


@contextlib.contextmanager
def cluster(
    work: Path,
    labels: dict[str, str] = NODE_LABELS,
    cdi_dirs: tuple[str, ...] = (),
    registry: bool = True,
) -> Iterator[Cluster]:
    """containerd starts without the ``snapshot`` runtime: the chart's installer registers
    it (and restarts containerd), with the shim in :attr:`Cluster.shim_bin_dir`. A GPU
    machine's node (bench/gpu/k8s_story.py) has its own ``labels``, reads the device
    plugin's CDI specs from ``cdi_dirs`` and, with no registry binary, no ``registry``."""
    work.mkdir(parents=True, exist_ok=True)
    base = Path(f"/tmp/snapshot-k8s-{uuid.uuid4().hex[:6]}")  # short: unix socket paths

    def chart_installs(_config: Path) -> None:
        """Nothing yet: the chart's init container edits the config (chart.install)."""

    node = Containerd(
        base,
        bridge="snapbr5",
        subnet=POD_SUBNET,
        bin_dirs=[str(base / "bin")],
        major=2,
        installer=chart_installs,
        cdi_dirs=cdi_dirs,
    )
    root = base / "kubelet"
    # a shared mount, as / is on a systemd host: the agent sees the containers' root
    # filesystems and the pods' volumes mounted after it started (HostToContainer)
    base.mkdir(parents=True)
    claim(base)
    subprocess.run(["mount", "--bind", str(base), str(base)], check=True)
    subprocess.run(["mount", "--make-shared", str(base)], check=True)
    procs: list[subprocess.Popen] = []
    stopping = threading.Event()
    supervisor: threading.Thread | None = None
    log = work / "cluster.log"
    proxy = TOOLS_BIN / "kube-proxy"
    try:
        with (
            _api_interface(),
            apiserver.control_plane(work / "kube", address=API_ADDRESS) as cp,
            (
                oci_registry.docker_registry(work / "registry")
                if registry
                else contextlib.nullcontext(None)
            ) as reg,
            log.open("ab") as logf,
        ):
            c = Cluster(cp, node, root, reg)
            try:
                c.check_mounts()
                cp.install_crds()
                kc = str(cp.kubeconfig)
                for cmd in (
                    [
                        str(TOOLS_BIN / "kube-controller-manager"),
                        f"--kubeconfig={kc}",
                        "--leader-elect=false",
                        "--bind-address=127.0.0.1",
                        f"--secure-port={free_port()}",
                        "--controllers=*,-serviceaccount-token",
                        "--use-service-account-credentials=false",
                        f"--root-ca-file={cp.ca}",
                    ],
                    [
                        str(TOOLS_BIN / "kube-scheduler"),
                        f"--kubeconfig={kc}",
                        "--leader-elect=false",
                        "--bind-address=127.0.0.1",
                        f"--secure-port={free_port()}",
                    ],
                    # Services: the kubernetes Service's ClusterIP to the API server, the webhook's
                    # to its pods (iptables rules, removed by --cleanup on the way out)
                    [
                        str(proxy),
                        f"--kubeconfig={kc}",
                        f"--hostname-override={NODE}",
                        "--proxy-mode=iptables",
                        f"--cluster-cidr={POD_SUBNET}",
                        # a pod reaching a Service whose pod is on the same bridge (the agent
                        # and the signer) gets its answers back through the NAT
                        "--masquerade-all",
                        "--conntrack-max-per-core=0",
                        f"--healthz-bind-address=127.0.0.1:{free_port()}",
                        f"--metrics-bind-address=127.0.0.1:{free_port()}",
                    ],
                ):
                    procs.append(subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT))
                if reg is not None:
                    (base / "certs.d" / reg.address).mkdir(parents=True)
                    (base / "certs.d" / reg.address / "hosts.toml").write_text(reg.hosts_toml())
                node.start()
                supervisor = threading.Thread(target=_supervise, args=(node, stopping), daemon=True)
                supervisor.start()
                cfg = work / "kubelet.yaml"
                cfg.write_text(yaml.safe_dump(kubelet_config(node, free_port(), free_port())))
                node_labels = ",".join(f"{k}={v}" for k, v in labels.items())
                procs.append(
                    subprocess.Popen(
                        [
                            str(TOOLS_BIN / "kubelet"),
                            f"--config={cfg}",
                            f"--kubeconfig={kc}",
                            f"--root-dir={root}",
                            f"--cert-dir={work / 'kubelet-pki'}",
                            f"--hostname-override={NODE}",
                            f"--node-labels={node_labels}",
                            f"--node-ip={API_ADDRESS}",
                        ],
                        stdout=logf,
                        stderr=subprocess.STDOUT,
                        env=node.env(),
                    )
                )
                wait_until(c.node_ready, procs, "the kubelet's node", log, 90, 0.5)
                yield c
            finally:
                # the kubelet and the control plane's controllers first; then (node.stop) the
                # node's pods through the CRI, and the mounts the kubelet leaves under its
                # --root-dir, which lies under the node's base
                stopping.set()
                if supervisor is not None:  # not in the middle of starting containerd again
                    supervisor.join()
                for p in reversed(procs):
                    stop_process(p, 15)
                if proxy.exists():
                    subprocess.run(
                        [str(proxy), "--cleanup"],
                        stdout=logf,
                        stderr=subprocess.STDOUT,
                        check=False,
                    )
                # the kubelet's canaries and firewall, the hint chain, what --cleanup left
                iptables.remove_kube_chains()
    finally:
        node.stop()  # also after a failed start: it unmounts the base and removes it


def main() -> int:
    """`make cluster`: the cluster with the chart installed, until Ctrl-C."""
    import signal
    import tempfile

    from . import chart

    def interrupt(*_) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)  # also when started in the background
    with (
        contextlib.suppress(KeyboardInterrupt),  # outermost: the teardown runs first
        tempfile.TemporaryDirectory(prefix="snapshot-cluster-") as tmp,
        cluster(Path(tmp)) as c,
    ):
        claim(Path(tmp))
        installed = chart.install(c, Path(tmp))
        print(
            f"node {NODE} is Ready, Snapshot installed (release {chart.RELEASE} in "
            f"{chart.NAMESPACE}).\n"
            f"  export KUBECONFIG={c.api.kubeconfig}\n  kubectl: {TOOLS_BIN / 'kubectl'}\n"
            f"  images: {installed.image} (the chart's), {installed.demo_image} (the CPU "
            "demo's)\n"
            "Ctrl-C stops everything it started.",
            flush=True,
        )
        signal.pause()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
