"""The admission decision, case by case: each test applies the returned JSONPatch to the pod
that was submitted and checks the pod that results."""

from __future__ import annotations

import copy

import jsonpatch
import pytest

from api import annotations as ann
from api.crd import PodSnapshot
from api.node_labels import ARCH_LABEL, DRIVER_VERSION_LABEL, GPU_PRODUCT_LABEL, label_value
from api.podspec import CONTROL_VOLUME
from webhook.mutate import Found, NotFound, Unavailable, decide, node_requirements

DIGEST = "sha256:" + "ab" * 32


def snapshot(ready: bool = True, container: str = "main", gpus: bool = True) -> PodSnapshot:
    status: dict = {
        "conditions": [
            {
                "type": "Ready",
                "status": "True" if ready else "False",
                "reason": "Captured" if ready else "CheckpointPending",
            }
        ],
        "source": {
            "nodeName": "node-a",
            "arch": "x86_64",
            "driverVersion": "570.133.20",
            "gpus": [{"uuid": "GPU-1", "product": "NVIDIA H200", "memoryMiB": 143771}]
            if gpus
            else [],
        },
    }
    if ready:
        status["artifact"] = {
            "uri": "file:///var/lib/snapshot/default/snap-1",
            "manifestDigest": DIGEST,
            "sizeBytes": 4_000_000_000,
        }
    return PodSnapshot.model_validate(
        {
            "metadata": {"name": "snap-1", "namespace": "default"},
            "spec": {"source": {"podRef": {"name": "src"}, "containers": [container]}},
            "status": status,
        }
    )


def pod(annotations: dict | None = None, **spec) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "llm-",
            "annotations": {ann.RESTORE_FROM: "snap-1", **(annotations or {})},
        },
        "spec": {
            "containers": [
                {"name": "main", "image": "vllm:1"},
                {"name": "sidecar", "image": "envoy:1"},
            ],
            **spec,
        },
    }


def admitted(p: dict, lookup) -> tuple[dict, list[str]]:
    d = decide(p, "default", lookup)
    assert d.allowed, d.message
    return jsonpatch.apply_patch(p, d.patch), d.warnings


def main_container(p: dict) -> dict:
    return next(c for c in p["spec"]["containers"] if c["name"] == "main")


def test_ready_snapshot_mutates_the_pod():
    out, warnings = admitted(pod(), Found(snapshot()))
    a = out["metadata"]["annotations"]
    assert a[ann.ARTIFACT] == "file:///var/lib/snapshot/default/snap-1"
    assert a[ann.MANIFEST_DIGEST] == DIGEST
    assert a[ann.CONTAINER] == "main"
    assert a[ann.INTERNAL_RESTORE_POLICY] == "fallback"
    assert out["spec"]["runtimeClassName"] == "snapshot"
    terms = out["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [
        {
            "matchExpressions": [
                {"key": ARCH_LABEL, "operator": "In", "values": ["amd64"]},
                {"key": GPU_PRODUCT_LABEL, "operator": "In", "values": ["NVIDIA-H200"]},
                {"key": DRIVER_VERSION_LABEL, "operator": "In", "values": ["570.133.20"]},
            ]
        }
    ]
    assert {"name": CONTROL_VOLUME, "emptyDir": {}} in out["spec"]["volumes"]
    main = main_container(out)
    assert {"name": CONTROL_VOLUME, "mountPath": "/snapshot-control"} in main["volumeMounts"]
    assert {"name": "SNAPSHOT_CONTROL_DIR", "value": "/snapshot-control"} in main["env"]
    # only the captured container is touched
    assert out["spec"]["containers"][1] == pod()["spec"]["containers"][1]
    assert warnings == []


def test_mutation_is_idempotent():
    first, _ = admitted(pod(), Found(snapshot()))
    again = decide(first, "default", Found(snapshot()))
    assert again.allowed and again.patch == [] and again.result == "unchanged"


def test_the_patch_applies_to_the_object_as_submitted():
    p = pod()
    original = copy.deepcopy(p)
    d = decide(p, "default", Found(snapshot()))
    assert p == original, "decide must not modify its input"
    assert all(op["op"] in ("add", "replace") for op in d.patch)
    jsonpatch.apply_patch(original, d.patch)


