"""kubeclient.watch against a real kube-apiserver: a pass runs when a watched collection
changes (not on a clock), a burst of changes coalesces, nothing runs while nothing changes,
and a watch the server ends is resumed without missing later changes."""

from __future__ import annotations

import asyncio
import time

import pytest

from kubeclient import api as kube
from kubeclient import watch

pytestmark = pytest.mark.slow


def snapshot(ns: str, name: str) -> dict:
    return {"apiVersion": "nvidia.com/v1alpha1", "kind": "PodSnapshot",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"source": {"podRef": {"name": "src"}, "containers": ["main"]}}}  # fmt: skip


async def _until(what: str, cond, timeout: float = 10.0) -> float:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"{what}: not within {timeout:g}s")
        await asyncio.sleep(0.02)
    return time.monotonic() - t0


async def test_passes_follow_changes_not_a_clock(control_plane, ns, monkeypatch):
    # the server ends each watch after a second: the resumed watch must still see changes
    monkeypatch.setattr(watch, "WATCH_TIMEOUT", 1)
    passes: list[float] = []

    async def pass_once() -> None:
        passes.append(time.monotonic())

    stop = asyncio.Event()
    async with await kube.api_client(str(control_plane.kubeconfig)) as api:
        source = kube.pod_snapshots(api).source()
        task = asyncio.create_task(watch.run_on_changes(pass_once, [source], 600, stop))
        try:
            await _until("the first pass", lambda: len(passes) >= 1)
            await asyncio.sleep(1.5)  # the initial list's own wake-up settles
            settled = len(passes)
            await asyncio.sleep(2.5)  # nothing changes, watches end and resume: no pass
            assert len(passes) == settled

            with control_plane.client() as c:
                r = c.post(f"/apis/nvidia.com/v1alpha1/namespaces/{ns}/podsnapshots",
                           json=snapshot(ns, "one"))  # fmt: skip
                assert r.status_code == 201, r.text
            latency = await _until("a pass after the create", lambda: len(passes) > settled)
            assert latency < 5  # an event, not the 600 s resync

            before = len(passes)
            with control_plane.client() as c:  # a burst: far fewer passes than events
                for i in range(20):
                    c.post(f"/apis/nvidia.com/v1alpha1/namespaces/{ns}/podsnapshots",
                           json=snapshot(ns, f"burst-{i}"))  # fmt: skip
            await _until("a pass after the burst", lambda: len(passes) > before)
            await asyncio.sleep(1)
            assert len(passes) - before < 20
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)
