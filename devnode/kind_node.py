"""A kind node image built on this machine, with nothing pulled from a registry.

kind's own ``kindest/node`` comes from Docker Hub, and building it (``images/base``) clones
containerd, runc and the CNI plugins from GitHub. Here the same image is put together from
what this machine can get:

- the root filesystem: Debian packages from mmdebstrap (systemd, iptables, the CNI plugins...),
  containerd 2.x and runc from the tools cache (tools/install-containerd2.sh), crictl;
- kind's own files (entrypoint, systemd units, containerd config) from the
  ``sigs.k8s.io/kind`` Go module, at the version of the kind binary;
- kubeadm, the kubelet and kubectl from tools/build-kube-tools.sh;
- every image the node runs, built here and imported into the node's containerd as kind's
  ``build node-image`` does (``ctr images import --no-unpack``, pinned): pause (busybox),
  the control plane's and kube-proxy's (the binaries on busybox, kube-proxy on a Debian
  layer with iptables), etcd (tools/build-kind-tools.sh, the release kubeadm names).

CoreDNS is not built: the smoke's cluster skips kubeadm's DNS addon (the chart reaches the
signer at a fixed ClusterIP, as on devnode's cluster), and a bridge CNI configuration in the
image stands in for kindnet (``disableDefaultCNI``). The image is tagged by a digest of its
inputs and kept in the private daemon's store: a second run finds it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .cri import TOOLS_BIN
from .docker import Docker
from .images import busybox_layer, file_layer, write_archive, write_oci_archive

CONTAINERD2 = Path(os.environ.get("SNAPSHOT_CONTAINERD2", "/var/cache/snapshot-tools/containerd2"))
SUITE, MIRROR = "trixie", "http://deb.debian.org/debian"
NODE_PACKAGES = (
    "systemd,conntrack,iptables,nftables,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,"
    "pigz,bash,ca-certificates,procps,jq,containernetworking-plugins,e2fsprogs"
)
PROXY_PACKAGES = "iptables,conntrack,ipset,kmod"
POD_SUBNET = "10.244.0.0/16"
#: the node's pods (one node: its podCIDR is the first /24 of the pod subnet)
NODE_POD_CIDR = "10.244.0.0/24"
CONTROL_PLANE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
#: what the image takes from the tools cache (tools/build-*.sh)
TOOLS = ("kubeadm", "kubelet", "kubectl", "crictl", "kind-etcd", "kube-proxy", *CONTROL_PLANE)
BRIDGE = {
    "cniVersion": "1.0.0",
    "name": "kind-bridge",
    "plugins": [
        {
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": True,
            "ipMasq": True,
            "hairpinMode": True,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": NODE_POD_CIDR}]],
                "routes": [{"dst": "0.0.0.0/0"}],
            },
        },
        {"type": "portmap", "capabilities": {"portMappings": True}},
    ],
}
STORAGE = """# kind's legacy default storage class: no provisioner image to pull
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations:
    storageclass.kubernetes.io/is-default-class: "true"
