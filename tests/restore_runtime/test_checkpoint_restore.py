"""Checkpoint and restore of a real process tree with real CRIU (root).

Cases: state and a listening TCP socket survive; two restores from one artifact; the
handshake quiesces and resumes the workload; --leave-running keeps the source serving;
signed artifacts restore with the key and not with another; a failed dump (full disk, no
such PID) leaves no artifact and the source running; a tampered artifact is refused before
anything runs; the restore report and timings are recorded.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from api.handshake import READY_FOR_SNAPSHOT, RESTORE_COMPLETE
from devnode import tamper_pages
from restore_runtime import procs
from restore_runtime.artifact import signing
from restore_runtime.errors import CriuError, SnapshotError, VerificationError
from restore_runtime.executor.checkpoint import CheckpointRequest, checkpoint
from restore_runtime.executor.restore import RestoreRequest, restore
from tests.conftest import requires_criu
from tests.helpers import (
    BACKLOG_LISTENER,
    ask,
    connect,
    kill,
    restore_cli,
    snapshotctl,
    start_counter,
)

pytestmark = [requires_criu, pytest.mark.root]


@pytest.fixture
def ctl(tmp_path: Path) -> Path:
    """The control directory of the handshake."""
    d = tmp_path / "ctl"
    d.mkdir()
    return d


def test_state_and_listening_socket_survive(tmp_path, cleanup_pids):
    pid, port = start_counter(tmp_path)
    cleanup_pids.append(pid)
    before = [ask("127.0.0.1", port) for _ in range(3)]
    assert before[-1]["count"] == "3"

    art = tmp_path / "art"
    out = snapshotctl("checkpoint", "--pid", str(pid), "--output", str(art), "--json")
    result = json.loads(out.stdout)
    assert result["cuda"] is False  # a CPU-only tree is detected; CUDA steps are skipped
    assert {"setup", "criu", "pack", "total"} <= set(result["timings"])
    assert not Path(f"/proc/{pid}").exists(), "source must be gone after a plain dump"

    rpid, report = restore_cli(art, tmp_path)
    cleanup_pids.append(rpid)
    after = ask("127.0.0.1", port)
    assert after["count"] == "4", "the counter continues from the checkpoint"
    assert after["digest"] == before[0]["digest"], "memory contents came back"
    assert after["nspid"] == "1", "restored as PID 1 of a fresh PID namespace"
    assert report["outcome"] == "restored"
    assert {"verify", "setup", "criu", "wake", "total"} <= set(report["timings"])
    assert report["manifestDigest"].startswith("sha256:")


def test_connection_in_the_accept_queue_does_not_fail_the_dump(tmp_path, cleanup_pids):
    """Regression: a connection the workload has not accepted yet (a kubelet tcpSocket probe
    that arrives while CRIU freezes the tree) failed the whole dump ("In-flight connection");
    it is left out of the dump, and the restored listener serves new connections."""
    pid, port = start_counter(tmp_path, script=BACKLOG_LISTENER)
    cleanup_pids.append(pid)
    art = tmp_path / "art"
    with connect("127.0.0.1", port):  # never accepted: in flight for CRIU
        snapshotctl("checkpoint", "--pid", str(pid), "--output", str(art), "--json")
    rpid, report = restore_cli(art, tmp_path)
    cleanup_pids.append(rpid)
    assert report["outcome"] == "restored"
    connect("127.0.0.1", port, timeout=10).close()


def test_restore_twice_from_one_artifact(tmp_path, cleanup_pids):
    pid, port = start_counter(tmp_path)
    cleanup_pids.append(pid)
    ask("127.0.0.1", port)
    art = tmp_path / "art"
    snapshotctl("checkpoint", "--pid", str(pid), "--output", str(art))
    for _ in range(2):
        rpid, _ = restore_cli(art, tmp_path)
        assert ask("127.0.0.1", port)["count"] == "2"
        kill(rpid)
    # restoring left the artifact untouched: it still verifies
    assert snapshotctl("verify", str(art)).stdout.strip() == "OK"


def test_handshake_quiesces_and_resumes(tmp_path, ctl, cleanup_pids):
    pid, port = start_counter(tmp_path, control_dir=ctl)
    cleanup_pids.append(pid)
    ask("127.0.0.1", port)
    art = tmp_path / "art"
    res = checkpoint(CheckpointRequest(pid=pid, output=art, control_dir=ctl))
    assert "quiesce" in res.manifest.timings
    report = restore(RestoreRequest(artifact=art, control_dir=ctl))
    cleanup_pids.append(report.pid)
    assert (ctl / RESTORE_COMPLETE).exists()
    # the workload was blocked in its handshake and serves again only after restore-complete
    assert ask("127.0.0.1", port)["count"] == "2"
    log = (tmp_path / f"counter-{port}.log").read_text()
    assert "resumed mode=restored" in log


def test_gpu_use_is_asked_once_the_workload_is_quiesced(tmp_path, ctl, cleanup_pids, monkeypatch):
    """A workload still starting when its checkpoint begins opens the GPU during the
    handshake's wait (the GPU machine's first capture through Kubernetes: CUDA was looked
    for before the quiesce, found missing, and CRIU met the device's mappings). The CUDA
    lookup is observed, not faked: it answers as before, and records whether the workload
    had said it was quiesced at that moment."""
    seen: list[bool] = []
    real = procs.cuda_pids

    def watched(root: int) -> list[int]:
        seen.append((ctl / READY_FOR_SNAPSHOT).exists())
        return real(root)

    monkeypatch.setattr(procs, "cuda_pids", watched)
    pid, port = start_counter(tmp_path, control_dir=ctl)
    cleanup_pids.append(pid)
    ask("127.0.0.1", port)
    res = checkpoint(CheckpointRequest(pid=pid, output=tmp_path / "art", control_dir=ctl))
    assert res.manifest.cuda.ns_pids == []  # a CPU process: none
    assert seen and all(seen), f"CUDA looked for before the quiesce: {seen}"


def test_handshake_timeout_is_clear_and_leaves_nothing(tmp_path, ctl, cleanup_pids):
    pid, port = start_counter(tmp_path)  # not handshake-aware
    cleanup_pids.append(pid)
    art = tmp_path / "art"
    with pytest.raises(SnapshotError, match="ready-for-snapshot"):
        checkpoint(CheckpointRequest(pid=pid, output=art, control_dir=ctl, handshake_timeout_s=0.3))
    assert not art.exists()
    assert list(tmp_path.glob(".art.staging-*")) == []
    assert ask("127.0.0.1", port)["count"] == "1"


def test_leave_running_keeps_source_serving(tmp_path, ctl, cleanup_pids):
    pid, port = start_counter(tmp_path, control_dir=ctl)
    cleanup_pids.append(pid)
    ask("127.0.0.1", port)
    art = tmp_path / "art"
    snapshotctl(
        "checkpoint",
        "--pid",
        str(pid),
        "--output",
        str(art),
        "--leave-running",
        "--control-dir",
        str(ctl),
    )
    assert ask("127.0.0.1", port)["count"] == "2", "the source continues after the dump"
    assert "resumed mode=resumed-in-place" in (tmp_path / f"counter-{port}.log").read_text()
    kill(pid)
    rpid, _ = restore_cli(art, tmp_path)
    cleanup_pids.append(rpid)
    assert ask("127.0.0.1", port)["count"] == "2", "the replica starts from the dumped state"


def test_signed_artifact_needs_matching_key(tmp_path, ctl, cleanup_pids):
    priv, pub = tmp_path / "k", tmp_path / "k.pub"
    other_priv, other_pub = tmp_path / "o", tmp_path / "o.pub"
    snapshotctl("keygen", "--private", str(priv), "--public", str(pub))
    signing.generate_keypair(other_priv, other_pub)
    pid, port = start_counter(tmp_path)
    cleanup_pids.append(pid)
    art = tmp_path / "art"
    snapshotctl("checkpoint", "--pid", str(pid), "--output", str(art), "--sign-key", str(priv))
    bad = snapshotctl(
        "restore", str(art), "--verify-key", str(other_pub), "--control-dir", str(ctl), check=False
    )
    assert bad.returncode == 1
    assert "signature" in bad.stderr
    report = json.loads((ctl / "restore-report.json").read_text())
    assert report["outcome"] == "failed" and report["failedPhase"] == "verify"
    assert "manifest.sig" in report["reason"]
    assert ask_fails(port), "nothing may run after a failed verification"
    rpid, _ = restore_cli(art, tmp_path, "--verify-key", str(pub))
    cleanup_pids.append(rpid)
    assert ask("127.0.0.1", port)["count"] == "1"


def ask_fails(port: int) -> bool:
    try:
        ask("127.0.0.1", port, timeout=0.3)
    except AssertionError:
        return True
    return False


def test_tampered_artifact_is_refused_before_anything_runs(tmp_path, cleanup_pids):
    pid, port = start_counter(tmp_path)
    cleanup_pids.append(pid)
    art = tmp_path / "art"
    checkpoint(CheckpointRequest(pid=pid, output=art))
    tamper_pages(art, 4096)
    with pytest.raises(VerificationError) as e:
        restore(RestoreRequest(artifact=art))
    assert [p.kind for p in e.value.problems] == ["modified"]
    assert ask_fails(port)


def test_full_disk_during_dump_leaves_no_artifact(tmp_path, cleanup_pids):
    """CRIU runs out of space on a 1 MiB tmpfs (the workload has 16 MiB of state)."""
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], check=True)
    try:
        pid, port = start_counter(tmp_path)
        cleanup_pids.append(pid)
        ask("127.0.0.1", port)
        with pytest.raises(CriuError) as e:
            checkpoint(CheckpointRequest(pid=pid, output=small / "art"))
        assert e.value.log_lines, "the CRIU error lines are carried in the exception"
        assert list(small.iterdir()) == [], "no artifact and no staging directory remain"
        assert ask("127.0.0.1", port)["count"] == "2", "the source keeps running"
    finally:
        subprocess.run(["umount", str(small)], check=False)


def test_checkpoint_errors_are_clear(tmp_path):
    r = snapshotctl("checkpoint", "--pid", "999999", "--output", str(tmp_path / "a"), check=False)
    assert r.returncode == 1
    assert "no process with PID 999999" in r.stderr
    assert not (tmp_path / "a").exists()


def test_existing_output_is_never_overwritten(tmp_path, cleanup_pids):
    pid, _ = start_counter(tmp_path)
    cleanup_pids.append(pid)
    art = tmp_path / "art"
    art.mkdir()
    (art / "keep").write_text("x")
    r = snapshotctl("checkpoint", "--pid", str(pid), "--output", str(art), check=False)
    assert r.returncode == 1 and "already exists" in r.stderr
    assert (art / "keep").read_text() == "x"
    assert Path(f"/proc/{pid}").exists()


def test_failed_restore_leaves_nothing_and_frees_its_pids(tmp_path, cleanup_pids):
    """A restore that fails after CRIU brought the tree back (a tampered page image, found
    while the tree waits stopped) returns only once the tree's PIDs are free, and leaves no
    work directory: an immediate retry from a good copy restores the same PIDs (it used to
    fail with CRIU's "Can't fork for PID: File exists")."""
    import glob
    import shutil

    pid, port = start_counter(tmp_path)
    cleanup_pids.append(pid)
    ask("127.0.0.1", port)
    art, good = tmp_path / "art", tmp_path / "good"
    checkpoint(CheckpointRequest(pid=pid, output=art))
    shutil.copytree(art, good)
    tamper_pages(art, 8192)
    before = set(glob.glob("/tmp/snapshot-restore-*"))
    with pytest.raises(VerificationError):
        restore(RestoreRequest(artifact=art))
    assert set(glob.glob("/tmp/snapshot-restore-*")) == before, "no work directory left"
    report = restore(RestoreRequest(artifact=good))
    cleanup_pids.append(report.pid)
    assert ask("127.0.0.1", port)["count"] == "2"
