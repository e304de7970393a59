"""A plain container under runtime io.containerd.snapshot.v2 behaves as under runc, through a
real containerd (ctr): output, exit codes, exec, kill/wait, delete, and one shim per
container group. Cases run under both runtimes and must agree."""

from __future__ import annotations

import time
import uuid

import pytest

from tests.shim.conftest import requires_containerd

pytestmark = [requires_containerd, pytest.mark.root]

IMAGE = "localhost/snapshot/busybox:1"
RUNTIMES = ["io.containerd.runc.v2", "io.containerd.snapshot.v2"]


def cid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_output_and_exit_code(containerd, runtime):
    r = containerd.ctr("run", "--rm", "--runtime", runtime, IMAGE, cid("out"), "sh", "-c",
                       "echo out; echo err >&2; exit 7", check=False)  # fmt: skip
    assert r.stdout == "out\n"
    assert "err" in r.stderr
    assert r.returncode == 7


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_exec_kill_wait_delete(containerd, runtime):
    name = cid("life")
    # PID 1 ignores SIGTERM without a handler, so the init traps it
    containerd.ctr("run", "-d", "--runtime", runtime, IMAGE, name, "sh", "-c",
                   "trap 'exit 5' TERM; sleep 1000 & wait")  # fmt: skip
    try:
        r = containerd.ctr("task", "exec", "--exec-id", "e1", name, "sh", "-c",
                           "echo exec-$((6*7)); exit 3", check=False)  # fmt: skip
        assert (r.stdout, r.returncode) == ("exec-42\n", 3)
        ps = containerd.ctr("task", "ps", name).stdout
        assert len(ps.strip().splitlines()) >= 2  # header + the init process
        containerd.ctr("task", "kill", "-s", "SIGTERM", name)
        deadline = time.monotonic() + 10
        while "STOPPED" not in containerd.ctr("task", "ls").stdout:
            assert time.monotonic() < deadline, containerd.ctr("task", "ls").stdout
            time.sleep(0.05)
        line = next(x for x in containerd.ctr("task", "ls").stdout.splitlines() if name in x)
        assert "STOPPED" in line
        containerd.ctr("task", "delete", name)
        assert name not in containerd.ctr("task", "ls").stdout
    finally:
        containerd.ctr("task", "kill", "-s", "SIGKILL", name, check=False)
        containerd.ctr("task", "delete", "-f", name, check=False)
        containerd.ctr("containers", "delete", name, check=False)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_errors_are_errors(containerd, runtime):
    name = cid("err")
    r = containerd.ctr("run", "--rm", "--runtime", runtime, IMAGE, name, "/no/such/binary",
                       check=False)  # fmt: skip
    assert r.returncode != 0
    assert "no such file" in (r.stderr + r.stdout).lower()
