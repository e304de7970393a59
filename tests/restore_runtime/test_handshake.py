"""The workload handshake, both sides, through a real control directory.

Cases: request -> quiesce -> ready -> restore-complete -> resume, with the payloads; the
agent's timeout names the missing file and cleans up its request; writes are atomic; the
workload helper imports nothing heavy.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from api.handshake import (
    CHECKPOINT_REQUESTED,
    READY_FOR_SNAPSHOT,
    RESTORE_COMPLETE,
)
from restore_runtime import control_files
from restore_runtime.errors import HandshakeTimeout, SnapshotError
from restore_runtime.workload import Handshake


def test_full_round(tmp_path):
    calls: list[str] = []
    resumed = threading.Event()

    def quiesce():
        calls.append("quiesce")
        return {"inflight": 0}

    def resume(info):
        calls.append(f"resume {info.mode} {info.pod_ip}")
        resumed.set()

    stop = Handshake(tmp_path, poll_s=0.01).serve_in_background(quiesce, resume)
    try:
        ready = control_files.request_checkpoint(tmp_path, timeout_s=5)
        assert ready == {"inflight": 0}
        assert calls == ["quiesce"]
        assert not resumed.is_set(), "the workload waits for restore-complete"
        control_files.complete_restore(tmp_path, "10.0.0.9", {"criu": 1.5})
        assert resumed.wait(5)
        assert calls == ["quiesce", "resume restored 10.0.0.9"]
        assert not (tmp_path / CHECKPOINT_REQUESTED).exists()
        assert not (tmp_path / READY_FOR_SNAPSHOT).exists()
        assert (tmp_path / RESTORE_COMPLETE).exists()
    finally:
        stop.set()


def test_timeout_names_the_missing_file_and_withdraws_the_request(tmp_path):
    with pytest.raises(HandshakeTimeout, match=READY_FOR_SNAPSHOT):
        control_files.request_checkpoint(tmp_path, timeout_s=0.1)
    assert list(tmp_path.iterdir()) == []


def test_missing_control_dir(tmp_path):
    with pytest.raises(SnapshotError, match="does not exist"):
        control_files.request_checkpoint(tmp_path / "nope", timeout_s=0.1)


def test_workload_wait_for_restore_timeout(tmp_path):
    with pytest.raises(TimeoutError, match=RESTORE_COMPLETE):
        Handshake(tmp_path, poll_s=0.01).wait_for_restore(timeout=0.05)


def test_stale_restore_complete_is_cleared_before_a_request(tmp_path):
    (tmp_path / RESTORE_COMPLETE).write_text("{}")
    hs = Handshake(tmp_path, poll_s=0.01)
    t = threading.Thread(target=lambda: (hs.wait_for_checkpoint_request(5), hs.signal_ready()))
    t.start()
    control_files.request_checkpoint(tmp_path, timeout_s=5)
    t.join()
    assert not (tmp_path / RESTORE_COMPLETE).exists()


def test_workload_helper_is_light():
    code = (
        "import sys, restore_runtime.workload; "
        "heavy = ('pydantic', 'cryptography', 'pyroute2', 'cuda'); "
        "heavy = [m for m in heavy if m in sys.modules]; "
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
