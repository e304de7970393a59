"""`snapshot-agent install-node` on a containerd 2.x node, end to end: the installer (as the
agent's init container runs it) registers runtime handler ``snapshot`` in a config version 3
that lacks it and puts its wrapper and interpreter under a scratch host root; containerd 2.x
started with that config reports the handler (`crictl info`), and a pod under it runs with
the installed shim, not this checkout's.

Cases: the handler as containerd reports it; a pod under handler ``snapshot`` served by the
wrapper's copied interpreter."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest

from agent import install as inst
from api.runtime import POD_ANNOTATIONS, RUNTIME_TYPE
from devnode.containerd import Containerd
from devnode.cri import Crictl
from tests.conftest import CONTAINERD2_PROBLEM, CRI_NODE
from tests.helpers import processes

pytestmark = [
    *CRI_NODE,
    pytest.mark.skipif(CONTAINERD2_PROBLEM is not None, reason=CONTAINERD2_PROBLEM or ""),
]
ROOT = Path(__file__).resolve().parents[2]


def test_install_node_registers_the_runtime_in_containerd2(tmp_path):
    host = tmp_path / "host"
    packages = tmp_path / "site"
    packages.mkdir()
    purelib = next(p for p in sys.path if p.endswith("site-packages"))
    (packages / "snapshot.pth").write_text(f"{ROOT}\n{purelib}\n")
    private = tmp_path / "sign.pem"
    from restore_runtime.artifact import signing

    signing.generate_keypair(private, tmp_path / "verify.pem")

    prefix, wrapper_dir = host / "opt/snapshot", host / "bin"

    def install_node(config: Path) -> None:
        """The init container's work, with everything it writes under this test's dirs."""
        res = inst.install(Path("/"), prefix=prefix, config=config, packages=packages,
                           sign_key=private, bin_dir=wrapper_dir)  # fmt: skip
        assert res.config_changed and res.shim == wrapper_dir / inst.SHIM_NAME

    node = Containerd(Path(f"/tmp/snapshot-inst-{uuid.uuid4().hex[:6]}"), major=2,
                      bridge="snapbr6", subnet="10.233.6.0/24", bin_dirs=[str(wrapper_dir)],
                      installer=install_node)  # fmt: skip
    try:
        node.start()
        cri = Crictl(node.address, tmp_path)
        info = json.loads(cri.run("info").stdout)
        runtimes = info["config"]["containerd"]["runtimes"]
        assert runtimes["snapshot"]["runtimeType"] == RUNTIME_TYPE
        assert runtimes["snapshot"]["PodAnnotations"] == list(POD_ANNOTATIONS)

        pod, cfg = cri.run_pod(f"inst-{uuid.uuid4().hex[:5]}", "snapshot")
        ctr = cri.create(pod, cfg, "main", "localhost/snapshot/busybox:1", ["sleep", "1000"])
        cri.run("start", ctr)
        assert cri.run("exec", ctr, "echo", "ok").stdout.strip() == "ok"
        shims = processes(f"-id {pod}")
        assert any(str(prefix / "python") in s for s in shims), shims
    finally:
        node.stop()
