"""Annotation keys on restore pods (ARCHITECTURE.md, "Annotations on a restore pod")."""

from __future__ import annotations

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

# Reported back by the agent.
RESTORED_CONDITION = "nvidia.com/Restored"


class RestorePolicy(StrEnum):
    FALLBACK = "fallback"  # a failed or incompatible restore cold-starts the container
    STRICT = "strict"  # a failed or incompatible restore fails the container


class RestoreOutcome(StrEnum):
    RESTORED = "restored"
    FELL_BACK = "fell-back"
    FAILED = "failed"
