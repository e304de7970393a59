"""kubeclient.watch against a real kube-apiserver: a collection is listed, then each change
arrives as it happens (not on a clock), nothing arrives while nothing changes, and a watch
the server ends is resumed without missing or repeating changes."""

from __future__ import annotations

import asyncio
import time

import pytest

from kubeclient import api as kube
from kubeclient import watch

pytestmark = pytest.mark.slow


def snapshot(ns: str, name: str) -> dict:
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "PodSnapshot",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"source": {"podRef": {"name": "src"}, "containers": ["main"]}},
    }


async def _until(what: str, cond, timeout: float = 10.0) -> float:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"{what}: not within {timeout:g}s")
        await asyncio.sleep(0.02)
    return time.monotonic() - t0


async def test_follow_lists_then_delivers_each_change_once(control_plane, ns, monkeypatch):
    # the server ends each watch after a second: the resumed watch must still see changes
    monkeypatch.setattr(watch, "WATCH_TIMEOUT", 1)
    url = f"/apis/nvidia.com/v1alpha1/namespaces/{ns}/podsnapshots"
    with control_plane.client() as c:
        assert c.post(url, json=snapshot(ns, "before")).status_code == 201
    got: list[dict | None] = []

    def mine() -> list[str]:
        return [
            o["metadata"]["name"] for o in got if o is not None and o["metadata"]["namespace"] == ns
        ]

    async with await kube.api_client(str(control_plane.kubeconfig)) as api:
        task = asyncio.create_task(watch.follow(kube.pod_snapshots(api).source(), got.append))
        try:
            await _until("the list", lambda: None in got)
            assert mine() == ["before"], "what exists is listed, then the list's end"
            await asyncio.sleep(2.5)  # nothing changes; watches end and resume: nothing new
            assert mine() == ["before"]

            with control_plane.client() as c:
                assert c.post(url, json=snapshot(ns, "one")).status_code == 201
            latency = await _until("the create's event", lambda: "one" in mine())
            assert latency < 5  # a watch event, not a clock
            await asyncio.sleep(1.5)
            assert mine() == ["before", "one"], "each change once, across resumed watches"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
