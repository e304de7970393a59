"""Which cgroup driver a container's spec asks runc for (restore_runtime.runc.systemd_cgroup):
containerd's CRI writes ``linux.cgroupsPath`` as ``slice:prefix:name`` under a kubelet with
the systemd driver and as a path under cgroupfs, and hands our runtime no runc options, so
the shim reads the driver from that form. A pure decision; the placement it leads to is
checked for real on the kind node (systemd driver, tests/test_kind_smoke.py) and on
devnode's cluster (cgroupfs)."""

from __future__ import annotations

import pytest

from restore_runtime.runc import systemd_cgroup


def spec(path: str | None) -> dict:
    return {"linux": {} if path is None else {"cgroupsPath": path}}


@pytest.mark.parametrize(
    "path",
    [
        # what containerd 1.7 and 2.x write for a kubelet with the systemd driver
        "kubepods-besteffort-pod3f2a_77c1.slice:cri-containerd:0123abcd",
        "kubepods-burstable-podab_cd.slice:cri-containerd:pause0",
        "kubepods-pod1_2.slice:cri-containerd:x",  # a Guaranteed pod
        ":runc:x",  # runc's own default slice
    ],
)
def test_the_systemd_form_asks_for_the_systemd_driver(path):
    assert systemd_cgroup(spec(path))


@pytest.mark.parametrize(
    "path",
    [
        None,
        "",
        # the cgroupfs driver, and `ctr run`'s default
        "/kubepods/besteffort/pod3f2a-77c1/0123abcd",
        "/default/demo",
        "relative/path",
        # a path with colons in it is still a path
        "/kubepods/a:b:c",
        "a/b:c:d",
        "a:b",
    ],
)
def test_anything_else_is_a_cgroupfs_path(path):
    assert not systemd_cgroup(spec(path))


def test_a_spec_without_linux_is_cgroupfs():
    assert not systemd_cgroup({})
