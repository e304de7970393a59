"""The fail-closed guard: the chart's ValidatingAdmissionPolicy in a real kube-apiserver, with
the chart's MutatingWebhookConfiguration registered but its webhook down (failurePolicy
Ignore: the API server admits without it). Forged annotations must still be rejected.

Cases: internal annotations without nvidia.com/restore-from; an artifact of another
namespace or outside the store; an artifact without its digest; a PATCH that adds an
artifact to a running pod; a PATCH that changes it; and what stays allowed: a restore pod
as the webhook writes it, and unrelated changes (a label) to it."""

from __future__ import annotations

import pytest

from api import annotations as ann
from devnode import chart
from tests.admission_policy import installed_policy
from tests.webhook.objects import pod

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(chart.missing() is not None, reason=chart.missing() or ""),
]
NS = "policy-test"
STORE = "/var/lib/snapshot/artifacts"
DIGEST = "sha256:" + "ab" * 32
JSON_PATCH = {"Content-Type": "application/json-patch+json"}


@pytest.fixture(scope="module")
def guarded(control_plane):
    with installed_policy(control_plane, NS) as c:
        yield c


def webhook_set(ns: str = NS, name: str = "snap") -> dict[str, str]:
    return {
        ann.ARTIFACT: f"file://{STORE}/{ns}/{name}",
        ann.MANIFEST_DIGEST: DIGEST,
        ann.CONTAINER: "main",
        ann.INTERNAL_RESTORE_POLICY: "fallback",
    }


def create(c, body: dict, ns: str = NS):
    return c.post(f"/api/v1/namespaces/{ns}/pods", json=body)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            pod(**{ann.ARTIFACT: f"file://{STORE}/{NS}/x", ann.MANIFEST_DIGEST: DIGEST}),
            "set by the snapshot webhook only",
        ),
        (pod("snap", **webhook_set(ns="tenant-a")), "must name an artifact of namespace"),
        (
            pod("snap", **{**webhook_set(), ann.ARTIFACT: "file:///tmp/mine"}),
            "must name an artifact of namespace",
        ),
        (
            pod("snap", **{**webhook_set(), ann.ARTIFACT: f"file://{STORE}/{NS}/../tenant-a/x"}),
            "must name an artifact of namespace",
        ),
        (
            pod("snap", **{ann.ARTIFACT: f"file://{STORE}/{NS}/x"}),
            "must name an artifact of namespace",
        ),
        (pod("snap", **{"snapshot.nvidia.com/extra": "1"}), "unknown snapshot.nvidia.com/"),
    ],
    ids=[
        "no-restore-from",
        "other-namespace",
        "outside-store",
        "dot-dot",
        "no-digest",
        "unknown-key",
    ],
)
def test_forged_annotations_are_rejected_with_the_webhook_down(guarded, body, message):
    r = create(guarded, body)
    assert r.status_code == 403, r.text
    assert message in r.json()["message"]


def test_annotations_cannot_be_added_or_changed_later(guarded):
    plain = create(guarded, pod())
    assert plain.status_code == 201, plain.text
    name = plain.json()["metadata"]["name"]
    add = [
        {
            "op": "add",
            "path": "/metadata/annotations",
            "value": {ann.RESTORE_FROM: "snap", **webhook_set()},
        }
    ]
    r = guarded.patch(f"/api/v1/namespaces/{NS}/pods/{name}", json=add, headers=JSON_PATCH)
    assert r.status_code == 403 and "immutable" in r.json()["message"], r.text

    restored = create(guarded, pod("snap", **webhook_set()))
    assert restored.status_code == 201, restored.text
    name = restored.json()["metadata"]["name"]
    key = ann.ARTIFACT.replace("/", "~1")
    change = [
        {
            "op": "replace",
            "path": f"/metadata/annotations/{key}",
            "value": f"file://{STORE}/{NS}/other",
        }
    ]
    r = guarded.patch(f"/api/v1/namespaces/{NS}/pods/{name}", json=change, headers=JSON_PATCH)
    assert r.status_code == 403 and "immutable" in r.json()["message"], r.text

    label = [{"op": "add", "path": "/metadata/labels", "value": {"tier": "llm"}}]
    r = guarded.patch(f"/api/v1/namespaces/{NS}/pods/{name}", json=label, headers=JSON_PATCH)
    assert r.status_code == 200, r.text


OCI_NS, REPO = "policy-test-oci", "oci://registry.internal:5000/snaps"


@pytest.fixture(scope="module")
def guarded_oci(control_plane):
    """The same policy rendered for OCI storage (its own name, bound to its own namespace)."""
    values = {"storage.type": "oci", "storage.oci.repository": REPO}
    with installed_policy(control_plane, OCI_NS, values, suffix="-oci") as c:
        yield c


def oci_pod(uri: str) -> dict:
    return pod("snap", **{**webhook_set(ns=OCI_NS), ann.ARTIFACT: uri})


def test_oci_restores_pass_the_policy_as_the_webhook_writes_them(guarded_oci):
    """Isolation round 2, attack 7: with OCI storage the policy forbade every restore pod
    (it knew only file://), so admins had to turn it off."""
    tag = f"{OCI_NS}.snap-0123abcd"
    r = create(guarded_oci, oci_pod(f"{REPO}:{tag}@{DIGEST}"), OCI_NS)
    assert r.status_code == 201, r.text
    # the node's store stays a valid source too
    r = create(guarded_oci, pod("snap", **webhook_set(ns=OCI_NS)), OCI_NS)
    assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    "uri",
    [
        f"{REPO}:tenant-a.snap-0123abcd@{DIGEST}",  # another namespace's tag
        f"oci://registry.evil:5000/snaps:{OCI_NS}.snap-0123abcd@{DIGEST}",  # another registry
        f"{REPO}-other:{OCI_NS}.snap@{DIGEST}",  # another repository
        f"{REPO}:{OCI_NS}.snap-0123abcd",  # not pinned by digest
        f"{REPO}:{OCI_NS}.snap@sha256:1@{DIGEST}",
    ],  # two digests
    ids=["other-namespace", "other-registry", "other-repository", "no-digest", "two-digests"],
)
def test_oci_references_outside_the_namespace_or_unpinned_are_rejected(guarded_oci, uri):
    r = create(guarded_oci, oci_pod(uri), OCI_NS)
    assert r.status_code == 403, r.text
    assert "must name an artifact of namespace" in r.json()["message"]
