"""A restore through containerd by the node bundle on an old host: the shim containerd starts
runs inside a Debian 11 root (glibc 2.31, its own runc 1.0.0-rc93 and iptables, no CRIU), as
on an Ubuntu 22.04 or RHEL 9 node. The bundle is installed into that root by install-node;
containerd (this machine's 2.x) finds a ``containerd-shim-snapshot-v2`` that enters the root
(its root file system, with this machine's /proc, /sys, /dev, /run and /tmp bound in, where
containerd keeps its state and sockets) and execs the root's wrapper. The source runs under
containerd's own runc shim; its checkpoint is restored by the Debian 11 shim, the bundle's
CRIU and Debian 11's runc, into a running container.

What is checked: the restore report says ``restored``; the restored container answers an
exec and kept its state (a file its process wrote before the checkpoint); the shim process
runs inside the root, from the bundle's loader; nothing it maps is a file of the root's."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import pytest

from agent import install as inst
from api.handshake import RESTORE_REPORT
from devnode import userlands, workloads
from devnode.containerd import BUSYBOX_IMAGE, Containerd, admitted
from devnode.cri import Crictl
from devnode.node_site import site_packages as shim_packages
from tests.conftest import CONTAINERD2_PROBLEM, CRI_NODE
from tests.helpers import mapped_outside, shim_pids

pytestmark = [
    *CRI_NODE,
    pytest.mark.skipif(CONTAINERD2_PROBLEM is not None, reason=CONTAINERD2_PROBLEM or ""),
    pytest.mark.skipif(userlands.missing() is not None, reason=userlands.missing() or ""),
]
#: writes a random number once, then waits (a restored sleep's nanosleep ends early: a loop
#: goes on); a cold start would write another number
WORKLOAD = ["sh", "-c", "echo $RANDOM$RANDOM > /tmp/started; while :; do sleep 1; done"]


def enter_script(root: Path) -> str:
    """containerd's ``containerd-shim-snapshot-v2``: the shim, started with ``root`` as its
    root file system, as a node's own root is: a mount point it pivots into (runc's
    pivot_root refuses a chroot), this machine's /proc, /sys, /dev, /run and /tmp bound in."""
    binds = "".join(
        f"mount --rbind /{d} {root}/{d}; " for d in ("proc", "sys", "dev", "run", "tmp")
    )
    inner = (
        f"mount --rbind {root} {root}; {binds}cd {root}; mkdir -p .host; "
        f'pivot_root . .host; umount -l /.host; exec /usr/local/bin/{inst.SHIM_NAME} "$@"'
    )
    return f"#!/bin/sh\nexec unshare --mount --propagation slave sh -c '{inner}' shim \"$@\"\n"


def test_a_debian_11_node_restores_with_the_bundle(tmp_path):
    try:
        root = userlands.unpack("bullseye", tmp_path / "bullseye", ("runc", "iptables", "mount"))
    except RuntimeError as e:
        pytest.skip(f"cannot build the bullseye root: {e}")
    assert not (root / "usr/sbin/criu").exists()
    enter = tmp_path / "enter"
    enter.mkdir()
    (enter / inst.SHIM_NAME).write_text(enter_script(root))
    (enter / inst.SHIM_NAME).chmod(0o755)
    packages = shim_packages(tmp_path / "site")
    installed: dict = {}

    def install_node(config: Path) -> None:
        """install-node into the Debian 11 root, then containerd's config registered too
        (this containerd's config lives outside the root)."""
        (root / "etc/containerd").mkdir(parents=True, exist_ok=True)
        res = inst.install(root, packages=packages, sign_key=node.sign_key, node=node.node_config())
        installed["bundle"] = res.bundle
        config.write_text(inst.with_runtime(config.read_text()))

    node = Containerd(
        Path(f"/tmp/snapshot-b11-{uuid.uuid4().hex[:6]}"),
        major=2,
        bridge="snapbr7",
        subnet="10.233.7.0/24",
        bin_dirs=[str(enter)],
        installer=install_node,
    )
    cri = Crictl(node.address, tmp_path)
    pods: list[str] = []
    try:
        node.start()
        src, cfg = cri.run_pod(f"src-{uuid.uuid4().hex[:5]}", "runc")
        pods.append(src)
        src_ctr = cri.create(src, cfg, "main", BUSYBOX_IMAGE, WORKLOAD)
        cri.run("start", src_ctr)
        started = cri.run("exec", src_ctr, "cat", "/tmp/started").stdout.strip()
        art = node.checkpoint(src_ctr, f"snap-{uuid.uuid4().hex[:6]}")

        uid = uuid.uuid4().hex
        ctl = tmp_path / "ctl"
        ctl.mkdir()
        dst, cfg = cri.run_pod(f"dst-{uid[:5]}", "snapshot", admitted(art), uid=uid)
        pods.append(dst)
        dst_ctr = cri.create(
            dst, cfg, "main", BUSYBOX_IMAGE, WORKLOAD, (workloads.control_mount(ctl, uid),)
        )
        r = cri.run("start", dst_ctr, check=False)
        assert r.returncode == 0, r.stderr
        report = json.loads((ctl / RESTORE_REPORT).read_text())
        assert report["outcome"] == "restored", report
        assert cri.run("exec", dst_ctr, "cat", "/tmp/started").stdout.strip() == started

        bundle = str(installed["bundle"])
        (pid,) = shim_pids(dst)
        debian = Path(f"/proc/{pid}/root/etc/debian_version").read_text()
        assert debian.startswith("11."), "the shim runs in the Debian 11 root"
        assert os.readlink(f"/proc/{pid}/exe").startswith(f"{bundle}/lib/ld-linux")
        foreign = mapped_outside(pid, bundle)
        assert not foreign, f"the shim maps files of the root's own: {foreign}"
    finally:
        for p in pods:
            cri.remove_pod(p)
        node.stop()
        shutil.rmtree(node.base, ignore_errors=True)