provisioner: kubernetes.io/host-path
"""
#: what the node image's build runs in its chroot (kind's images/base/Dockerfile, as is)
CHROOT = """set -euo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:$PATH
chmod 755 /kind /kind/bin
find /lib/systemd/system/sysinit.target.wants/ -name systemd-tmpfiles-setup.service -delete
rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* \\
  /lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* \\
  /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/*
echo ReadKMsg=no >> /etc/systemd/journald.conf
ln -sf /usr/lib/systemd/systemd /sbin/init
systemctl enable kubelet.service containerd.service undo-mount-hacks.service
systemctl mask systemd-binfmt.service
mkdir -p /etc/kubernetes/manifests /opt/cni/bin
for p in /usr/lib/cni/*; do ln -sf "$p" /opt/cni/bin/; done
product=/kind/bin/mount-product-files.sh
hook=".hooks.createContainer[.hooks.createContainer|length] |= . + {\\"path\\": \\"$product\\"}"
ctr oci spec | jq "$hook" | jq 'del(.process.rlimits)' > /etc/containerd/cri-base.json
sed -i "s|sandbox_image = .*|sandbox_image = \\"$1\\"|" /etc/containerd/config.toml
# a host without CAP_SYS_RESOURCE in its bounding set (some VMs and CI sandboxes) cannot give
# a pod a lower oom_score_adj than its node's (runc: "failed to update oom_score_adj"), as
# under rootless Docker, for which kind's config has this switch
sed -i "s|restrict_oom_score_adj = false|restrict_oom_score_adj = true|" /etc/containerd/config.toml
"""


def _out(*cmd: str, **kw) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout.strip()


def kind_binary() -> Path:
    return TOOLS_BIN / "kind"


def kind_version() -> str:
    return _out(str(kind_binary()), "version").split()[1]  # "kind v0.33.0 go1.26 linux/amd64"


def kube_version() -> str:
    return _out(str(TOOLS_BIN / "kubeadm"), "version", "-o", "short")


def missing() -> str | None:
    """Why the node image cannot be built here, or None."""
    for tool in ("kind", *TOOLS):
        if not (TOOLS_BIN / tool).exists():
            return f"{TOOLS_BIN / tool} is missing (make tools builds it)"
    if not (CONTAINERD2 / "usr/bin/containerd").exists():
        return "containerd 2.x is missing from the tools cache (make tools)"
    if not shutil.which("mmdebstrap"):
        return "mmdebstrap is not installed (make system)"
    return None


def kind_files() -> Path:
    """kind's images/base/files, from the Go module of the kind binary's version."""
    go = shutil.which("go") or "/usr/local/go/bin/go"
    info = json.loads(
        _out(
            go,
            "mod",
            "download",
            "-json",
            f"sigs.k8s.io/kind@{kind_version()}",
            cwd=tempfile.gettempdir(),
            env={**os.environ, "GOFLAGS": "-mod=mod"},
        )
    )
    return Path(info["Dir"]) / "images/base/files"


def required_images(version: str) -> dict[str, str]:
    """kubeadm's image list for ``version``, by short name (``pause`` -> its reference)."""
    refs = _out(
        str(TOOLS_BIN / "kubeadm"), "config", "images", "list", "--kubernetes-version", version
    ).split()
    return {r.rsplit("/", 1)[1].split(":")[0]: r for r in refs}


def _debian_rootfs(out: Path, packages: str, *hooks: str) -> None:
    # mmdebstrap's root mode makes / private in its mount namespace: give it one of its own
    subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "mmdebstrap",
            "--variant=essential",
            f"--include={packages}",
            f'--aptopt=APT::Default-Release "{SUITE}"',
            '--aptopt=Acquire::Check-Valid-Until "false"',
            '--aptopt=Acquire::Check-Date "false"',
            *(f"--customize-hook={h}" for h in hooks),
            '--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*',
            SUITE,
            str(out),
            f"deb {MIRROR} {SUITE} main",
        ],
        check=True,
        capture_output=True,
    )


def _image_archives(work: Path, images: dict[str, str]) -> Path:
    """The node's images as OCI archives, in a directory of their own."""
    out, busybox, path_env = (
        work / "images",
        busybox_layer(),
        "PATH=/usr/local/bin:/usr/sbin:/usr/bin:/bin",
    )
    out.mkdir()
    proxy_base = work / "proxy-rootfs.tar"
    _debian_rootfs(proxy_base, PROXY_PACKAGES)
    layers: dict[str, list[bytes | Path]] = {
        name: [busybox, file_layer({f"usr/local/bin/{name}": TOOLS_BIN / name})]
        for name in CONTROL_PLANE
    }
    layers["kube-proxy"] = [
        proxy_base,
        file_layer({"usr/local/bin/kube-proxy": TOOLS_BIN / "kube-proxy"}),
    ]
    layers["etcd"] = [busybox, file_layer({"usr/local/bin/etcd": TOOLS_BIN / "kind-etcd"})]
    for name, layer in layers.items():
        write_archive(out / f"{name}.tar", images[name], layer, {"Env": [path_env]})
    write_oci_archive(out / "pause.tar", images["pause"], ["sleep", "2147483647"])
    proxy_base.unlink()
    return out


def _stage(work: Path, version: str) -> Path:
    """What goes into the node's root filesystem on top of the packages."""
    stage = work / "stage"
    shutil.copytree(kind_files(), stage)
    for d in stage.rglob("*"):  # the module cache is read-only
        d.chmod(0o755 if d.is_dir() or d.suffix == ".sh" or "bin" in d.parts else 0o644)
    bins = {
        "usr/bin/kubeadm": TOOLS_BIN / "kubeadm",
        "usr/bin/kubelet": TOOLS_BIN / "kubelet",
        "usr/bin/kubectl": TOOLS_BIN / "kubectl",
        "usr/local/bin/crictl": TOOLS_BIN / "crictl",
        "usr/local/sbin/runc": CONTAINERD2 / "usr/sbin/runc",
        **{
            f"usr/local/bin/{b}": CONTAINERD2 / "usr/bin" / b
            for b in ("containerd", "ctr", "containerd-shim-runc-v2")
        },
    }
    for dst, src in bins.items():
        (stage / dst).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, stage / dst)
        (stage / dst).chmod(0o755)
    texts = {
        "kind/version": version,
        "kind/manifests/default-storage.yaml": STORAGE,
        "etc/cni/net.d/10-kind-bridge.conflist": json.dumps(BRIDGE, indent=2),
    }
    for dst, text in texts.items():
        (stage / dst).parent.mkdir(parents=True, exist_ok=True)
        (stage / dst).write_text(text + "\n")
    return stage


def inputs_digest(version: str) -> str:
    """What the image is made of: a new kind, Kubernetes, containerd, etcd, crictl, or one of
    the two files that build it is a new image."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(Path(__file__).with_name("images.py").read_bytes())
    h.update(f"{kind_version()} {version}".encode())
    for b in TOOLS:  # rebuilt only for a new version (tools/build-*.sh)
        h.update(f"{b} {(TOOLS_BIN / b).stat().st_size} {(TOOLS_BIN / b).stat().st_mtime}".encode())
    h.update(_out(str(CONTAINERD2 / "usr/bin/containerd"), "--version").encode())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class NodeImage:
    ref: str
    kubernetes: str
    built_s: float | None  # None: found in the daemon's store


def ensure(docker: Docker) -> NodeImage:
    """The node image for this machine's tools: found, or built (minutes, the first time)."""
    version = kube_version()
    ref = f"snapshot.local/kind-node:{version}-{inputs_digest(version)}"
    if docker.has_image(ref):
        return NodeImage(ref, version, None)
    t0 = time.monotonic()
    images = required_images(version)
    with tempfile.TemporaryDirectory(prefix="kind-node-") as tmp:
        work = Path(tmp)
        stage = _stage(work, version)
        archives = _image_archives(work, images)
        rootfs = work / "rootfs.tar"
        (work / "chroot.sh").write_text(CHROOT)
        _debian_rootfs(
            rootfs,
            NODE_PACKAGES,
            f"sync-in {stage} /",
            f"copy-in {work / 'chroot.sh'} /tmp",
            f'chroot "$1" bash /tmp/chroot.sh {images["pause"]}',
            'rm -f "$1"/tmp/chroot.sh',
        )
        base = f"{ref}-base"
        docker.run("import", str(rootfs), base)
        rootfs.unlink()
        try:
            _preload(docker, base, archives, ref)
        finally:
            docker.run("image", "rm", base, check=False)
    return NodeImage(ref, version, round(time.monotonic() - t0, 1))


def _preload(docker: Docker, base: str, archives: Path, ref: str) -> None:
    """Import the images into the node's containerd, as kind's node-image build does, and
    commit the result with kind's entrypoint. The archives are mounted, not copied in: the
    image carries each image once."""
    name = "snapshot-kind-node-build"
    docker.run("rm", "-f", "-v", name, check=False)
    docker.run(
        "run",
        "-d",
        "--privileged",
        "--name",
        name,
        "-v",
        f"{archives}:/kind/images:ro",
        "--entrypoint",
        "sleep",
        base,
        "infinity",
    )
    try:
        docker.run(
            "exec",
            name,
            "bash",
            "-c",
            """set -e
nohup containerd > /tmp/containerd.log 2>&1 &
for i in $(seq 50); do
  [ -S /run/containerd/containerd.sock ] && ctr version >/dev/null 2>&1 && break; sleep 0.2
done
for f in /kind/images/*.tar; do
  ctr -n k8s.io images import --label=io.cri-containerd.pinned=pinned --all-platforms \\
    --no-unpack --digests "$f"
done
pkill containerd; while pgrep -x containerd >/dev/null; do sleep 0.2; done
rm -f /tmp/containerd.log""",
        )
        docker.run(
            "commit",
            "--change",
            'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]',
            "--change",
            "STOPSIGNAL SIGRTMIN+3",
            "--change",
            "ENV container=docker",
            name,
            ref,
        )
    finally:
        docker.run("rm", "-f", "-v", name, check=False)
