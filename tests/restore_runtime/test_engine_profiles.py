"""Stock engines quiesced and woken through their own HTTP API (restore_runtime/engine_api.py),
with real CRIU, the workload in a network namespace of its own (its API on that namespace's
loopback only, which the engine reaches by entering it). The engines are stand-ins
(tests/workloads/standin_engine.py): the endpoints each profile calls, not the engines.

Cases: for vLLM, SGLang and TensorRT-LLM, quiesced for the dump and woken after the
restore, state kept, the wake timed; for vLLM: a
checkpointer that died with the engine asleep: recovery wakes it; a
checkpoint that keeps the source running wakes it; each broken engine fails the checkpoint
with its reason, leaves no artifact, and the source serves: no sleep endpoints (the flag
named), never reports asleep, a call that hangs past the timeout, an oversized answer; a
restore whose wake fails kills the restored tree and says why."""

from __future__ import annotations

import json
import re
import sys
import time

import pytest

from api.quiesce import Engine, Quiesce
from devnode import free_port
from restore_runtime import procs, sandbox
from restore_runtime.engine_api import EngineApiError, quiesce
from restore_runtime.errors import SnapshotError
from restore_runtime.executor.checkpoint import CheckpointRequest, checkpoint
from restore_runtime.executor.recovery import Journal, give_back
from restore_runtime.executor.restore import RestoreRequest, restore
from restore_runtime.netns import in_netns
from tests.conftest import requires_criu
from tests.helpers import ROOT

pytestmark = [requires_criu, pytest.mark.root]
STANDIN = ROOT / "tests" / "workloads" / "standin_engine.py"


def generate(ns: str, port: int) -> dict:
    """GET /generate from inside the namespace (the host cannot reach its loopback)."""
    import http.client

    def get() -> dict:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request("GET", "/generate")
            r = conn.getresponse()
            return {"status": r.status, **json.loads(r.read() or b"{}")}
        finally:
            conn.close()

    return in_netns(f"/run/netns/{ns}", get)


def start(
    tmp_path, ns: str, cleanup_pids, mode: str = "ok", engine: str = "vllm"
) -> tuple[int, int]:
    port = free_port()
    pid = sandbox.start(
        [sys.executable, str(STANDIN), "127.0.0.1", str(port)],
        tmp_path / f"standin-{port}.log",
        netns=ns,
        env={"STANDIN_MODE": mode, "STANDIN_ENGINE": engine},
    )
    cleanup_pids.append(pid)
    for _ in range(100):
        try:
            generate(ns, port)
            return pid, port
        except OSError:
            time.sleep(0.1)
    raise AssertionError("the stand-in never answered")


def vllm(port: int, timeout: int = 30) -> Quiesce:
    return Quiesce(engine=Engine.VLLM, port=port, timeoutSeconds=timeout)


@pytest.mark.parametrize("engine", [Engine.VLLM, Engine.SGLANG, Engine.TRTLLM])
def test_asleep_for_the_dump_and_woken_after_the_restore(tmp_path, netns, cleanup_pids, engine):
    """vLLM and SGLang do not serve once quiesced, so serving after the restore proves the
    wake; TensorRT-LLM is drained (its stand-in's requests finish) and checked."""
    pid, port = start(tmp_path, netns, cleanup_pids, engine=engine)
    first = generate(netns, port)
    q = Quiesce(engine=engine, port=port, timeoutSeconds=30)
    res = checkpoint(CheckpointRequest(output=tmp_path / "art", pid=pid, quiesce=q))
    assert res.manifest.quiesce is not None and res.manifest.quiesce.engine == engine
    assert "quiesce" in res.manifest.timings
    report = restore(RestoreRequest(artifact=tmp_path / "art", netns=netns))
    cleanup_pids.append(report.pid)
    assert "wake" in report.timings
    after = generate(netns, port)
    assert after["status"] == 200, "woken: it serves"
    assert (after["count"], after["digest"]) == (first["count"] + 1, first["digest"])


def test_a_source_kept_running_is_woken(tmp_path, netns, cleanup_pids):
    pid, port = start(tmp_path, netns, cleanup_pids)
    checkpoint(
        CheckpointRequest(output=tmp_path / "art", pid=pid, quiesce=vllm(port), leave_running=True)
    )
    assert generate(netns, port)["status"] == 200


