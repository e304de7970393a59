"""The containerd fixtures live in tests/conftest.py (the node-flow tests share them); the CRI
client for the shim's tests is here."""

from __future__ import annotations

import pytest

from devnode.cri import Crictl


@pytest.fixture
def cri(containerd, tmp_path):
    """crictl against the session's containerd, and the pods to remove afterwards."""
    c = Crictl(containerd.address, tmp_path)
    pods: list[str] = []
    yield c, pods
    for p in pods:
        c.remove_pod(p)
