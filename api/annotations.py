"""Annotations on restore pods (the architecture's "Annotations on a restore pod"), parsed in
one place: the webhook reads what the user set, the shim what reached it through the OCI
spec, both through ``RestoreAnnotations.parse`` under the same rules (an unknown value is an
error in both)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

# Set by users.
RESTORE_FROM = "nvidia.com/restore-from"
RESTORE_POLICY = "nvidia.com/restore-policy"
SKIP_COMPAT_CHECK = "nvidia.com/snapshot-skip-compat-check"

# Set by the webhook for the shim; a pod whose user sets any of these is rejected.
INTERNAL_PREFIX = "snapshot.nvidia.com/"
ARTIFACT = "snapshot.nvidia.com/artifact"
MANIFEST_DIGEST = "snapshot.nvidia.com/manifest-digest"
CONTAINER = "snapshot.nvidia.com/container"
INTERNAL_RESTORE_POLICY = "snapshot.nvidia.com/restore-policy"
INTERNAL_KEYS = (ARTIFACT, MANIFEST_DIGEST, CONTAINER, INTERNAL_RESTORE_POLICY)

# Set by the CRI plugin on every container's OCI spec, from the kubelet's sandbox metadata
# (a pod's own annotations cannot override them: only nvidia.com/* and snapshot.nvidia.com/*
# pass through to the spec).
SANDBOX_NAMESPACE = "io.kubernetes.cri.sandbox-namespace"
SANDBOX_UID = "io.kubernetes.cri.sandbox-uid"
SANDBOX_NAME = "io.kubernetes.cri.sandbox-name"
POD_NAMESPACE = "io.kubernetes.pod.namespace"
CONTAINER_NAME = "io.kubernetes.cri.container-name"
CONTAINER_TYPE = "io.kubernetes.cri.container-type"
IMAGE_NAME = "io.kubernetes.cri.image-name"
#: the kubelet's container annotation, passed to the spec by the runtime table's
#: container_annotations: a restart of a restored container starts it cold, as a restart of
#: any container does (restoring the same state again could crash the same way)
RESTART_COUNT = "io.kubernetes.container.restartCount"

# Reported back by the agent.
RESTORED_CONDITION = "nvidia.com/Restored"


class RestorePolicy(StrEnum):
    FALLBACK = "fallback"  # a failed or incompatible restore cold-starts the container
    STRICT = "strict"  # a failed or incompatible restore fails the container


class RestoreOutcome(StrEnum):
    RESTORED = "restored"
    FELL_BACK = "fell-back"
    FAILED = "failed"


class RestoredReason(StrEnum):
    """Reasons of the pod condition ``nvidia.com/Restored``, one per outcome."""

    SUCCEEDED = "RestoreSucceeded"
    FAILED = "RestoreFailed"
    FELL_BACK = "FellBackToColdStart"

    @classmethod
    def of(cls, outcome: RestoreOutcome) -> RestoredReason:
        return {
            RestoreOutcome.RESTORED: cls.SUCCEEDED,
            RestoreOutcome.FAILED: cls.FAILED,
            RestoreOutcome.FELL_BACK: cls.FELL_BACK,
        }[outcome]


class AnnotationError(ValueError):
    """An annotation value that is not one of those allowed; the message says which."""


#: Kubernetes object names (DNS-1123 subdomain): what a PodSnapshot can be called
_DNS_SUBDOMAIN = re.compile(
    r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no", "")


@dataclass(frozen=True)
class RestoreAnnotations:
    """A pod's (or container's) restore annotations, typed."""

    #: the PodSnapshot named by the user
    restore_from: str | None = None
    policy: RestorePolicy = RestorePolicy.FALLBACK
    skip_compat: bool = False
    #: webhook-set: the artifact URI, its admitted manifest digest, the target container
    artifact: str | None = None
    manifest_digest: str | None = None
    container: str | None = None
    #: webhook-set keys present (user-set ones are what the webhook denies)
    internal: tuple[str, ...] = ()

    @classmethod
    def parse(cls, annotations: Mapping[str, str] | None) -> RestoreAnnotations:
        """Parse; AnnotationError for a value outside its set. The webhook's policy key
        wins over the user's (it is the admitted one); absent both, ``fallback``."""
        a = annotations or {}
        raw_from = a.get(RESTORE_FROM)
        if raw_from is not None and (not isinstance(raw_from, str) or not raw_from.strip()):
            raise AnnotationError(
                f"annotation {RESTORE_FROM} is empty; name a PodSnapshot in this namespace"
            )
        if raw_from is not None and not _DNS_SUBDOMAIN.fullmatch(raw_from.strip()):
            raise AnnotationError(
                f"annotation {RESTORE_FROM}={raw_from[:80]!r} is not a PodSnapshot name "
                "(lowercase letters, digits, '-' and '.', at most 253 characters)"
            )
        key = INTERNAL_RESTORE_POLICY if INTERNAL_RESTORE_POLICY in a else RESTORE_POLICY
        raw_policy = a.get(key, RestorePolicy.FALLBACK.value)
        try:
            policy = RestorePolicy(raw_policy)
        except ValueError:
            valid = ", ".join(p.value for p in RestorePolicy)
            raise AnnotationError(f"{key}={raw_policy!r} is not one of: {valid}") from None
        raw_skip = str(a.get(SKIP_COMPAT_CHECK, "")).lower()
        if raw_skip not in _TRUE + _FALSE:
            raise AnnotationError(f"{SKIP_COMPAT_CHECK}={raw_skip!r} is not true or false")
        return cls(
            restore_from=raw_from.strip() if raw_from else None,
            policy=policy,
            skip_compat=raw_skip in _TRUE,
            artifact=a.get(ARTIFACT) or None,
            manifest_digest=a.get(MANIFEST_DIGEST) or None,
            container=a.get(CONTAINER) or None,
            internal=tuple(sorted(k for k in a if k.startswith(INTERNAL_PREFIX))),
        )
