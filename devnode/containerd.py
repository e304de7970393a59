"""Start and stop a private containerd (its own root, state, sockets and CNI config) with the
CRI plugin, CNI bridge networking and the ``snapshot`` runtime (our shim) registered."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path

from api.annotations import ARTIFACT, MANIFEST_DIGEST
from api.node import NodeConfig
from restore_runtime.artifact import signing
from restore_runtime.executor.checkpoint import CheckpointRequest, CheckpointResult, checkpoint
from restore_runtime.executor.tree_access import RuncContainer

from . import claim, registry
from .containerd_config import (
    PAUSE_IMAGE,
    cni_conflist,
    config_toml,
    config_v3,
    runtime_dropin,
)
from .cri import TOOLS_BIN, Crictl
from .images import write_oci_archive

NAMESPACE = "k8s.io"
BUSYBOX_IMAGE = "localhost/snapshot/busybox:1"
RUNC_ROOT = Path(f"/run/containerd/runc/{NAMESPACE}")
#: containerd 2.x, unpacked beside the system's 1.7 (tools/install-containerd2.sh)
CONTAINERD2 = Path(os.environ.get("SNAPSHOT_CONTAINERD2", "/var/cache/snapshot-tools/containerd2"))


def _remove_netns(path: str) -> None:
    """A network namespace bind-mounted at ``path`` (/run/netns/cni-…): unmounted, removed."""
    if not os.path.exists(path):
        return
    subprocess.run(["umount", path], capture_output=True, check=False)
    with contextlib.suppress(OSError):
        os.unlink(path)


def admitted(art: CheckpointResult, **extra: str) -> dict[str, str]:
    """The annotations the webhook gives a pod restoring ``art`` (its artifact and digest),
    plus ``extra`` (for example the restore policy)."""
    return {ARTIFACT: f"file://{art.path}", MANIFEST_DIGEST: art.digest, **extra}


@dataclass
class Containerd:
    base: Path
    subnet: str = "10.233.0.0/24"
    bridge: str = "snapbr0"
    bin_dirs: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    registry: ThreadingHTTPServer | None = None

    #: containerd's major version: 1 (the system's 1.7) or 2 (tools/install-containerd2.sh)
    major: int = 1
    #: registers the snapshot runtime in the written config (containerd 2.x), as the node
    #: installer does on a real node, instead of devnode's own table
    installer: Callable[[Path], None] | None = None
    #: node settings beside the defaults below (e.g. ``runtime_binary``), as an admin sets them
    node_settings: dict = field(default_factory=dict)
    #: CDI spec directories beside the node's own (containerd 2.x)
    cdi_dirs: tuple[str, ...] = ()

    @property
    def address(self) -> str:
        return str(self.base / "containerd.sock")

    @property
    def prefix_bins(self) -> list[str]:
        """containerd 2.x and its runc come first on PATH (its shims find runc there)."""
        return (
            [str(CONTAINERD2 / "usr/bin"), str(CONTAINERD2 / "usr/sbin")] if self.major == 2 else []
        )

    @property
    def store(self) -> Path:
        """The node's artifact store: the shim restores only artifacts from under it."""
        return self.base / "store"

    @property
    def sign_key(self) -> Path:
        """The node agent's signing key; the shim holds only its public half."""
        return self.base / "signing" / "private.pem"

    def node_config(self) -> NodeConfig:
        # OCI artifacts come from loopback registries, over plain HTTP
        return NodeConfig(
            store_root=self.store,
            verify_key_path=self.sign_key.with_name("public.pem"),
            oci_plain_http=("127.0.0.1",),
            **self.node_settings,
        )

    @property
    def runc(self) -> str:
        """The runc this containerd's shims run: the engine checkpoints with the same one."""
        return shutil.which("runc", path=self.env()["PATH"]) or "runc"

    def env(self) -> dict[str, str]:
        path = ":".join(
            [*self.bin_dirs, *self.prefix_bins, os.environ.get("PATH", "/usr/bin:/bin")]
        )
        # containerd passes its environment on to the shims it starts
        return {**os.environ, "PATH": path, **self.node_config().to_env()}

    def checkpoint(
        self, container_id: str, name: str, namespace: str = "default", **kw
    ) -> CheckpointResult:
        """Checkpoint a container of this node into its store, as the node agent does: under
        ``<store>/<namespace>/<name>``, signed, bound to the namespace."""
        (self.store / namespace).mkdir(parents=True, exist_ok=True)
        return checkpoint(
            CheckpointRequest(
                output=self.store / namespace / name,
                runc_container=RuncContainer(RUNC_ROOT, container_id, self.runc),
                signer=signing.local_signer(self.sign_key),
                namespace=namespace,
                pod_snapshot=name,
                **kw,
            )
        )

    def restart(self) -> None:
        """Stop containerd alone (shims and containers keep running) and start it again."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(10)
        self.start(import_images=False)

    def start(self, timeout: float = 30.0, import_images: bool = True) -> None:
        for d in ("conf.d", "cni", "cdi", "root", "state", "certs.d/_default", "store", "signing"):
            (self.base / d).mkdir(parents=True, exist_ok=True)
        claim(self.base)
        if not self.sign_key.exists():
            signing.generate_keypair(
                self.sign_key, self.sign_key.with_name("public.pem"), overwrite=True
            )
        if self.registry is None:
            archive = self.base / "registry-busybox.tar"
            write_oci_archive(archive, BUSYBOX_IMAGE, ["sh"])
            self.registry = registry.serve(archive)
        host, port = self.registry.server_address[:2]
        address = f"{host}:{port}"
        (self.base / "certs.d/_default/hosts.toml").write_text(registry.hosts_toml(address))
        if self.major == 2:
            if not (self.base / "config.toml").exists():  # a restart keeps what was installed
                (self.base / "config.toml").write_text(
                    config_v3(self.base, self.installer is None, self.cdi_dirs)
                )
                if self.installer is not None:
                    self.installer(self.base / "config.toml")
        else:
            (self.base / "config.toml").write_text(config_toml(self.base))
            (self.base / "conf.d" / "snapshot-runtime.toml").write_text(runtime_dropin(self.base))
        (self.base / "cni" / "10-snapshot.conflist").write_text(
            cni_conflist(self.bridge, self.subnet)
        )
        with open(self.base / "containerd.log", "ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, "--config", str(self.base / "config.toml")],
                stdout=log,
                stderr=log,
                env=self.env(),
                start_new_session=True,
            )
        (self.base / "containerd.pid").write_text(f"{self.proc.pid}\n")
        deadline = time.monotonic() + timeout
        while not Path(self.address).exists() or self.ctr("version", check=False).returncode:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"containerd did not start; see {self.base}/containerd.log")
            time.sleep(0.1)
        for name, cmd in ((PAUSE_IMAGE, ["sleep", "2147483647"]), (BUSYBOX_IMAGE, ["sh"])):
            if not import_images:
                break
            archive = self.base / f"{name.rsplit('/', 1)[-1]}.tar"
            write_oci_archive(archive, name, cmd)
            self.ctr("images", "import", str(archive))

    def _remove_pods(self) -> list[str]:
        """Stop and remove every pod sandbox through the CRI, as the kubelet would; return
        their network namespaces' paths."""
        if (
            self.proc is None
            or self.proc.poll() is not None
            or not TOOLS_BIN.joinpath("crictl").exists()
        ):
            return []
        cri = Crictl(self.address, self.base)
        paths = []
        for pod in cri.run("pods", "-q", check=False).stdout.split():
            with contextlib.suppress(RuntimeError, ValueError, KeyError):
                paths.append(cri.netns_path(pod))
            cri.remove_pod(pod)
        return [p for p in paths if p]

    @property
    def binary(self) -> str:
        return str(CONTAINERD2 / "usr/bin/containerd") if self.major == 2 else "containerd"

    def ctr(
        self, *args: str, check: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess:
        ctr = str(CONTAINERD2 / "usr/bin/ctr") if self.major == 2 else "ctr"
        return subprocess.run(
            [ctr, "--address", self.address, "-n", NAMESPACE, *args],
            capture_output=True,
            text=True,
            check=check,
            env=self.env(),
            timeout=timeout,
        )

    def stop(self) -> None:
        """Tear down everything this node started, in the order that releases it: pod
        sandboxes through the CRI (the CNI plugin's DEL frees each network namespace, veth
        and IP), the remaining tasks, containerd and its shims, mounts under its base, the
        bridge and its IPAM state, the base directory. Safe to call after a failed start."""
        netns = self._remove_pods()
        with contextlib.suppress(Exception):
            for line in self.ctr("tasks", "ls", "-q", check=False).stdout.split():
                self.ctr("tasks", "kill", "-s", "SIGKILL", line, check=False)
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        # shims run in their own sessions and outlive containerd by design
        subprocess.run(["pkill", "-f", "--", f"-address {self.address}"], check=False)
        for line in Path("/proc/self/mounts").read_text().splitlines():
            target = line.split()[1]
            if target.startswith(str(self.base)):
                subprocess.run(["umount", "-l", target], capture_output=True, check=False)
        for path in netns:  # left when a sandbox could not be removed through the CRI
            _remove_netns(path)
        with contextlib.suppress(FileNotFoundError):  # no iproute2: no bridge was made either
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)
        shutil.rmtree(f"/run/{self.bridge}-ipam", ignore_errors=True)
        if self.registry is not None:
            self.registry.shutdown()
        keep = os.environ.get("SNAPSHOT_KEEP_LOGS")
        if keep:  # debugging aid: shim and containerd logs survive the cleanup
            dest = Path(keep) / self.base.name
            dest.mkdir(parents=True, exist_ok=True)
            for f in [self.base / "containerd.log", *self.base.glob("state/**/shim.log")]:
                with contextlib.suppress(OSError):
                    shutil.copy(f, dest / f"{f.parent.name[:12]}-{f.name}")
        shutil.rmtree(self.base, ignore_errors=True)
