"""Leader election through a Lease (kubeclient/leader.py), two candidates against the real
kube-apiserver, as two controller replicas would run.

Cases: exactly one leads; when the leader dies without a word, the other takes over within
the lease duration (and never while the first still leads); when the leader stops
gracefully, it hands the Lease back and the other takes over at once; when the API server
stalls under the leader, it stops its work before its Lease can expire."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from urllib.parse import urlsplit

import pytest
import yaml

from kubeclient import api as kube
from kubeclient.leader import LeaderElector

pytestmark = pytest.mark.slow
DURATION, RETRY = 2.0, 0.2


class Race:
    """Who leads, as the electors report it; the most that ever led at once."""

    def __init__(self) -> None:
        self.leading: set[str] = set()
        self.most = 0
        self.since: dict[str, float] = {}

    def reporter(self, who: str):
        def on_change(leader: bool) -> None:
            if leader:
                self.leading.add(who)
                self.since[who] = time.monotonic()
            else:
                self.leading.discard(who)
            self.most = max(self.most, len(self.leading))

        return on_change


async def _work() -> None:
    await asyncio.Event().wait()


async def _until(cond, timeout: float) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "timed out"
        await asyncio.sleep(0.05)
    return time.monotonic() - t0


@pytest.fixture
async def electors(control_plane):
    name = f"lease-{uuid.uuid4().hex[:6]}"
    race = Race()
    async with await kube.api_client(str(control_plane.kubeconfig)) as api:

        def make(who: str) -> LeaderElector:
            return LeaderElector(
                api,
                "default",
                name,
                who,
                lease_duration=DURATION,
                renew_deadline=DURATION * 0.75,
                retry_period=RETRY,
                on_change=race.reporter(who),
            )

        yield make, race


@pytest.mark.parametrize("graceful", [False, True], ids=["killed", "stopped"])
async def test_one_leader_and_failover(electors, graceful):
    make, race = electors
    a, b = make("a"), make("b")
    task_a = asyncio.ensure_future(a.run(_work, release=graceful))
    await _until(lambda: a.leader, 10)
    task_b = asyncio.ensure_future(b.run(_work))
    await asyncio.sleep(DURATION * 2)  # b watches a renew: it must not take over
    assert race.leading == {"a"} and not b.leader

    task_a.cancel()  # killed: no release; stopped: the Lease is handed back
    with pytest.raises(asyncio.CancelledError):
        await task_a
    # liveness with a 2-core machine's slack; the order of events is what is asserted
    took = await _until(lambda: b.leader, DURATION * 10)
    task_b.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task_b
    assert race.most == 1, "two leaders at once"
    if graceful:
        assert took < DURATION, f"a released lease is taken at once, took {took:.2f}s"
    else:  # never before a's lease could have run out: a was renewing until it died
        assert took > DURATION * 0.5, f"took over {took:.2f}s after the kill"


class FreezableProxy:
    """A TCP proxy to the API server that, once frozen, keeps every connection open and
    forwards nothing more: an API server that stalls mid-flight, as one does under load or
    behind a dead load balancer."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream, self.frozen = upstream, asyncio.Event()

    async def _pipe(self, reader, writer) -> None:
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while data := await reader.read(65536):
                if self.frozen.is_set():
                    await asyncio.Event().wait()
                writer.write(data)
                await writer.drain()

    async def _serve(self, reader, writer) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]


async def test_a_stalled_api_server_stops_the_work_within_the_renew_deadline(
    control_plane, tmp_path
):
    """A renew that hangs (the API server accepts and never answers) must not hold the
    holder's work past renew_deadline: the Lease expires after lease_duration, and another
    replica then leads. Before the fix, the work ran on while the renew call waited."""
    cfg = yaml.safe_load(control_plane.kubeconfig.read_text())
    url = urlsplit(cfg["clusters"][0]["cluster"]["server"])
    proxy = FreezableProxy((url.hostname, url.port))
    port = await proxy.start()
    cfg["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(cfg))
    race = Race()
    async with await kube.api_client(str(kubeconfig)) as api:
        elector = LeaderElector(
            api,
            "default",
            f"lease-{uuid.uuid4().hex[:6]}",
            "a",
            lease_duration=DURATION,
            renew_deadline=DURATION * 0.75,
            retry_period=RETRY,
            on_change=race.reporter("a"),
        )
        run = asyncio.ensure_future(elector.run(_work, release=False))
        await _until(lambda: "a" in race.leading, 10)
        proxy.frozen.set()
        frozen_at = time.monotonic()
        await _until(lambda: "a" not in race.leading, 10)
        stopped_after = time.monotonic() - frozen_at
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
    proxy.server.close()
    assert stopped_after < DURATION, f"worked {stopped_after:.2f}s into a stalled API server"