def test_existing_node_affinity_terms_each_get_the_requirements():
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                ]
            }
        }
    }
    out, _ = admitted(pod(affinity=affinity), Found(snapshot()))
    terms = out["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    for zone, term in zip("ab", terms, strict=True):
        keys = [e["key"] for e in term["matchExpressions"]]
        assert keys == ["zone", ARCH_LABEL, GPU_PRODUCT_LABEL, DRIVER_VERSION_LABEL]
        assert term["matchExpressions"][0]["values"] == [zone]


def test_skip_compat_check_adds_no_affinity():
    out, _ = admitted(pod({ann.SKIP_COMPAT_CHECK: "true"}), Found(snapshot()))
    assert "affinity" not in out["spec"]
    assert out["spec"]["runtimeClassName"] == "snapshot"


def test_pinning_to_the_source_node_holds_even_without_the_compatibility_check():
    """A node-local store: the artifact is on the source's node only. The pin goes into
    every required term, survives skip-compat (it is about where the bytes are, not about
    compatibility), and is a fixed point."""
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                ]
            }
        }
    }
    pin = [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]
    for p in (pod(affinity=affinity), pod({ann.SKIP_COMPAT_CHECK: "true"})):
        d = decide(p, "default", Found(snapshot()), pin_to_source=True)
        out = jsonpatch.apply_patch(p, d.patch)
        terms = out["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert all(t["matchFields"] == pin for t in terms)
        again = decide(out, "default", Found(snapshot()), pin_to_source=True)
        assert again.patch == [], "mutate(mutate(p)) == mutate(p)"
    out, _ = admitted(pod(), Found(snapshot()))  # shared or OCI storage: not pinned
    assert not any(
        "matchFields" in t
        for t in out["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
    )


def test_cpu_snapshot_pins_only_the_architecture():
    out, _ = admitted(pod(), Found(snapshot(gpus=False)))
    (term,) = out["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": ARCH_LABEL, "operator": "In", "values": ["amd64"]}]


def test_existing_control_dir_env_is_honoured():
    p = pod()
    main_container(p)["env"] = [{"name": "SNAPSHOT_CONTROL_DIR", "value": "/ctl"}]
    out, _ = admitted(p, Found(snapshot()))
    main = main_container(out)
    assert main["env"] == [{"name": "SNAPSHOT_CONTROL_DIR", "value": "/ctl"}]
    assert {"name": CONTROL_VOLUME, "mountPath": "/ctl"} in main["volumeMounts"]


def test_other_runtime_class_is_replaced_with_a_warning():
    out, warnings = admitted(pod(runtimeClassName="nvidia"), Found(snapshot()))
    assert out["spec"]["runtimeClassName"] == "snapshot"
    assert warnings and "'nvidia'" in warnings[0]


def test_strict_policy_is_passed_to_the_shim():
    out, _ = admitted(pod({ann.RESTORE_POLICY: "strict"}), Found(snapshot()))
    assert out["metadata"]["annotations"][ann.INTERNAL_RESTORE_POLICY] == "strict"


@pytest.mark.parametrize(
    "lookup, reason",
    [
        (NotFound(), "not found"),
        (Found(snapshot(ready=False)), "is not Ready"),
        (Found(snapshot(container="worker")), "captured container 'worker'"),
        (Unavailable("no answer within 5s"), "could not be read from the API server"),
    ],
)
def test_problems_fall_back_with_a_warning(lookup, reason):
    d = decide(pod(), "default", lookup)
    assert d.allowed and d.patch == [] and d.result == "fell-back"
    assert len(d.warnings) == 1 and reason in d.warnings[0]
    assert "default/snap-1" in d.warnings[0] and "without restore" in d.warnings[0]


@pytest.mark.parametrize(
    "lookup, reason",
    [
        (NotFound(), "not found"),
        (Found(snapshot(ready=False)), "is not Ready"),
        (Found(snapshot(container="worker")), "does not have"),
        (Unavailable("no answer within 5s"), "no answer within 5s"),
    ],
)
def test_problems_deny_under_strict(lookup, reason):
    d = decide(pod({ann.RESTORE_POLICY: "strict"}), "default", lookup)
    assert not d.allowed and reason in d.message and "default/snap-1" in d.message


def test_failed_snapshot_reason_is_in_the_message():
    snap = snapshot(ready=False)
    snap.status.conditions.append(
        snap.status.conditions[0].model_copy(
            update={
                "type": "Failed",
                "status": "True",
                "reason": "CheckpointFailed",
                "message": "criu dump exited 1",
            }
        )
    )
    d = decide(pod({ann.RESTORE_POLICY: "strict"}), "default", Found(snap))
    assert "CheckpointFailed: criu dump exited 1" in d.message


@pytest.mark.parametrize("key", ann.INTERNAL_KEYS)
def test_user_set_internal_annotation_is_denied(key):
    d = decide(pod({key: "file:///etc"}), "default", Found(snapshot()))
    assert not d.allowed and key in d.message and "set by the snapshot webhook only" in d.message


def test_internal_annotation_without_restore_is_denied():
    p = pod({ann.ARTIFACT: "file:///etc"})
    del p["metadata"]["annotations"][ann.RESTORE_FROM]
    d = decide(p, "default", None)
    assert not d.allowed and ann.ARTIFACT in d.message


def test_internal_annotation_is_denied_even_when_the_snapshot_is_missing():
    d = decide(pod({ann.ARTIFACT: "file:///etc"}), "default", NotFound())
    assert not d.allowed


def test_pod_without_restore_annotation_is_untouched():
    p = pod()
    del p["metadata"]["annotations"][ann.RESTORE_FROM]
    d = decide(p, "default", None)
    assert d.allowed and d.patch == [] and d.warnings == []


@pytest.mark.parametrize("bad", ["", "   "])
def test_empty_restore_from_is_denied(bad):
    d = decide(pod({ann.RESTORE_FROM: bad}), "default", None)
    assert not d.allowed and ann.RESTORE_FROM in d.message


def test_unknown_policy_is_denied():
    d = decide(pod({ann.RESTORE_POLICY: "sometimes"}), "default", Found(snapshot()))
    assert not d.allowed and "fallback, strict" in d.message


def test_pod_without_annotations_or_metadata():
    d = decide({"spec": {"containers": [{"name": "main"}]}}, "default", None)
    assert d.allowed and d.patch == []


@pytest.mark.parametrize(
    "text, label",
    [
        ("NVIDIA H200", "NVIDIA-H200"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB"),
        ("570.133.20", "570.133.20"),
        ("Tesla T4 (rev 2)", "Tesla-T4--rev-2"),
    ],
)
def test_label_value_follows_gpu_feature_discovery(text, label):
    assert label_value(text) == label


def test_an_unexpected_error_never_admits_webhook_only_annotations():
    """The error path (a bug in the decision) admits plain pods, which cold-start, but not
    a pod carrying snapshot.nvidia.com/* annotations: those would reach the shim unchecked."""
    from webhook.app import _on_error
    from webhook.review import AdmissionRequest

    def request(annotations: dict) -> AdmissionRequest:
        return AdmissionRequest.model_validate(
            {
                "uid": "u",
                "kind": {"version": "v1", "kind": "Pod"},
                "operation": "CREATE",
                "object": {"metadata": {"annotations": annotations}},
            }
        )

    forged = _on_error(request({ann.ARTIFACT: "file:///elsewhere"}), RuntimeError("boom"))
    assert not forged.allowed and ann.ARTIFACT in forged.message
    plain = _on_error(request({ann.RESTORE_FROM: "snap"}), RuntimeError("boom"))
    assert plain.allowed and "starting without restore" in plain.warnings[0]


def test_the_gpu_storys_hand_made_node_labels_meet_the_webhooks_requirements(monkeypatch):
    """The GPU story's node has no GPU feature discovery: its labels are made by hand
    (bench/gpu/k8s_node.py). The first GPU run through the kubelet labelled the product only,
    and its restore pod stayed Pending for want of the driver's label. The labels made for
    the source's GPU and driver must hold every label the webhook asks the node for."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "gpu" / "k8s_node.py"
    spec = importlib.util.spec_from_file_location("k8s_node", path)
    k8s_node = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "k8s_node", k8s_node)  # its dataclasses look it up
    spec.loader.exec_module(k8s_node)
    snap = snapshot()
    labels = k8s_node.labels_for("NVIDIA H200", "570.133.20")
    wanted = node_requirements(snap)
    assert wanted.pop(ARCH_LABEL) == "amd64"  # the kubelet's own label, not GFD's
    assert wanted.keys() >= {GPU_PRODUCT_LABEL, DRIVER_VERSION_LABEL}
    missing = {k: v for k, v in wanted.items() if labels.get(k) != v}
    assert missing == {}, f"the hand-made labels lack {missing}"
