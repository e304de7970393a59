"""What a GPU machine's one-node cluster has beyond devnode's CPU one (bench/gpu/k8s_story.py):
images imported into containerd (the machine reaches no registry), the CDI spec that
``nvidia-ctk cdi generate`` writes, the NVIDIA device plugin in CDI mode, and the worker's
image and pod.

GPU feature discovery does not run: the node's ``nvidia.com/gpu.*`` labels are set by hand
from ``nvidia-smi`` (:func:`gpu_labels`).

The worker's image is busybox and the stand-in's code; Python and PyTorch are the GPU
machine's own, mounted read-only from the host (hostPath volumes), since a PyTorch image
cannot be fetched there. The GPU itself comes as a real node gives it: ``nvidia.com/gpu: 1``,
allocated by the device plugin, whose CDI device containerd injects (device nodes, driver
libraries, hooks)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from api.node_labels import DRIVER_VERSION_LABEL, GPU_PRODUCT_LABEL, label_value  # noqa: E402
from devnode import mount_points, stop_process, wait_until  # noqa: E402
from devnode.cluster import NODE, NODE_LABELS, Cluster  # noqa: E402
from devnode.images import busybox_layer, file_layer, write_archive  # noqa: E402
from restore_runtime.cuda.driver import host_libcuda  # noqa: E402

TOOLS = Path(os.environ.get("SNAPSHOT_GPU_TOOLS", "/var/cache/snapshot-tools/gpu-node"))
#: where the device plugin writes its CDI spec (and nvidia-ctk the driver's)
CDI_DIR = Path("/var/run/cdi")
WORKER_IMAGE = "snapshot.local/gpu-worker:1"
GPU = "nvidia.com/gpu"


def gpu_labels() -> dict[str, str]:
    """What GPU feature discovery would put on this node (by hand: it does not run here)."""
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()[0]
    name, driver = (f.strip() for f in out.split(",", 1))
    return labels_for(name, driver)


def labels_for(product: str, driver: str) -> dict[str, str]:
    """GPU feature discovery's labels for a GPU ``product`` and driver version, as the
    webhook's node affinity asks for them (webhook/mutate.py: node_requirements): without the
    driver's label a restore pod stays Pending (the first GPU run through the kubelet, whose
    node had only the product's)."""
    return {
        **NODE_LABELS,
        GPU_PRODUCT_LABEL: label_value(product),
        DRIVER_VERSION_LABEL: label_value(driver),
    }


