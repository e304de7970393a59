"""`snapshot-agent install-node` on a containerd 2.x node, end to end: the installer (as the
agent's init container runs it) registers runtime handler ``snapshot`` in a config version 3
that lacks it and puts its wrapper and the node bundle under a scratch prefix; containerd 2.x
started with that config reports the handler (`crictl info`), and pods under it run with the
installed bundle, not this checkout's interpreter.

Cases: the handler as containerd reports it; a pod under handler ``snapshot`` served by the
bundle; a restore through the bundle's own CRIU, where containerd's PATH offers another
``criu`` first (a decoy for a host's CRIU 3.x, which fails loudly if run); every file the
serving shim maps is the bundle's."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from agent import install as inst
from api.handshake import RESTORE_REPORT
from api.runtime import POD_ANNOTATIONS, RUNTIME_TYPE
from devnode.containerd import Containerd, admitted
from devnode.cri import Crictl
from devnode.node_site import site_packages as shim_packages
from tests.conftest import CONTAINERD2_PROBLEM, CRI_NODE, VENV_BIN
from tests.helpers import ask, mapped_outside, processes, shim_pids
from tests.shim.test_cri_restore import PORT, start_pod

pytestmark = [
    *CRI_NODE,
    pytest.mark.skipif(CONTAINERD2_PROBLEM is not None, reason=CONTAINERD2_PROBLEM or ""),
]


def test_install_node_registers_the_runtime_in_containerd2(tmp_path):
    host = tmp_path / "host"
    packages = shim_packages(tmp_path / "site")  # copied into the bundle, as an image's are
    prefix, wrapper_dir, decoy = host / "opt/snapshot", host / "bin", tmp_path / "host-criu"
    decoy.mkdir()
    (decoy / "criu").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/host-criu.log\nexit 1\n')
    (decoy / "criu").chmod(0o755)
    installed = {}

    def install_node(config: Path) -> None:
        """The init container's work, with everything it writes under this test's dirs."""
        res = inst.install(
            Path("/"),
            prefix=prefix,
            config=config,
            packages=packages,
            sign_key=node.sign_key,
            bin_dir=wrapper_dir,
            node=node.node_config(),
        )
        assert res.config_changed and res.shim == wrapper_dir / inst.SHIM_NAME
        installed["bundle"] = res.bundle

    node = Containerd(
        Path(f"/tmp/snapshot-inst-{uuid.uuid4().hex[:6]}"),
        major=2,
        bridge="snapbr6",
        subnet="10.233.6.0/24",
        bin_dirs=[str(wrapper_dir), str(decoy), VENV_BIN],
        installer=install_node,
    )
    pods: list[str] = []
    try:
        node.start()
        cri = Crictl(node.address, tmp_path)
        info = json.loads(cri.run("info").stdout)
        runtimes = info["config"]["containerd"]["runtimes"]
        assert runtimes["snapshot"]["runtimeType"] == RUNTIME_TYPE
        assert runtimes["snapshot"]["PodAnnotations"] == list(POD_ANNOTATIONS)

        pod, cfg = cri.run_pod(f"inst-{uuid.uuid4().hex[:5]}", "snapshot")
        pods.append(pod)
        ctr = cri.create(pod, cfg, "main", "localhost/snapshot/busybox:1", ["sleep", "1000"])
        cri.run("start", ctr)
        assert cri.run("exec", ctr, "echo", "ok").stdout.strip() == "ok"
        bundle = str(installed["bundle"])
        shims = processes(f"-id {pod}")
        assert any(f"{bundle}/lib/ld-linux" in s for s in shims), shims

        # a restore through the bundle: its CRIU, though containerd's PATH has another first
        src, src_ctr, r = start_pod((cri, pods), "src")
        assert r.returncode == 0, r.stderr
        before = ask(cri.pod_ip(src), PORT, timeout=30)
        art = node.checkpoint(src_ctr, f"snap-{uuid.uuid4().hex[:6]}")  # the agent's CRIU
        ctl = tmp_path / "ctl"
        ctl.mkdir()
        dst, _, r = start_pod((cri, pods), "dst", annotations=admitted(art), control=ctl)
        assert r.returncode == 0, r.stderr
        after = ask(cri.pod_ip(dst), PORT, timeout=30)
        assert json.loads((ctl / RESTORE_REPORT).read_text())["outcome"] == "restored"
        assert after["count"] == str(int(before["count"]) + 1), "restored, not cold-started"
        assert not (tmp_path / "host-criu.log").exists(), "the decoy criu was run"

        # every file the shim serving the restored pod maps is the bundle's
        pid = shim_pids(dst)[0]
        foreign = mapped_outside(pid, bundle)
        assert not foreign, f"the shim maps files from outside its bundle: {foreign}"
    finally:
        for p in pods:
            cri.remove_pod(p)
        node.stop()
