"""The signer's decision alone (pure), for the states the API-server test does not reach:
a PodSnapshot being deleted, one already Failed, one that already has an artifact although
it says Checkpointing again, and the happy path it shares with it."""

from __future__ import annotations

import pytest

from api.crd import ArtifactRef, PodSnapshot
from api.manifest import Compat, FileEntry, Manifest, Source
from api.signer import SignRequest
from signer.policy import Caller, refusal

AGENT = "system:serviceaccount:snapshot-system:agent"
CALLER = Caller(AGENT, "node-a")


def snap(conditions: list[dict], **meta) -> PodSnapshot:
    return PodSnapshot.model_validate(
        {
            "metadata": {"name": "s", "namespace": "t", "uid": "u1", **meta},
            "spec": {"source": {"podRef": {"name": "p"}}},
            "status": {"source": {"nodeName": "node-a"}, "conditions": conditions},
        }
    )


CHECKPOINTING = {"type": "Ready", "status": "False", "reason": "Checkpointing"}
MANIFEST = Manifest(
    source=Source(pid=1, hostname="h", namespace="t", podSnapshot="s", podSnapshotUid="u1"),
    compat=Compat(arch="x86_64", kernel="6.1", criuVersion="4.2.1"),
    files=[FileEntry(path="criu/core-1.img", size=1, digest="0" * 64)],
)
REQ = SignRequest.of("t", "s", "u1", MANIFEST.to_json())
POD = {"metadata": {"name": "p", "namespace": "t", "uid": "pod-1"}, "spec": {"nodeName": "node-a"}}


def test_a_podsnapshot_being_captured_on_the_callers_node_is_signed():
    assert refusal(CALLER, AGENT, REQ, snap([CHECKPOINTING]), MANIFEST, POD) is None


def test_a_podsnapshot_being_deleted_is_refused():
    s = snap([CHECKPOINTING], deletionTimestamp="2026-12-05T00:00:00Z")
    assert "being deleted" in (refusal(CALLER, AGENT, REQ, s, MANIFEST, POD) or "")


def test_a_failed_podsnapshot_is_refused():
    failed = {"type": "Failed", "status": "True", "reason": "CheckpointFailed"}
    why = refusal(CALLER, AGENT, REQ, snap([CHECKPOINTING, failed]), MANIFEST, POD) or ""
    assert "not being checkpointed" in why


def test_a_podsnapshot_that_already_has_an_artifact_is_refused_even_if_reopened():
    """Isolation round 3, attack 1: a finished PodSnapshot moved back to Checkpointing (by a
    party the admission policy does not stop) got any manifest signed. One that already
    names an artifact is never signed for again."""
    s = snap([CHECKPOINTING])
    s.status.artifact = ArtifactRef(
        uri="file:///x", manifestDigest="sha256:" + "a" * 64, sizeBytes=1
    )
    assert "already has an artifact" in (refusal(CALLER, AGENT, REQ, s, MANIFEST, POD) or "")


@pytest.mark.parametrize(
    ("namespace", "name", "uid"),
    [("other", "s", "u1"), ("t", "other", "u1"), ("t", "s", "u2")],
    ids=["namespace", "name", "uid"],
)
def test_a_manifest_bound_to_anything_else_is_refused(namespace, name, uid):
    """Isolation round 3, a test that checked less: only another namespace was tried, so
    a binding check that compared the namespace alone would have passed. Each of the three
    parts is checked on its own."""
    source = Source(pid=1, hostname="h", namespace=namespace, podSnapshot=name, podSnapshotUid=uid)
    other = MANIFEST.model_copy(update={"source": source})
    why = refusal(CALLER, AGENT, REQ, snap([CHECKPOINTING]), other, POD) or ""
    assert "the manifest is bound to" in why, why


@pytest.mark.parametrize(
    ("pod", "pinned", "why"),
    [
        (None, None, "its source pod p does not exist"),
        ({**POD, "spec": {"nodeName": "node-b"}}, None, "runs on node node-b, not on node-a"),
        ({**POD, "spec": {}}, None, "runs on node (none)"),
        (POD, "pod-2", "has uid pod-1, not pod-2"),
    ],
    ids=["gone", "elsewhere", "unscheduled", "another-uid"],
)
def test_the_source_pod_itself_must_run_on_the_callers_node(pod, pinned, why):
    """Isolation round 3, attack 2: the node a PodSnapshot is handed to is the controller's
    write, and the controller's token could hand any PodSnapshot to any node. The signer
    now checks the source pod itself: on the caller's node, and the pinned pod uid."""
    s = snap([CHECKPOINTING])
    s.spec.source.pod_ref.uid = pinned
    assert why in (refusal(CALLER, AGENT, REQ, s, MANIFEST, pod) or "")