def generate_cdi(log: Path) -> Path:
    """The driver's CDI spec (``nvidia.com/gpu=0|<uuid>|all``), as the toolkit's
    documentation has an admin make it."""
    CDI_DIR.mkdir(parents=True, exist_ok=True)
    spec = CDI_DIR / "nvidia.yaml"
    with log.open("ab") as f:
        subprocess.run(
            [
                str(TOOLS / "nvidia-ctk"),
                "cdi",
                "generate",
                f"--output={spec}",
                f"--nvidia-cdi-hook-path={TOOLS / 'nvidia-ctk'}",
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
            check=True,
        )
    return spec


def allocatable_gpus(c: Cluster) -> int:
    node = json.loads(c.kubectl("get", "node", NODE, "-o", "json").stdout)
    return int(node["status"].get("allocatable", {}).get(GPU, "0"))


@contextlib.contextmanager
def device_plugin(c: Cluster, log: Path) -> Iterator[None]:
    """The NVIDIA device plugin as a host process, in CDI mode: it allocates ``nvidia.com/gpu``
    and answers the kubelet with the GPU's CDI device name, which containerd injects."""
    proc = None
    try:
        with log.open("ab") as f:
            proc = subprocess.Popen(
                [
                    str(TOOLS / "nvidia-device-plugin"),
                    "--device-list-strategy=cdi-cri",
                    # a host process: the driver is at /, not where its DaemonSet mounts it
                    "--driver-root-ctr-path=/",
                    f"--nvidia-cdi-hook-path={TOOLS / 'nvidia-ctk'}",
                    "--fail-on-init-error=true",
                ],
                stdout=f,
                stderr=subprocess.STDOUT,
            )
        wait_until(lambda: allocatable_gpus(c) >= 1, [proc], "the node's GPU", log, 60, 0.5)
        yield
    finally:
        if proc is not None:
            stop_process(proc, 10)


def import_image(c: Cluster, archive: Path, base_name: str | None = None) -> None:
    """An OCI archive into the node's containerd (``--base-name`` names a layout whose
    index carries only a tag, as devnode's project image does)."""
    args = ["--base-name", base_name] if base_name else []
    c.node.ctr("images", "import", *args, str(archive), timeout=600)


def worker_image(c: Cluster, work: Path) -> str:
    """busybox, the stand-in (bench/gpu/worker.py) and the engine's workload library it
    imports (restore_runtime and api, for the handshake)."""
    # the stand-in and the modules it imports from beside it (its sleep modes)
    files = {
        f"opt/worker/bench/gpu/{n}": HERE / n for n in ("worker.py", "sleep.py", "sleep_mode.py")
    }
    for pkg in ("restore_runtime", "api"):
        for f in (ROOT / pkg).rglob("*.py"):
            files[f"opt/worker/{f.relative_to(ROOT)}"] = f
    archive = work / "gpu-worker.tar"
    write_archive(
        archive,
        WORKER_IMAGE,
        [busybox_layer(), file_layer(files, mode=0o644)],
        {"Env": ["PATH=/bin"], "WorkingDir": "/opt/worker"},
    )
    import_image(c, archive)
    return WORKER_IMAGE


@dataclass(frozen=True)
class Worker:
    """The GPU stand-in's container for a pod template: ``args`` pick its size."""

    args: list[str]
    port: int = 8000

    def host_paths(self) -> list[str]:
        """The host's Python, PyTorch and compiler (Triton builds its launcher at the first
        compile), read-only at their own paths. Not /usr as a whole: a submount under it (the
        driver's folder here) would ride along in its rbind, and CRIU cannot dump that; the
        driver's files come through CDI instead."""
        paths = {"/usr/bin", "/usr/lib", "/usr/lib64", "/usr/include", "/usr/libexec", sys.prefix}
        if not sys.base_prefix.startswith("/usr"):  # a Python of its own (/opt/python...)
            paths.add(sys.base_prefix)
        paths = {p for p in paths if Path(p).is_dir() and not Path(p).is_symlink()}
        for point in mount_points():
            if any(point.startswith(p + "/") for p in paths):
                raise RuntimeError(
                    f"{point} is mounted under a path the worker gets: CRIU could not dump it"
                )
        return sorted(paths)

    def container(self, image: str) -> dict:
        env = {
            "PYTHONPATH": "/opt/worker",
            "HOME": "/tmp",
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "PYTHONUNBUFFERED": "1",
            "NCCL_NVLS_ENABLE": "0",
            "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        }
        if lib := host_libcuda(Path("/")):
            # Triton asks /sbin/ldconfig, which busybox lacks, where libcuda is; CDI mounts
            # the driver's libraries at the host's paths
            env["TRITON_LIBCUDA_PATH"] = str(lib.parent)
        return {
            "name": "worker",
            "image": image,
            "imagePullPolicy": "Never",
            "command": [sys.executable, "/opt/worker/bench/gpu/worker.py"],
            "args": ["--port", str(self.port), *self.args],
            "env": [{"name": k, "value": v} for k, v in env.items()],
            "ports": [{"containerPort": self.port, "name": "digest"}],
            "resources": {"limits": {GPU: 1}},
            "volumeMounts": [
                {"name": f"host{i}", "mountPath": p, "readOnly": True}
                for i, p in enumerate(self.host_paths())
            ],
        }

    def volumes(self) -> list[dict]:
        return [
            {"name": f"host{i}", "hostPath": {"path": p, "type": "Directory"}}
            for i, p in enumerate(self.host_paths())
        ]
