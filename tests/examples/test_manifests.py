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
    "Service": "/api/v1/namespaces/default/services",
    "PersistentVolumeClaim": "/api/v1/namespaces/default/persistentvolumeclaims",
}
FOLDERS = sorted({p.parent for p in MANIFESTS if (p.parent / "snapshotjob.yaml").exists()})


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_manifest_is_accepted_by_the_api_server(control_plane, path):
    with control_plane.client() as c:
        for d in docs(path):
            r = c.post(PATHS[d["kind"]], params={"dryRun": "All"}, json=d)
            assert r.status_code == 201, f"{path}: {r.text}"


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_deployment_restores_from_its_snapshot_job(folder):
    (job,) = docs(folder / "snapshotjob.yaml")
    (dep,) = [d for d in docs(folder / "deployment.yaml") if d["kind"] == "Deployment"]
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


@pytest.mark.parametrize("folder", sorted(ENGINES))
def test_engine_examples_run_as_given(folder):
    """Operations issue: the engine examples named a gated model without a token, had no
    model cache, /dev/shm or Service. Each pod (source and replicas) now takes HF_TOKEN from
    a Secret, caches the weights on the shared claim (examples/model-cache.yaml), has a
    memory /dev/shm, and a Service selects the replicas on their named port."""
    (claim,) = docs(EXAMPLES / "model-cache.yaml")
    (job,) = docs(EXAMPLES / folder / "snapshotjob.yaml")
    dep, svc = docs(EXAMPLES / folder / "deployment.yaml")
    for pod in (job["spec"]["podTemplate"], dep["spec"]["template"]):
        (c,) = pod["spec"]["containers"]
        env = {e["name"]: e for e in c["env"]}
        assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}
        assert env["HF_HOME"]["value"] == "/models"
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert (
            volumes[mounts["/models"]]["persistentVolumeClaim"]["claimName"]
            == claim["metadata"]["name"]
        )
        assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert svc["kind"] == "Service"
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert svc["spec"]["ports"][0]["targetPort"] in {
        p["name"] for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"]
    }
