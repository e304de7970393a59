"""AdmissionReview admission.k8s.io/v1: the request fields this webhook reads, validated, and the
response it sends. Anything that does not parse is a 400 with pydantic's message; the body is
bounded in size and nesting before any of it is interpreted, and a Pod's fields that the
decision reads are typed, so a wrongly shaped object is a 400, never an error mid-decision."""

from __future__ import annotations

import base64
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from webhook.mutate import Decision

API_VERSION = "admission.k8s.io/v1"
#: The API server's own request limit is 3 MiB; a review carries the object (and, on UPDATE,
#: the old one), so twice that and a margin is more than any real review.
MAX_BODY = 8 * 1024 * 1024
#: Pods nest a few dozen levels at most (spec.affinity is the deepest); far beyond that is an
#: attack on the parser or on the recursion in the decision.
MAX_DEPTH = 64


class TooLarge(ValueError):
    def __init__(self, size: int) -> None:
        super().__init__(f"AdmissionReview body of {size} bytes is over the {MAX_BODY} limit")


def depth(value: Any) -> int:
    """Nesting depth of a JSON value, without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        deepest = max(deepest, d)
        if d > MAX_DEPTH:
            break
        if isinstance(v, dict):
            todo += [(x, d + 1) for x in v.values()]
        elif isinstance(v, list):
            todo += [(x, d + 1) for x in v]
    return deepest


class PodMeta(BaseModel):
    """The metadata of a Pod as the decision reads it."""

    model_config = ConfigDict(extra="allow")

    name: str = ""
    annotations: dict[str, str] | None = None


class PodShape(BaseModel):
    model_config = ConfigDict(extra="allow")

    metadata: PodMeta = Field(default_factory=PodMeta)
    spec: dict[str, Any] = Field(default_factory=dict)


class GroupVersionKind(BaseModel):
    group: str = ""
    version: str
    kind: str


class AdmissionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    uid: str = Field(min_length=1)
    kind: GroupVersionKind
    operation: str
    namespace: str = ""
    name: str = ""
    object: dict[str, Any] | None = None
    dry_run: bool = Field(default=False, alias="dryRun")

    @model_validator(mode="after")
    def _pod_shape(self) -> AdmissionRequest:
        if self.kind.kind == "Pod" and self.object is not None:
            PodShape.model_validate(self.object)
        return self


class AdmissionReview(BaseModel):
    model_config = ConfigDict(extra="ignore")

    api_version: Literal["admission.k8s.io/v1"] = Field(alias="apiVersion")
    kind: Literal["AdmissionReview"]
    request: AdmissionRequest


def parse(body: bytes) -> AdmissionReview:
    """ValueError (or pydantic's ValidationError) for anything but a well-formed review."""
    data = json.loads(body)
    if depth(data) > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    return AdmissionReview.model_validate(data)


def response(uid: str, decision: Decision) -> dict[str, Any]:
    resp: dict[str, Any] = {"uid": uid, "allowed": decision.allowed}
    if decision.patch:
        resp["patchType"] = "JSONPatch"
        resp["patch"] = base64.b64encode(json.dumps(decision.patch).encode()).decode()
    if decision.warnings:
        resp["warnings"] = decision.warnings
    if not decision.allowed:
        resp["status"] = {"code": 403, "reason": "Forbidden", "message": decision.message}
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": resp}
