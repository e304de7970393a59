"""Driving containerd's CRI plugin with crictl, the same gRPC calls the kubelet makes
(RunPodSandbox, CreateContainer, StartContainer, ExecSync, StopPodSandbox, ...)."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

TOOLS_BIN = Path(os.environ.get("SNAPSHOT_TOOLS_BIN", "/var/cache/snapshot-tools/bin"))


@dataclass
class Crictl:
    endpoint: str
    workdir: Path
    binary: str = str(TOOLS_BIN / "crictl")

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        p = subprocess.run(
            [
                self.binary,
                "--runtime-endpoint",
                f"unix://{self.endpoint}",
                "--timeout",
                "60s",
                *args,
            ],
            capture_output=True,
            text=True,
        )
        if check and p.returncode != 0:
            raise RuntimeError(f"crictl {' '.join(args)} failed: {p.stderr.strip()}")
        return p

    def _write(self, obj: dict) -> Path:
        path = self.workdir / f"{uuid.uuid4().hex[:8]}.json"
        path.write_text(json.dumps(obj))
        return path

    def run_pod(
        self,
        name: str,
        handler: str = "snapshot",
        annotations: dict | None = None,
        host_network: bool = False,
        namespace: str = "default",
        uid: str | None = None,
    ) -> tuple[str, Path]:
        """``uid``: the API pod's, as the kubelet passes it (containerd labels the pod's
        containers with it); a fresh one when the sandbox stands for no API pod."""
        cfg = {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": uid or uuid.uuid4().hex,
                "attempt": 0,
            },
            "log_directory": str(self.workdir / f"logs-{name}"),
            "annotations": annotations or {},
            # NamespaceMode NODE (2): the pod shares the host's network namespace
            "linux": {"security_context": {"namespace_options": {"network": 2}}}
            if host_network
            else {},
        }
        if not host_network:  # as the kubelet sets it (a pod on the host's network has the host's)
            cfg["hostname"] = name
        path = self._write(cfg)
        pod = self.run("runp", "--runtime", handler, str(path)).stdout.strip()
        return pod, path

    def create(
        self,
        pod: str,
        pod_cfg: Path,
        name: str,
        image: str,
        command: list[str],
        mounts: tuple[tuple[str, str, bool], ...] = (),
        env: dict | None = None,
        user: int | None = None,
        annotations: dict | None = None,
    ) -> str:
        """``user``: the container's uid (``runAsUser``; its gid is the same);
        ``annotations``: the container's (e.g. ``cdi.k8s.io/…`` asking for CDI devices)."""
        cfg = {
            "metadata": {"name": name},
            "image": {"image": image},
            "command": command,
            "log_path": f"{name}.log",
            "envs": [{"key": k, "value": v} for k, v in (env or {}).items()],
            "mounts": [
                {"host_path": h, "container_path": c, "readonly": ro} for h, c, ro in mounts
            ],
            "linux": {}
            if user is None
            else {
                "security_context": {
                    "run_as_user": {"value": user},
                    "run_as_group": {"value": user},
                }
            },
            "annotations": annotations or {},
        }
        return self.run("create", pod, str(self._write(cfg)), str(pod_cfg)).stdout.strip()

    def pod_ip(self, pod: str) -> str:
        return json.loads(self.run("inspectp", pod).stdout)["status"]["network"]["ip"]

    def netns_path(self, pod: str) -> str | None:
        """The pod's network namespace (/run/netns/cni-…), from its runtime spec."""
        spec = json.loads(self.run("inspectp", pod).stdout)["info"]["runtimeSpec"]
        for ns in spec["linux"]["namespaces"]:
            if ns["type"] == "network":
                return ns.get("path")
        return None

    def inspect(self, ctr: str) -> dict:
        return json.loads(self.run("inspect", ctr).stdout)

    def remove_pod(self, pod: str) -> None:
        self.run("stopp", pod, check=False)
        self.run("rmp", "-f", pod, check=False)
