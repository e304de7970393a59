"""A checkpoint is a transaction over its source (executor/checkpoint.py, recovery.py), through
containerd's CRI, real runc and CRIU, on both containerd lines.

Each test picks its moment of failure itself: a checkpointer (the engine in a process of its
own session, as the agent's container is) killed with SIGKILL while the workload quiesces
(it answers ready only when the test opens its gate) or while CRIU holds the container
frozen (a workload with enough memory that the dump takes a while); a store sized to fill up
in the CRIU dump or in the rootfs diff, without keepSourceRunning. After each, the source
answers with its state intact, and nothing is left: no staging or work directory, no
journal, nothing at the artifact's name, no frozen cgroup; a second checkpoint works.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from api.handshake import CHECKPOINT_REQUESTED, READY_FOR_SNAPSHOT
from devnode import wait_until, workloads
from devnode.containerd import RUNC_ROOT
from restore_runtime.errors import SnapshotError
from restore_runtime.executor.checkpoint import CheckpointRequest, checkpoint
from restore_runtime.executor.recovery import journals, recover_interrupted
from restore_runtime.executor.tree_access import RuncContainer
from tests.conftest import CRI_NODE
from tests.helpers import ROOT, ask

pytestmark = CRI_NODE
IMAGE = "localhost/snapshot/busybox:1"
PORT = 8080
COUNTER = workloads.command(["tests/workloads/counter_server.py"], PORT)
CONTROL = workloads.DEFAULT_CONTROL_DIR

#: the agent's part, in a session of its own (killing it kills runc and CRIU with it)
CHECKPOINTER = """
import sys
from pathlib import Path
from restore_runtime.executor.checkpoint import CheckpointRequest, checkpoint
from restore_runtime.executor.tree_access import RuncContainer
root, cid, runc, out, ctl, leave = sys.argv[1:]
checkpoint(CheckpointRequest(output=Path(out), runc_container=RuncContainer(Path(root), cid, runc),
                             control_dir=Path(ctl) if ctl else None, leave_running=leave == "1",
                             handshake_timeout_s=120))
"""


def _pod(cri, tmp: Path, env: dict[str, str], control: bool) -> tuple[str, str, Path | None]:
    c, pods = cri
    uid = uuid.uuid4().hex
    pod, cfg = c.run_pod(f"fault-{uid[:6]}", "runc", uid=uid)
    pods.append(pod)
    mounts = list(workloads.mounts())
    ctl = None
    if control:
        ctl = tmp / "ctl"
        ctl.mkdir()
        mounts.append(workloads.control_mount(ctl, uid))
        env = {**env, "SNAPSHOT_CONTROL_DIR": CONTROL}
    ctr = c.create(pod, cfg, "main", IMAGE, COUNTER, tuple(mounts), env=env)
    c.run("start", ctr)
    return c.pod_ip(pod), ctr, ctl


def _spawn(containerd, ctr: str, out: Path, ctl: Path | None, leave: bool) -> subprocess.Popen:
    argv = [
        sys.executable,
        "-c",
        CHECKPOINTER,
        str(RUNC_ROOT),
        ctr,
        containerd.runc,
        str(out),
        str(ctl or ""),
        "1" if leave else "0",
    ]
    return subprocess.Popen(argv, cwd=ROOT, start_new_session=True)


def _kill(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def _wait_for(cond, what: str, timeout: float = 60.0) -> None:
    # finely: each fault is injected in a window of a few milliseconds
    wait_until(cond, what=what, timeout=timeout, poll=0.002)


def _frozen(ctr: str, runc: str) -> bool:
    """The container's freezer says frozen (see freezer_file)."""
    pid = RuncContainer(RUNC_ROOT, ctr, runc).state()["pid"]
    if not pid:  # runc reports no PID while its checkpoint holds the container
        return False
    try:
        return is_frozen(freezer_file(pid))
    except FileNotFoundError:  # the dump was over and ended the source meanwhile
        return False


