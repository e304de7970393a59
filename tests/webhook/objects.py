"""Pods as a tenant writes them, for the admission tests."""

from __future__ import annotations

import uuid

from api import annotations as ann


def pod(restore_from: str | None = None, namespace: str | None = None, **annotations: str) -> dict:
    """A one-container pod with a unique name; ``restore_from`` names its PodSnapshot."""
    a = {ann.RESTORE_FROM: restore_from} if restore_from else {}
    meta = {"name": f"p-{uuid.uuid4().hex[:8]}", "annotations": {**a, **annotations}}
    if namespace:
        meta["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": "main", "image": "registry.local/llm:1"}]},
    }
