from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from devnode.containerd import Containerd

VENV_BIN = str(Path(__file__).resolve().parents[2] / ".venv" / "bin")


def _containerd_problem() -> str | None:
    if os.geteuid() != 0:
        return "needs root (runs containerd and runc)"
    for tool in ("containerd", "ctr", "runc"):
        if not shutil.which(tool):
            return f"{tool} is not installed (make setup)"
    if not Path(VENV_BIN, "containerd-shim-snapshot-v2").exists():
        return "the shim is not installed in .venv (make venv)"
    return None


CONTAINERD_PROBLEM = _containerd_problem()
requires_containerd = pytest.mark.skipif(
    CONTAINERD_PROBLEM is not None, reason=CONTAINERD_PROBLEM or ""
)


@pytest.fixture(scope="session")
def containerd(tmp_path_factory):
    """A private containerd with our shim on its PATH, for the whole session."""
    if CONTAINERD_PROBLEM:
        pytest.skip(CONTAINERD_PROBLEM)
    base = Path(f"/tmp/snapshot-cd-{uuid.uuid4().hex[:6]}")  # short: unix socket paths
    c = Containerd(base, bin_dirs=[VENV_BIN])
    c.start()
    yield c
    c.stop()