def freezer_file(pid: int) -> Path:
    """Where the freezer state of ``pid``'s container is: cgroup v1's freezer.state, or
    v2's cgroup.events where runc put the container in the unified hierarchy only (its v1
    freezer line reads "/"). Found once, then read cheaply: a dump can be over in 0.5 s."""
    unified = ""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, rel = line.split(":", 2)
        if "freezer" in controllers.split(",") and rel != "/":
            return Path("/sys/fs/cgroup/freezer", rel.lstrip("/"), "freezer.state")
        if not controllers:
            unified = rel
    root = "/sys/fs/cgroup/unified" if Path("/sys/fs/cgroup/unified").is_dir() else "/sys/fs/cgroup"
    return Path(root, unified.lstrip("/"), "cgroup.events")


def is_frozen(state: Path) -> bool:
    text = state.read_text()
    return text.strip() == "FROZEN" or "frozen 1" in text


def _left(store: Path, out: Path) -> list[str]:
    """What a checkpoint into ``out`` left under ``store`` (nothing, once it is over)."""
    found = [str(p) for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
    found += [str(j) for j in journals(store)]
    if out.exists():
        found.append(str(out))
    return found


def _second_checkpoint_works(containerd, ctr: str, store: Path) -> None:
    out = store / "default" / f"again-{uuid.uuid4().hex[:6]}"
    res = checkpoint(
        CheckpointRequest(
            output=out,
            leave_running=True,
            runc_container=RuncContainer(RUNC_ROOT, ctr, containerd.runc),
        )
    )
    assert res.manifest.size_bytes > 0


@pytest.mark.parametrize("moment", ["quiesce", "pack"])
def test_a_checkpointer_killed_with_the_workload_quiesced(cri, containerd, tmp_path, moment):
    """The agent dies after asking the workload to quiesce (before it answered), or while it
    packs the rootfs diff (the dump done, the source left running but quiesced): either way
    the workload says ready and waits for a resume nobody would send. Recovery resumes it in
    place."""
    c, _ = cri
    ip, ctr, ctl = _pod(cri, tmp_path, {"COUNTER_QUIESCE_GATE": f"{CONTROL}/gate"}, True)
    assert ctl is not None
    if moment == "pack":
        (ctl / "gate").touch()
        c.run("exec", ctr, "sh", "-c", "head -c 100663296 /dev/urandom > /big")
    before = int(ask(ip, PORT, timeout=30)["count"])
    store = tmp_path / "store"
    out = store / "default" / "snap"
    out.parent.mkdir(parents=True)
    proc = _spawn(containerd, ctr, out, ctl, leave=False)
    _wait_for(lambda: journals(store), "the checkpoint's journal")
    if moment == "quiesce":
        _wait_for(lambda: (ctl / CHECKPOINT_REQUESTED).exists(), CHECKPOINT_REQUESTED)
    else:
        _wait_for(
            lambda: any(out.parent.glob(f".{out.name}.staging-*/rootfs-diff.tar")),
            "the rootfs diff being packed",
        )
    _kill(proc)
    (ctl / "gate").touch()  # the workload answers now, to nobody
    # quiesced for good without recovery: ready, and no resume will ever come
    _wait_for(lambda: (ctl / READY_FOR_SNAPSHOT).exists(), READY_FOR_SNAPSHOT)

    done = recover_interrupted(store)
    assert [r.actions for r in done] == [["resumed the quiesced workload in place"]]
    assert int(ask(ip, PORT, timeout=30)["count"]) == before + 1
    assert _left(store, out) == []
    assert recover_interrupted(store) == [], "recovery is done once"
    _second_checkpoint_works(containerd, ctr, store)


def test_a_checkpointer_killed_while_criu_holds_the_container_frozen(cri, containerd, tmp_path):
    """The agent (and its CRIU) die mid-dump: the container's cgroup stays frozen. Recovery
    thaws it, and the source serves with its state."""
    ip, ctr, _ = _pod(cri, tmp_path, {"COUNTER_EXTRA_MB": "768"}, False)
    before = int(ask(ip, PORT, timeout=30)["count"])
    store = tmp_path / "store"
    out = store / "default" / "snap"
    out.parent.mkdir(parents=True)
    freezer = freezer_file(RuncContainer(RUNC_ROOT, ctr, containerd.runc).state()["pid"])
    for _ in range(3):
        proc = _spawn(containerd, ctr, out, None, leave=False)
        # busy-polled, a file read each: CRIU holds the freeze only while it seizes the tree
        wait_until(
            lambda p=proc: is_frozen(freezer) or p.poll() is not None,
            what="the container frozen by CRIU",
            timeout=60,
            poll=0,
        )
        # a fail, never a skip: the freeze is seen, or the test is wrong
        assert proc.poll() is None, "the dump was over before its freeze was seen"
        _kill(proc)
        # read from the cgroup itself: runc's state may report no PID while its checkpoint
        # was in flight
        if is_frozen(freezer):  # CRIU's death left the cgroup frozen
            break
        # on a loaded machine CRIU may thaw the tree before the kill lands: the fault
        # missed its window; clean up and inject it again
        recover_interrupted(store)
        shutil.rmtree(out, ignore_errors=True)
    else:
        pytest.fail("the kill never landed while CRIU held the container frozen (3 tries)")

    done = recover_interrupted(store)
    assert len(done) == 1 and any("thawed container" in a for a in done[0].actions), done
    assert not _frozen(ctr, containerd.runc)
    assert int(ask(ip, PORT, timeout=30)["count"]) == before + 1
    assert _left(store, out) == []
    _second_checkpoint_works(containerd, ctr, store)


def _tree_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


@pytest.mark.parametrize("phase", ["criu images", "rootfs diff"])
def test_a_full_store_leaves_the_source_serving(cri, containerd, tmp_path, phase):
    """ENOSPC in the CRIU dump or in the rootfs diff, without keepSourceRunning: one clear
    error, the source keeps serving (the dump never ends it before the commit), nothing
    half-written stays."""
    c, _ = cri
    ip, ctr, _ = _pod(cri, tmp_path, {}, False)
    # 48 MiB of rootfs changes, which go into the artifact's rootfs diff
    c.run("exec", ctr, "sh", "-c", "head -c 50331648 /dev/urandom > /big")
    before = int(ask(ip, PORT, timeout=30)["count"])
    runc = RuncContainer(RUNC_ROOT, ctr, containerd.runc)
    dense = tmp_path / "dense"
    checkpoint(
        CheckpointRequest(
            output=dense, runc_container=runc, leave_running=True, keep_zero_pages=True
        )
    )
    # CRIU's images and the memory file: all but the rootfs diff
    images = _tree_bytes(dense) - (dense / "rootfs-diff.tar").stat().st_size
    # room for a part of the images, or for all of them and a part of the rootfs diff
    size = images // 2 if phase == "criu images" else images + (16 << 20)
    store = tmp_path / "store"
    store.mkdir()
    opts = f"size={size},mode=0755"
    subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "snapshot-test", str(store)], check=True)
    try:
        out = store / "snap"
        with pytest.raises(SnapshotError) as e:
            checkpoint(CheckpointRequest(output=out, runc_container=runc))
        msg = str(e.value)
        if phase == "rootfs diff":
            assert msg.startswith("checkpoint failed: No space left on device"), msg
            assert msg.endswith("the source keeps running") and "\n" not in msg, msg
        else:  # CRIU's own failure comes with its error lines, which name the cause
            assert msg.startswith("criu dump (runc checkpoint) failed"), msg
            assert "No space left on device" in msg, msg
        assert int(ask(ip, PORT, timeout=30)["count"]) == before + 1, "the source serves"
        assert runc.state()["status"] == "running"
        assert _left(store, out) == []
        assert not any(store.iterdir()), sorted(store.iterdir())
    finally:
        subprocess.run(["umount", "-l", str(store)], check=False)
    # without the full store, the same checkpoint ends the source only after its commit
    res = checkpoint(CheckpointRequest(output=tmp_path / "whole", runc_container=runc))
    assert json.loads((res.path / "manifest.json").read_text())["files"]
    _wait_for(lambda: not _running(runc), "the source ended", 30)


def _running(c: RuncContainer) -> bool:
    try:
        return c.state().get("status") == "running"
    except SnapshotError:  # containerd deleted it
        return False
