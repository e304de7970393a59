"""The admission decision for one pod: a pure function of the pod and the result of looking up
its PodSnapshot, so that every case is a unit test and the HTTP layer stays thin.

Idempotency: a pod is mutated to a fixed point. Admitting the mutated pod again computes the same
annotations, affinity and volume, finds them present, and returns no patch. That also tells our
own annotations apart from a user's: internal annotations are accepted only when they equal
exactly what this webhook would set."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import jsonpatch

from api import annotations as ann
from api.crd import PodSnapshot
from api.node_labels import ARCH_LABEL, DRIVER_VERSION_LABEL, GPU_PRODUCT_LABEL, label_value
from api.podspec import add_control_dir

DEFAULT_RUNTIME_CLASS = "snapshot"

_KUBE_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64le", "s390x": "s390x"}


@dataclass(frozen=True)
class Found:
    snapshot: PodSnapshot


@dataclass(frozen=True)
class NotFound:
    pass


@dataclass(frozen=True)
class Unavailable:
    """The API server could not answer (unreachable, timed out, forbidden, a bad object)."""

    reason: str


Lookup = Found | NotFound | Unavailable


@dataclass
class Decision:
    allowed: bool
    patch: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    message: str = ""  # why it was denied
    result: str = "unchanged"  # for metrics: unchanged | mutated | fell-back | denied

    @classmethod
    def deny(cls, message: str) -> Decision:
        return cls(allowed=False, message=message, result="denied")


def decide(
    pod: dict[str, Any],
    namespace: str,
    lookup: Lookup | None,
    runtime_class: str = DEFAULT_RUNTIME_CLASS,
    pin_to_source: bool = False,
) -> Decision:
    """The admission decision for pod; lookup is None when the pod names no PodSnapshot.
    ``pin_to_source``: artifacts stay on the node that made them (a node-local store)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    try:
        parsed = ann.RestoreAnnotations.parse(annotations)
    except ann.AnnotationError as e:
        internal = {k: v for k, v in annotations.items() if k.startswith(ann.INTERNAL_PREFIX)}
        return Decision.deny(_internal_message(internal) if internal else str(e))
    name, policy = parsed.restore_from, parsed.policy
    user_internal = {k: annotations[k] for k in parsed.internal}
    if name is None or lookup is None:
        if user_internal:
            return Decision.deny(_internal_message(user_internal))
        return Decision(allowed=True)

    problem = _problem(pod, namespace, name, lookup)
    if problem:
        if user_internal:
            return Decision.deny(_internal_message(user_internal))
        if policy is ann.RestorePolicy.STRICT:
            return Decision.deny(f"cannot restore from PodSnapshot {namespace}/{name}: {problem}")
        return Decision(
            allowed=True,
            warnings=[f"PodSnapshot {namespace}/{name}: {problem}; starting without restore"],
            result="fell-back",
        )

    assert isinstance(lookup, Found)
    mutated = mutate(pod, lookup.snapshot, policy, runtime_class, pin_to_source)
    ours = mutated["metadata"]["annotations"]
    foreign = {k: v for k, v in user_internal.items() if ours.get(k) != v}
    if foreign:
        return Decision.deny(_internal_message(foreign))
    warnings = []
    old_class = (pod.get("spec") or {}).get("runtimeClassName")
    if old_class not in (None, runtime_class):
        warnings.append(
            f"runtimeClassName {old_class!r} replaced by {runtime_class!r} to restore the snapshot"
        )
    patch = jsonpatch.make_patch(pod, mutated).patch
    return Decision(
        allowed=True, patch=patch, warnings=warnings, result="mutated" if patch else "unchanged"
    )


def _internal_message(keys: dict[str, str]) -> str:
    return (
        f"annotations {', '.join(sorted(keys))} are set by the snapshot webhook only; "
        f"remove them and use {ann.RESTORE_FROM}"
    )


def _problem(pod: dict[str, Any], namespace: str, name: str, lookup: Lookup) -> str | None:
    match lookup:
        case NotFound():
            return "not found"
        case Unavailable(reason=reason):
            return f"could not be read from the API server ({reason})"
        case Found(snapshot=snap):
            if not snap.ready:
                return "is not Ready" + _failed_reason(snap)
            containers = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
            if snap.container not in containers:
                return (
                    f"captured container {snap.container!r}, which this pod does not have "
                    f"(containers: {', '.join(map(str, containers)) or 'none'})"
                )
    return None


def _failed_reason(snap: PodSnapshot) -> str:
    for c in snap.status.conditions:
        if c.type == "Failed" and c.status == "True":
            return f" (Failed: {c.reason}: {c.message})".replace(": )", ")")
    return ""


def mutate(
    pod: dict[str, Any],
    snap: PodSnapshot,
    policy: ann.RestorePolicy,
    runtime_class: str,
    pin_to_source: bool = False,
) -> dict[str, Any]:
    """A copy of pod that restores snap: the fixed point, so mutate(mutate(p)) == mutate(p).
    ``pin_to_source``: only the node that made the artifact has it (a node-local store), so
    the pod may run there only, whatever the compatibility check says."""
    assert snap.status.artifact is not None and snap.container is not None
    out = copy.deepcopy(pod)
    meta = out.setdefault("metadata", {})
    spec = out.setdefault("spec", {})
    meta.setdefault("annotations", {}).update(
        {
            ann.ARTIFACT: snap.status.artifact.uri,
            ann.MANIFEST_DIGEST: snap.status.artifact.manifest_digest,
            ann.CONTAINER: snap.container,
            ann.INTERNAL_RESTORE_POLICY: policy.value,
        }
    )
    spec["runtimeClassName"] = runtime_class
    skip = meta["annotations"].get(ann.SKIP_COMPAT_CHECK, "").lower() == "true"
    if not skip:
        _require_node_labels(spec, node_requirements(snap))
    if pin_to_source and snap.node_name:
        _require_node_field(spec, "metadata.name", snap.node_name)

    add_control_dir(spec, snap.container)
    return out


def node_requirements(snap: PodSnapshot) -> dict[str, str]:
    """Node labels a restore needs: the source's architecture, GPU product and driver version
    (GPU feature discovery's labels)."""
    src = snap.status.source
    if src is None:
        return {}
    req = {}
    if src.arch:
        req[ARCH_LABEL] = _KUBE_ARCH.get(src.arch, src.arch)
    if src.gpus:
        req[GPU_PRODUCT_LABEL] = label_value(src.gpus[0].product)
        if src.driver_version:
            req[DRIVER_VERSION_LABEL] = label_value(src.driver_version)
    return req


def _require_node_labels(spec: dict[str, Any], labels: dict[str, str]) -> None:
    """ANDs `label In [value]` into every required node selector term (terms are ORed, so each
    one must carry the requirement), creating a term when there is none."""
    for key, value in labels.items():
        _require(spec, "matchExpressions", key, value)


def _require_node_field(spec: dict[str, Any], field: str, value: str) -> None:
    """The same for a node field (``metadata.name``: one node, as the DaemonSet controller
    pins its pods; its hostname label may differ from its name)."""
    _require(spec, "matchFields", field, value)


def _require(spec: dict[str, Any], kind: str, key: str, value: str) -> None:
    required = (
        spec.setdefault("affinity", {})
        .setdefault("nodeAffinity", {})
        .setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    )
    terms = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        exprs = term.setdefault(kind, [])
        wanted = {"key": key, "operator": "In", "values": [value]}
        if wanted not in exprs:
            exprs.append(wanted)
