"""What recovery (executor/recovery.py) does with each journal a dead checkpoint left,
through real processes and the real ``snapshotctl recover``:

- a journal whose PID now names another process (its start time differs) is never touched:
  no signal, no handshake file, only its staging removed;
- the GPU side: a process left checkpointed is restored then unlocked, one left locked is
  unlocked, one the driver says is running is left alone, through a stand-in CUDA driver
  (no GPU in CI: the stand-in records what the driver would be asked);
- ``snapshotctl recover DIR`` gives back a stopped source (CRIU leaves a dumped tree
  stopped) and says what it did; a second run finds nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from api.handshake import CHECKPOINT_REQUESTED, RESTORE_COMPLETE
from restore_runtime import procs
from restore_runtime.cuda import driver as cuda_driver
from restore_runtime.executor.recovery import Journal, journals, recover_interrupted
from tests.helpers import ROOT


@pytest.fixture
def sleeper():
    p = subprocess.Popen(["sleep", "300"])
    yield p
    p.kill()
    p.wait()


def _journal(store: Path, j: Journal) -> Path:
    staging = store / f".snap.staging-{j.pid}"
    staging.mkdir(parents=True)
    (store / f"{staging.name}-work").mkdir()
    j.staging = staging.name
    path = Journal.path_for(staging)
    j.write(path)
    return path


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def _stop(p: subprocess.Popen) -> None:
    """SIGSTOP, and wait until the kernel shows it stopped (the signal is asynchronous)."""
    p.send_signal(19)
    deadline = time.monotonic() + 5
    while _state(p.pid) != "T" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _state(p.pid) == "T"


def test_a_journal_whose_pid_names_another_process_is_never_touched(tmp_path, sleeper):
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    (ctl / CHECKPOINT_REQUESTED).write_text("{}")
    _stop(sleeper)  # a recovery that touched it would SIGCONT it
    start = procs.start_time(sleeper.pid)
    assert start is not None
    store = tmp_path / "store"
    _journal(
        store, Journal(pid=sleeper.pid, start_time=start + 1, staging="", control_dir=str(ctl))
    )
    done = recover_interrupted(store)
    assert [r.actions for r in done] == [[f"the source (PID {sleeper.pid}) is gone"]]
    assert _state(sleeper.pid) == "T", "another process's PID was signalled"
    assert not (ctl / RESTORE_COMPLETE).exists(), "another process was told to resume"
    assert journals(store) == [] and list(store.iterdir()) == []


class StandInDriver:
    """Not the CUDA driver: answers as it would for three processes and records the calls
    (CI has no GPU)."""

    states: dict[int, str] = {}
    calls: list[tuple[str, int]] = []

    def is_cuda_process(self, pid: int) -> bool:
        return pid in self.states

    def state(self, pid: int) -> str:
        return self.states[pid]

    def restore(self, pid: int, gpu_pairs=None) -> None:
        self.calls.append(("restore", pid))
        self.states[pid] = "locked"

    def unlock(self, pid: int) -> None:
        self.calls.append(("unlock", pid))
        self.states[pid] = "running"


def test_gpu_state_is_handed_back_as_far_as_the_checkpoint_took_it(tmp_path, monkeypatch):
    kids = [subprocess.Popen(["sleep", "300"]) for _ in range(3)]
    try:
        checkpointed, locked, running = (k.pid for k in kids)
        StandInDriver.states = {checkpointed: "checkpointed", locked: "locked", running: "running"}
        StandInDriver.calls = []
        monkeypatch.setattr(cuda_driver, "CudaDriver", StandInDriver)
        root = kids[0].pid
        store = tmp_path / "store"
        _journal(
            store,
            Journal(
                pid=root,
                start_time=procs.start_time(root) or 0,
                staging="",
                cuda_pids=[checkpointed, locked, running],
            ),
        )
        done = recover_interrupted(store)
    finally:
        for k in kids:
            k.kill()
            k.wait()
    assert StandInDriver.calls == [
        ("restore", checkpointed),
        ("unlock", checkpointed),
        ("unlock", locked),
    ]
    assert done[0].actions == [
        f"handed GPU state back to PID {checkpointed}",
        f"handed GPU state back to PID {locked}",
    ]
    assert list(store.iterdir()) == []


def test_snapshotctl_recover_gives_back_a_stopped_source(tmp_path, sleeper):
    _stop(sleeper)  # as CRIU leaves a tree it dumped and then died
    store = tmp_path / "store"
    _journal(
        store, Journal(pid=sleeper.pid, start_time=procs.start_time(sleeper.pid) or 0, staging="")
    )
    cli = [sys.executable, "-m", "restore_runtime.cli"]
    r = subprocess.run(
        [*cli, "recover", "--json", str(store)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["recovered"]) == 1
    assert _state(sleeper.pid) in ("S", "R"), "the stopped source runs again"
    assert list(store.iterdir()) == []
    again = subprocess.run(
        [*cli, "recover", str(store)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert again.stdout.strip() == "nothing to recover", again.stdout
