"""A containerd run by systemd (its unit is Type=notify) has NOTIFY_SOCKET in its
environment, and its shims inherit it. The kind smoke found what that did to ours: runc took
it as "proxy sd_notify for this container" and bound a socket under its state directory,
a path too long with a CRI id in it, so no sandbox of runtime ``snapshot`` ever started
("notify.sock: bind: invalid argument"). The shim drops it, as containerd's runc shim does."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from devnode.containerd import Containerd
from tests.conftest import CONTAINERD_PROBLEM, VENV_BIN, requires_containerd

pytestmark = [requires_containerd, pytest.mark.root]

IMAGE = "localhost/snapshot/busybox:1"


@pytest.fixture
def systemd_containerd(monkeypatch, tmp_path):
    if CONTAINERD_PROBLEM:
        pytest.skip(CONTAINERD_PROBLEM)
    # what systemd gives a Type=notify service (nothing listens: runc must not get that far)
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    c = Containerd(Path(f"/tmp/snapshot-cd-{uuid.uuid4().hex[:6]}"), bin_dirs=[VENV_BIN])
    c.start()
    yield c
    c.stop()


@pytest.mark.parametrize("runtime", ["io.containerd.runc.v2", "io.containerd.snapshot.v2"])
def test_a_container_with_a_cri_length_id_starts_under_a_systemd_containerd(
    systemd_containerd, runtime
):
    name = uuid.uuid4().hex + uuid.uuid4().hex  # 64 hex digits, as the CRI's ids
    r = systemd_containerd.ctr(
        "run", "--rm", "--runtime", runtime, IMAGE, name, "echo", "up", check=False
    )
    assert (r.returncode, r.stdout) == (0, "up\n"), r.stderr
