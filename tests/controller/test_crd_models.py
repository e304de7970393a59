"""The chart's CRD schemas and the pydantic models of api/crd.py describe the same fields,
so that what the controller writes is what the API server accepts and keeps."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest
import yaml
from pydantic import BaseModel

from api import crd

CRDS = Path(__file__).resolve().parents[2] / "charts" / "snapshot" / "crds"


def model_of(annotation):
    for t in (annotation, *get_args(annotation)):
        if isinstance(t, type) and issubclass(t, BaseModel):
            return t
        for inner in get_args(t):
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                return inner
    return None


def mismatches(model: type[BaseModel], schema: dict, path: str) -> list[str]:
    props = schema.get("properties", {})
    out = []
    fields = {f.alias or name: f for name, f in model.model_fields.items()}
    for name, f in fields.items():
        if name in ("apiVersion", "kind", "metadata"):
            continue
        if name not in props:
            if not schema.get("x-kubernetes-preserve-unknown-fields"):
                out.append(f"{path}.{name}: in the model, not in the CRD")
            continue
        sub = props[name]
        sub = sub.get("items", sub) if sub.get("type") == "array" else sub
        inner = model_of(f.annotation)
        if inner is not None:
            out += mismatches(inner, sub, f"{path}.{name}")
    out += [
        f"{path}.{n}: in the CRD, not in the model"
        for n in props
        if n not in fields and n not in ("apiVersion", "kind", "metadata")
    ]
    return out


@pytest.mark.parametrize(
    "file, model",
    [
        ("podsnapshots.nvidia.com.yaml", crd.PodSnapshot),
        ("snapshotjobs.nvidia.com.yaml", crd.SnapshotJob),
    ],
)
def test_crd_schema_matches_the_model(file, model):
    doc = yaml.safe_load((CRDS / file).read_text())
    (version,) = doc["spec"]["versions"]
    assert doc["spec"]["group"] == crd.GROUP and version["name"] == crd.VERSION
    assert mismatches(model, version["schema"]["openAPIV3Schema"], model.__name__) == []
    assert version["subresources"] == {"status": {}}
