"""Render the Helm chart with helm (built by tools/build-kube-tools.sh) for tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from devnode.cri import TOOLS_BIN

HELM = TOOLS_BIN / "helm"
CHART = Path(__file__).resolve().parent.parent / "charts" / "snapshot"
KUBE_VERSION = "1.37.2"  # the API server the tests run (tools/kube/go.mod)


class RenderError(Exception):
    pass


def missing() -> str | None:
    return None if HELM.exists() else f"{HELM} not built (make tools)"


def helm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(HELM), *args], capture_output=True, text=True)


def render(
    namespace: str = "snapshot-system",
    release: str = "snap",
    set_values: dict | None = None,
    set_strings: dict | None = None,
) -> list[dict]:
    args = ["template", release, str(CHART), "-n", namespace, "--kube-version", KUBE_VERSION]
    for k, v in (set_values or {}).items():
        args += ["--set", f"{k}={v}"]
    for k, v in (set_strings or {}).items():  # label values: "true" must stay a string
        args += ["--set-string", f"{k}={v}"]
    p = helm(*args)
    if p.returncode != 0:
        raise RenderError(p.stderr.strip())
    return [d for d in yaml.safe_load_all(p.stdout) if d]
