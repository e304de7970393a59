"""What install-node checks on a host before it registers the runtime, beside the bundle's own
run (install.host_problem) and the mount propagation (install.check_host_mounts). Each check
says what is missing in words an admin can act on; install-node fails with all of them, the
node gets an Event (SnapshotNodeNotReady) and is not made ready:

- the kernel: ``criu check`` with the bundle's CRIU (what checkpoint and restore need);
- the cgroups: version 2, or version 1 with the freezer controller (runc freezes a
  container's processes through it for a checkpoint);
- containerd: 1.7 or newer, where its binary is found in the host's root (k3s and others
  build it in: not checked there); its config's version is checked when it is edited."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from . import bundle

MIN_CONTAINERD = (1, 7)
CONTAINERD_DIRS = ("usr/local/bin", "usr/bin", "bin")


#: what says CRI-O runs a node (under the host's root: ``var/run`` is a link to ``/run``,
#: which would resolve in this container)
CRIO_SIGNS = ("run/crio/crio.sock", "usr/bin/crio", "usr/local/bin/crio")


def foreign_runtime(host_root: Path) -> str | None:
    """Why the node's container runtime is not one the shim registers with: CRI-O (OpenShift)
    without containerd. Checked before anything is written, so such a node gets no
    ``/etc/containerd`` and no bundle, and the reason names the runtime."""
    if containerd_binary(host_root) is not None:
        return None
    if any((host_root / sign).exists() for sign in CRIO_SIGNS):
        return (
            "CRI-O runs this node, and Snapshot registers its runtime with containerd only: "
            "nothing was installed (docs/gpu-nodes.md, the GPU Operator setups)"
        )
    return None


def problems(host_root: Path, vdir: Path, cgroup_root: Path = Path("/sys/fs/cgroup")) -> list[str]:
    """What this host lacks (empty: nothing). ``vdir``: the bundle, as the host sees it."""
    found = [kernel(host_root, vdir), cgroups(cgroup_root), containerd(host_root)]
    return [p for p in found if p]


def kernel(host_root: Path, vdir: Path) -> str | None:
    local = host_root / vdir.relative_to("/")  # run from here, in this container's view
    cmd = [
        *bundle.run_command(local, local / "libexec" / "criu", bundle.loader_name(local)),
        "check",
    ]
    env = {**bundle.python_env(local), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"kernel: criu check did not run: {e}"
    if p.returncode == 0:
        return None
    lines = [ln.strip() for ln in (p.stdout + p.stderr).splitlines() if "Error" in ln]
    return f"kernel: criu check failed: {'; '.join(lines[-3:]) or f'exit {p.returncode}'}"


def cgroups(root: Path = Path("/sys/fs/cgroup")) -> str | None:
    if (root / "cgroup.controllers").exists():  # version 2
        return None
    if (root / "freezer").is_dir():
        return None
    return (
        f"cgroups: {root} is neither cgroup v2 nor v1 with the freezer controller, which "
        "runc needs to freeze a container for its checkpoint"
    )


def containerd_version(text: str) -> tuple[int, int] | None:
    """The version from ``containerd --version``: "containerd github.com/containerd/containerd
    1.7.24~ds1 ...", "... containerd/v2 v2.1.9 ...", "containerd containerd.io 1.6.33 ..."."""
    m = re.search(r"\bv?(\d+)\.(\d+)\.\d+", text)
    return (int(m[1]), int(m[2])) if m else None


def containerd_binary(host_root: Path) -> Path | None:
    """containerd's binary under the host's root, where distributions put it."""
    return next(
        (host_root / d / "containerd" for d in CONTAINERD_DIRS
         if (host_root / d / "containerd").is_file()),
        None,
    )  # fmt: skip


def containerd(host_root: Path) -> str | None:
    binary = containerd_binary(host_root)
    if binary is None:
        return None
    cmd = [str(binary), "--version"]
    if host_root.resolve() != Path("/"):
        cmd = ["chroot", str(host_root), "/" + str(binary.relative_to(host_root))]
        cmd.append("--version")
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None  # not one we can run: the runtime's registration will tell
    version = containerd_version(out)
    if version is not None and version < MIN_CONTAINERD:
        return (
            f"containerd: {'.'.join(map(str, version))} is too old: "
            f"{'.'.join(map(str, MIN_CONTAINERD))} or newer is required"
        )
    return None
