"""Which containers the shim restores, read from the OCI spec through the one annotation
parser (shim/process/restore.py ``RestoreTarget.from_spec``).

Cases: the restored container, with its namespace (the CRI's sandbox namespace), control
directory and network namespace; the pod's sandbox and other containers start normally; a
value outside its set is an error only where there is something to restore."""

from __future__ import annotations

import asyncio

import pytest

from api import annotations as ann
from api.node import NodeConfig
from restore_runtime.node import NodeContext
from shim.process.restore import RestoreFailed, RestoreTarget, wants_warm_up

ART = "file:///var/lib/snapshot/artifacts/team-a/warm"


def spec(**annotations: str) -> dict:
    return {
        "annotations": {ann.CONTAINER_NAME: "main", ann.SANDBOX_NAMESPACE: "team-a", **annotations},
        "process": {"env": ["SNAPSHOT_CONTROL_DIR=/ctl"]},
        "mounts": [{"destination": "/ctl", "source": "/var/lib/kubelet/pods/u/ctl"}],
        "linux": {"namespaces": [{"type": "network", "path": "/run/netns/cni-1"}]},
    }


def test_the_restored_container():
    t = RestoreTarget.from_spec(
        spec(**{ann.ARTIFACT: ART, ann.CONTAINER: "main", ann.INTERNAL_RESTORE_POLICY: "strict"})
    )
    assert t is not None
    assert t.uri == ART
    path, timings = asyncio.run(t.local_artifact(NodeContext.of(NodeConfig())))
    assert str(path) == "/var/lib/snapshot/artifacts/team-a/warm" and timings == {}
    assert t.namespace == "team-a" and t.policy is ann.RestorePolicy.STRICT
    assert str(t.control_dir) == "/var/lib/kubelet/pods/u/ctl" and t.netns == "/run/netns/cni-1"


def test_an_oci_artifact_needs_its_admitted_digest():
    """An oci:// artifact is pulled by the admitted manifest digest (the cache's key); without
    one nothing is pulled, and the restore fails in phase pull."""
    t = RestoreTarget.from_spec(
        spec(**{ann.ARTIFACT: "oci://127.0.0.1:1/snaps/x@sha256:" + "a" * 64})
    )
    assert t is not None
    with pytest.raises(RestoreFailed, match="no admitted manifest digest") as e:
        asyncio.run(t.local_artifact(NodeContext.of(NodeConfig())))
    assert e.value.phase == "pull"


def test_a_malformed_oci_uri_fails_the_pull_before_any_request(tmp_path):
    t = RestoreTarget.from_spec(
        spec(
            **{
                ann.ARTIFACT: "oci://reg/../../etc@sha256:" + "a" * 64,
                ann.MANIFEST_DIGEST: "sha256:" + "b" * 64,
            }
        )
    )
    assert t is not None
    with pytest.raises(RestoreFailed, match="is not oci://") as e:
        asyncio.run(t.local_artifact(NodeContext.of(NodeConfig(store_root=tmp_path))))
    assert e.value.phase == "pull" and not any(tmp_path.rglob("*"))


@pytest.mark.parametrize(
    "annotations",
    [
        {ann.ARTIFACT: ART, ann.CONTAINER_TYPE: "sandbox"},
        {ann.ARTIFACT: ART, ann.CONTAINER: "other"},
        {ann.INTERNAL_RESTORE_POLICY: "bogus"},  # nothing to restore: not an error
        {ann.ARTIFACT: ART, ann.RESTART_COUNT: "1"},  # the kubelet restarts it: cold
    ],
    ids=["sandbox", "other-container", "no-artifact", "restarted"],
)
def test_containers_that_start_normally(annotations):
    assert RestoreTarget.from_spec(spec(**annotations)) is None


def test_an_unknown_value_is_an_error_where_it_matters():
    with pytest.raises(ann.AnnotationError, match="not one of: fallback, strict"):
        RestoreTarget.from_spec(spec(**{ann.ARTIFACT: ART, ann.INTERNAL_RESTORE_POLICY: "bogus"}))


def test_a_restart_restores_again_under_strict():
    t = RestoreTarget.from_spec(
        spec(**{ann.ARTIFACT: ART, ann.RESTART_COUNT: "2", ann.INTERNAL_RESTORE_POLICY: "strict"})
    )
    assert t is not None and t.policy is ann.RestorePolicy.STRICT


def test_the_engine_is_loaded_ahead_for_a_pods_sandbox_and_a_restoring_container():
    """A shim started for a sandbox (the webhook gave the pod this runtime because it
    restores) or for a restoring container loads the engine before the restore asks; one for
    a container that starts normally, or whose annotations are refused, does not."""
    assert wants_warm_up(spec(**{ann.CONTAINER_TYPE: "sandbox"}))
    assert wants_warm_up(spec(**{ann.ARTIFACT: ART}))
    assert not wants_warm_up(spec())
    assert not wants_warm_up(spec(**{ann.ARTIFACT: ART, ann.INTERNAL_RESTORE_POLICY: "maybe"}))
