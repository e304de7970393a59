"""install-node's prerequisite checks (agent/prereqs.py) on this machine's real kernel,
cgroups and containerd binaries, and on cgroup trees that lack what runc needs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent import install as inst
from agent import prereqs
from api.node import NodeConfig
from devnode.containerd import CONTAINERD2
from tests.conftest import CONTAINERD2_PROBLEM


def test_cgroups_need_v2_or_the_v1_freezer(tmp_path):
    assert prereqs.cgroups() is None, "this machine's cgroups"
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    assert "freezer" in prereqs.cgroups(v1)
    (v1 / "freezer").mkdir()
    assert prereqs.cgroups(v1) is None
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("cpu memory pids\n")
    assert prereqs.cgroups(v2) is None


def test_containerd_versions_as_the_binaries_print_them():
    one = subprocess.run(["containerd", "--version"], capture_output=True, text=True).stdout
    assert prereqs.containerd_version(one)[:1] == (1,) and prereqs.containerd_version(one) >= (1, 7)
    if CONTAINERD2_PROBLEM is None:
        two = subprocess.run(
            [str(CONTAINERD2 / "usr/bin/containerd"), "--version"], capture_output=True, text=True
        ).stdout
        assert prereqs.containerd_version(two)[0] == 2
    old = "containerd containerd.io 1.6.33 d2d58213f83a351ca8f528a95fbd145f5654e957"
    assert prereqs.containerd_version(old) == (1, 6)
    assert prereqs.containerd(Path("/")) is None, "this machine's containerd 1.7"


@pytest.mark.root
def test_this_machine_passes_and_what_fails_is_named(tmp_path, monkeypatch):
    """The checks as install-node runs them, against this machine's root, with the bundle
    installed under a scratch prefix: criu check passes here. A host whose cgroups lack the
    freezer is refused with the check named, and nothing is registered."""
    site = tmp_path / "site"
    site.mkdir()
    config = tmp_path / "config.toml"
    config.write_text("version = 2\n")
    kw = dict(
        prefix=tmp_path / "opt/snapshot",
        config=config,
        packages=site,
        bin_dir=tmp_path / "bin",
        node=NodeConfig(signing_required=False),
    )
    res = inst.install(Path("/"), **kw)
    assert res.config_changed
    python = f"python{sys.version_info.major}.{sys.version_info.minor}"
    assert prereqs.problems(Path("/"), res.bundle) == []
    assert inst.host_checks(Path("/"), res.bundle, python) == []

    config.write_text("version = 2\n")
    no_freezer = tmp_path / "cgroup"
    (no_freezer / "memory").mkdir(parents=True)
    real = prereqs.problems
    monkeypatch.setattr(prereqs, "problems", lambda h, v: real(h, v, cgroup_root=no_freezer))
    with pytest.raises(inst.SnapshotError, match=r"cgroups: .* freezer.*not registered"):
        inst.install(Path("/"), **kw)
    assert config.read_text() == "version = 2\n"
