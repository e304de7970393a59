"""kubeclient.workqueue: the queue's rules on their own (pure asyncio), then per-object
reconciles against a real kube-apiserver: each object reconciled with its own state, a burst
on one object coalesced, and one failing object retried with backoff while the others go on."""

from __future__ import annotations

import asyncio
import time

import pytest

from kubeclient import api as kube
from kubeclient.workqueue import Watched, WorkQueue, meta, run_per_object
from tests.kubeclient.test_watch import _until, snapshot

A, B = ("PodSnapshot", "ns", "a"), ("PodSnapshot", "ns", "b")


async def test_a_key_queued_many_times_is_taken_once_with_its_newest_state():
    q = WorkQueue()
    q.add(A, {"v": 1})
    q.add(B)
    q.add(A, {"v": 2})
    q.add(A)  # no state: keeps the newest one queued
    assert len(q) == 2
    assert await q.get() == (A, {"v": 2})
    assert await q.get() == (B, None)
    assert len(q) == 0


async def test_a_key_being_reconciled_waits_and_comes_back_after():
    q = WorkQueue()
    q.add(A, {"v": 1})
    assert (await q.get())[0] == A
    q.add(A, {"v": 2})  # an event during the reconcile
    assert len(q) == 0, "never two reconciles of one key at once"
    q.done(A, ok=True)
    assert await asyncio.wait_for(q.get(), 1) == (A, {"v": 2})


async def test_failures_back_off_per_key_and_success_resets():
    q = WorkQueue(base_delay=0.05)
    q.add(A)
    await q.get()
    assert q.done(A, ok=False) == 0.05
    assert len(q) == 0
    t0 = time.monotonic()
    await asyncio.wait_for(q.get(), 1)
    assert time.monotonic() - t0 >= 0.04, "retried after its backoff, not at once"
    assert q.done(A, ok=False) == 0.1  # doubles
    await asyncio.wait_for(q.get(), 1)
    assert q.done(A, ok=True) is None
    q.add(A)
    await q.get()
    assert q.done(A, ok=False) == 0.05  # a success forgot the failures


def c_rv(control_plane, path: str) -> str:
    with control_plane.client() as c:
        return c.get(path).json()["metadata"]["resourceVersion"]


@pytest.mark.slow
async def test_per_object_reconciles_against_the_api_server(control_plane, ns):
    seen: dict[str, list[str]] = {}
    fails = {"bad": 2}

    async def reconcile(key, obj):
        _, namespace, name = key
        if namespace != ns:
            return  # other tests' objects: the source watches the whole cluster
        seen.setdefault(name, []).append(obj["metadata"]["resourceVersion"] if obj else "")
        await asyncio.sleep(0.2)  # events meanwhile wait, coalesced
        if fails.get(name, 0) > 0:
            fails[name] -= 1
            raise RuntimeError("the API said no")

    url = f"/apis/nvidia.com/v1alpha1/namespaces/{ns}/podsnapshots"
    stop = asyncio.Event()
    async with await kube.api_client(str(control_plane.kubeconfig)) as api:
        source = kube.pod_snapshots(api).source()
        watched = [Watched(source, lambda o: [(("PodSnapshot", *meta(o)), o)])]
        task = asyncio.create_task(run_per_object(reconcile, watched, 600, stop))
        try:
            with control_plane.client() as c:
                for name in ("one", "bad"):
                    assert c.post(url, json=snapshot(ns, name)).status_code == 201
            await _until("both reconciled", lambda: "one" in seen and "bad" in seen)
            assert seen["one"][0], "reconciled with the object the event carried"
            await _until(
                "the failing one retried until it succeeds",
                lambda: len(seen["bad"]) >= 3,
                timeout=10,
            )
            assert len(seen["one"]) == 1, "the others are not retried"

            before = len(seen["one"])
            with control_plane.client() as c:  # a burst on one object
                for i in range(15):
                    r = c.patch(
                        f"{url}/one",
                        json={"metadata": {"labels": {"n": str(i)}}},
                        headers={"Content-Type": "application/merge-patch+json"},
                    )
                    assert r.status_code == 200, r.text
            await _until("the burst reconciled", lambda: len(seen["one"]) > before)
            await asyncio.sleep(1)
            assert len(seen["one"]) - before < 15
            assert seen["one"][-1] == c_rv(control_plane, f"{url}/one"), "ends on the newest"
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)
