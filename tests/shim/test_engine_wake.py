"""A restore whose engine will not wake, through the CRI and the shim on both containerd
lines. The engine is a stand-in for vLLM whose ``POST /wake_up`` answers 500 (not vLLM),
checkpointed through the ``vllm`` profile. Under ``fallback`` the restored process is killed
and the container cold-starts: a fresh engine, serving from its first request. Under
``strict`` the start fails. Either way the report names the wake and the engine's answer."""

from __future__ import annotations

import json
import uuid

import pytest

from api.handshake import RESTORE_REPORT
from api.quiesce import Engine, Quiesce
from devnode import workloads
from devnode.containerd import admitted
from tests.helpers import ROOT, get_json
from tests.shim.test_cri_restore import PORT, start_pod
from tests.shim.test_cri_restore import pytestmark as cri_marks

pytestmark = cri_marks
WAKE_FAILS = [
    "sh",
    "-c",
    f"cd {ROOT} && STANDIN_MODE=wake-fails exec {workloads.VENV_PYTHON} "
    f"tests/workloads/standin_engine.py 0.0.0.0 {PORT}",
]


def generate(ip: str, timeout: float = 120.0) -> dict:
    return get_json(ip, PORT, timeout=timeout)


@pytest.mark.parametrize("policy", ["fallback", "strict"])
def test_a_failed_wake(cri, containerd, tmp_path, policy):
    c, _ = cri
    pod_a, ctr_a, r = start_pod(cri, "engine", handler="runc", command=WAKE_FAILS)
    assert r.returncode == 0, r.stderr
    for _ in range(3):
        last = generate(c.pod_ip(pod_a))
    assert last["count"] == 3
    art = containerd.checkpoint(
        ctr_a, f"snap-{uuid.uuid4().hex[:6]}", quiesce=Quiesce(engine=Engine.VLLM, port=PORT)
    )
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    annotations = admitted(art, **{"snapshot.nvidia.com/restore-policy": policy})
    pod, _, r = start_pod(
        cri, f"wake-{policy}", annotations=annotations, control=ctl, command=WAKE_FAILS
    )
    report = json.loads((ctl / RESTORE_REPORT).read_text())
    assert report["failedPhase"] == "wake", report
    assert "POST /wake_up: HTTP 500" in report["reason"]
    if policy == "fallback":
        assert r.returncode == 0, r.stderr
        assert report["outcome"] == "fell-back"
        assert generate(c.pod_ip(pod))["count"] == 1, "a cold start, not the restored tree"
    else:
        assert r.returncode != 0
        assert "restore failed in wake" in r.stderr
        assert report["outcome"] == "failed"