@pytest.mark.parametrize(
    ("mode", "timeout", "why"),
    [
        (
            "no-sleep-mode",
            30,
            "has no GET /is_sleeping (404): start vLLM with "
            "VLLM_SERVER_DEV_MODE=1 and --enable-sleep-mode",
        ),
        ("never-sleeps", 2, "no answer to vllm reporting is_sleeping within 2s"),
        ("hangs", 2, "no answer to POST /sleep?level=1 within 2s"),
        ("huge", 30, "answer over 65536 bytes"),
    ],
)
def test_a_broken_engine_fails_the_checkpoint_and_keeps_serving(
    tmp_path, netns, cleanup_pids, mode, timeout, why
):
    pid, port = start(tmp_path, netns, cleanup_pids, mode)
    with pytest.raises(EngineApiError, match=re.escape(why)):
        checkpoint(CheckpointRequest(output=tmp_path / "art", pid=pid, quiesce=vllm(port, timeout)))
    assert not (tmp_path / "art").exists(), "no artifact, not even a partial one"
    assert generate(netns, port)["status"] == 200, "the source serves"


def test_a_wake_that_fails_after_the_restore_kills_the_restored_tree(tmp_path, netns, cleanup_pids):
    pid, port = start(tmp_path, netns, cleanup_pids, "wake-fails")
    checkpoint(CheckpointRequest(output=tmp_path / "art", pid=pid, quiesce=vllm(port)))
    with pytest.raises(SnapshotError, match="POST /wake_up: HTTP 500"):
        restore(RestoreRequest(artifact=tmp_path / "art", netns=netns))
    with pytest.raises(OSError):
        generate(netns, port)  # nothing serves there: the restored tree is gone


def test_a_dead_checkpoints_engine_is_woken_by_recovery(tmp_path, netns, cleanup_pids):
    """A checkpointer killed after it put the engine to sleep leaves a journal; the agent's
    next start (executor/recovery.py) wakes the engine through its API."""
    pid, port = start(tmp_path, netns, cleanup_pids)
    q = vllm(port)
    quiesce(q, f"/proc/{pid}/ns/net")
    assert generate(netns, port)["status"] == 503, "asleep"
    j = Journal(
        pid=pid,
        start_time=procs.start_time(pid) or 0,
        staging="x",
        quiesce=q.model_dump(mode="json"),
    )
    assert give_back(j) == ["woke vllm through its API"]
    assert generate(netns, port)["status"] == 200


@pytest.mark.parametrize("mode", ["infinity", "object", "nested"])
def test_a_hostile_engine_answer_is_one_error_and_the_source_serves(
    tmp_path, netns, cleanup_pids, mode
):
    """Isolation round 3, attack 6: JSON Infinity gave OverflowError, an object where a
    number belongs TypeError, deep nesting RecursionError; the agent catches SnapshotError,
    so its task died and the PodSnapshot stayed Checkpointing (signable). Each is now an
    EngineApiError that fails the checkpoint, and the source is woken."""
    pid, port = start(tmp_path, netns, cleanup_pids, mode, engine="tensorrt-llm")
    q = Quiesce(engine=Engine.TRTLLM, port=port, timeoutSeconds=10)
    with pytest.raises(EngineApiError, match=r"malformed answer|nested too deeply"):
        checkpoint(CheckpointRequest(output=tmp_path / "art", pid=pid, quiesce=q))
    assert not (tmp_path / "art").exists()
    assert generate(netns, port)["status"] == 200, "the source serves"


def test_the_admins_quiesce_bound_wins_over_the_profiles(tmp_path, netns, cleanup_pids):
    """Isolation round 3, attack 4: a tenant's quiesce.timeoutSeconds (up to 3600 s)
    overrode the node's bound (the agent's --handshake-timeout), holding checkpoint slots
    for an hour. The effective timeout is the smaller of the two."""
    pid, port = start(tmp_path, netns, cleanup_pids, "hangs")
    t0 = time.monotonic()
    with pytest.raises(EngineApiError, match="within 2s"):
        checkpoint(
            CheckpointRequest(
                output=tmp_path / "art", pid=pid, quiesce=vllm(port, 3600), handshake_timeout_s=2
            )
        )
    assert time.monotonic() - t0 < 30
    assert generate(netns, port)["status"] == 200, "the source serves"
