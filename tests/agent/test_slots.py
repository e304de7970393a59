"""Isolation round 2, attack 6: a tenant froze a node's agent. Each checkpoint ran on the
event loop's default executor (which the API client uses too) and parked its thread in the
handshake wait; some dozens of PodSnapshots of one pod that never answers stopped every
other namespace's checkpoints, restore reports and deletions for the handshake timeout.
Real threads blocked as that handshake blocks them; the agent's own CheckpointSlots."""

from __future__ import annotations

import asyncio
import threading

from agent.slots import CheckpointSlots


async def test_a_namespace_that_never_quiesces_holds_only_its_share():
    slots = CheckpointSlots(total=4, per_namespace=2)
    never = threading.Event()  # the tenant's workload: its handshake never answers
    started: list[str] = []

    async def checkpoint(ns: str, pod: str, block: bool) -> str:
        async with slots.hold(ns, pod):
            started.append(f"{ns}/{pod}")
            await slots.run(never.wait if block else (lambda: None))
            return f"{ns}/{pod}"

    # more hung checkpoints than the default executor has threads (min(32, cpus + 4))
    hung = [asyncio.ensure_future(checkpoint("tenant", f"p{i}", True)) for i in range(40)]
    await asyncio.sleep(0.2)
    assert len(started) == 2, "a namespace holds at most its share of the slots"
    try:
        other = await asyncio.wait_for(checkpoint("other", "q", False), 5)
        assert other == "other/q"
        # the loop's default executor (API client calls, file reads) is still free
        assert await asyncio.wait_for(asyncio.to_thread(lambda: 42), 5) == 42
        assert slots.waiting == {"tenant": 40}
    finally:
        never.set()
        await asyncio.gather(*hung)
        slots.shutdown()
    assert slots.waiting == {}


async def test_one_checkpoint_of_a_pod_at_a_time():
    slots = CheckpointSlots(total=4, per_namespace=4)
    inside, most = 0, 0

    async def checkpoint() -> None:
        nonlocal inside, most
        async with slots.hold("ns", "the-pod"):
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0.05)
            inside -= 1

    await asyncio.gather(*(checkpoint() for _ in range(5)))
    slots.shutdown()
    assert most == 1
