"""AdmissionReview admission.k8s.io/v1: the request fields this webhook reads, validated, and the
response it sends. Anything that does not parse is a 400 with pydantic's message."""

from __future__ import annotations

import base64
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from webhook.mutate import Decision

API_VERSION = "admission.k8s.io/v1"


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


class AdmissionReview(BaseModel):
    model_config = ConfigDict(extra="ignore")

    api_version: Literal["admission.k8s.io/v1"] = Field(alias="apiVersion")
    kind: Literal["AdmissionReview"]
    request: AdmissionRequest


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
