"""Every example manifest is accepted by a real kube-apiserver with the chart's CRDs (a server-
side dry run: schemas, defaults and CEL rules apply, nothing is stored), and each Deployment
restores from the SnapshotJob beside it, with the container that job captures."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MANIFESTS = sorted(EXAMPLES.glob("**/*.yaml"))
PATHS = {
    "SnapshotJob": "/apis/nvidia.com/v1alpha1/namespaces/default/snapshotjobs",
    "Deployment": "/apis/apps/v1/namespaces/default/deployments",
}


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_manifest_is_accepted_by_the_api_server(control_plane, path):
    with control_plane.client() as c:
        for d in docs(path):
            r = c.post(PATHS[d["kind"]], params={"dryRun": "All"}, json=d)
            assert r.status_code == 201, f"{path}: {r.text}"


@pytest.mark.parametrize(
    "folder", sorted({p.parent for p in MANIFESTS}), ids=lambda p: str(p.relative_to(EXAMPLES))
)
def test_deployment_restores_from_its_snapshot_job(folder):
    (job,) = docs(folder / "snapshotjob.yaml")
    (dep,) = docs(folder / "deployment.yaml")
    template = dep["spec"]["template"]
    assert template["metadata"]["annotations"]["nvidia.com/restore-from"] == job["metadata"]["name"]
    target = job["spec"]["podSnapshotTemplate"]["targetContainers"][0]
    # the replica's container spec is the source's: a fallback cold-starts the same thing
    source = {c["name"]: c for c in job["spec"]["podTemplate"]["spec"]["containers"]}
    replica = {c["name"]: c for c in template["spec"]["containers"]}
    assert target in replica
    assert replica[target]["image"] == source[target]["image"]
    # the engine's command is the same: a fallback cold-starts what was captured
    for key in ("command", "args", "env"):
        assert replica[target].get(key) == source[target].get(key), key


ENGINES = {"vllm": "vllm", "sglang": "sglang", "tensorrt_llm": "tensorrt-llm"}


@pytest.mark.parametrize("folder", sorted(ENGINES))
def test_engine_examples_run_the_published_image_with_no_adapter(folder):
    """Stock engine images, stock entrypoints: the engine's own flags only, quiesced through
    its own API (the PodSnapshot's profile), nothing of ours in the container."""
    (job,) = docs(EXAMPLES / folder / "snapshotjob.yaml")
    assert job["spec"]["podSnapshotTemplate"]["quiesce"]["engine"] == ENGINES[folder]
    for path in (EXAMPLES / folder).glob("*.yaml"):
        text = path.read_text()
        assert "examples." not in text and "snapshot:" not in text.split("image:")[1], path
