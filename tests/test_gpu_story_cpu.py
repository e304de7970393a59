"""The GPU machine's Kubernetes story (bench/gpu/k8s_story.py, issue 43), run here as its CPU
dry run: the same script, cluster (no registry: images imported into containerd as on the
GPU machine), chart install, SnapshotJob, restored and cold Deployments of one replica and the
tampered artifact, with the CPU demo in place of the GPU stand-in and no device plugin.

A GPU machine costs minutes to start and fetches nothing; this keeps its script from meeting,
there, a bug a CPU could have found. The GPU parts (the device plugin, CDI, the CUDA restore)
are not run here: no GPU in CI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from devnode import project_image
from tests.conftest import cluster_marks

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [
    *cluster_marks(),
    pytest.mark.skipif(project_image.missing() is not None, reason=project_image.missing() or ""),
    pytest.mark.timeout(900),
]


def test_the_gpu_story_runs_on_cpu(tmp_path):
    p = subprocess.run(
        [sys.executable, str(ROOT / "bench/gpu/k8s_story.py"), "--cpu", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    result = json.loads((tmp_path / "gpu-k8s-story.json").read_text())
    demo = result["sizes"]["cpu-demo"]
    assert demo["identical"], demo
    cond = demo["restore"]["condition"]
    assert (cond["status"], cond["reason"]) == ("True", "RestoreSucceeded"), cond
    assert "RestoreSucceeded" in {e["reason"] for e in demo["restore"]["events"]}
    fb = demo["fallback"]
    assert (fb["condition"]["reason"], fb["answer_correct"]) == ("FellBackToColdStart", True), fb
    assert f"{fb['flipped']}: blake3 mismatch" in fb["condition"]["message"], fb
    assert result["node"]["container_runtime"].startswith("containerd://2."), result["node"]
