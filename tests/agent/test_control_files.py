"""The root agent reads files in a pod's control directory, which the pod's tenant controls
(restore_runtime/control_files.py ``read_control_file``). Each hostile file must give a clear
refusal at once: never block, never read a host file, never read without bound.

Cases: a small regular file is read; a FIFO (froze the agent), a symlink to /dev/zero
(MemoryError), a symlink to a host file (leaked into the log), an oversized file and a
directory are refused; the checkpoint handshake survives a FIFO ``ready-for-snapshot``;
handshake files the agent writes are readable by a non-root workload."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from api.handshake import READY_FOR_SNAPSHOT, RESTORE_COMPLETE
from restore_runtime import control_files
from restore_runtime.control_files import MAX_CONTROL_FILE, UnsafeControlFile, read_control_file


def read_within(path, seconds=5.0):
    """read_control_file in a thread: a blocking read fails the test instead of hanging it."""
    out: dict = {}

    def run():
        try:
            out["data"] = read_control_file(path)
        except Exception as e:
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"reading {path.name} blocked"
    return out


def test_a_small_regular_file_is_read(tmp_path):
    (tmp_path / "r.json").write_bytes(b'{"ok": true}')
    assert read_within(tmp_path / "r.json")["data"] == b'{"ok": true}'


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "host-file", "oversized", "directory"])
def test_hostile_files_are_refused(tmp_path, kind):
    path = tmp_path / "restore-report.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "host-file":
        (tmp_path / "host-secret").write_text("root:x:0:0")
        path.symlink_to(tmp_path / "host-secret")
    elif kind == "oversized":
        path.write_bytes(b"x" * (MAX_CONTROL_FILE + 1))
    else:
        path.mkdir()
    out = read_within(path)
    assert isinstance(out.get("error"), UnsafeControlFile), out
    assert "root:x" not in str(out["error"])


def test_missing_file_is_not_found(tmp_path):
    assert isinstance(read_within(tmp_path / "absent")["error"], FileNotFoundError)


def test_checkpoint_handshake_survives_a_fifo(tmp_path):
    """The workload answers ``ready-for-snapshot`` with a FIFO: the handshake goes on (with
    no payload) instead of freezing the agent."""
    done = {}

    def workload():
        while not (tmp_path / "checkpoint-requested").exists():
            pass
        os.mkfifo(tmp_path / READY_FOR_SNAPSHOT)

    threading.Thread(target=workload, daemon=True).start()
    t = threading.Thread(
        target=lambda: done.setdefault("r", control_files.request_checkpoint(tmp_path, 10)),
        daemon=True,
    )
    t.start()
    t.join(10)
    assert not t.is_alive() and done["r"] == {}


def test_handshake_files_are_readable_by_the_workload(tmp_path):
    control_files.complete_restore(tmp_path, "10.0.0.2", {"total": 1.0})
    mode = stat.S_IMODE((tmp_path / RESTORE_COMPLETE).stat().st_mode)
    assert mode & 0o044 == 0o044 and not mode & 0o022
