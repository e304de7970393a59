"""Leader election through a Lease (kubeclient/leader.py), two candidates against the real
kube-apiserver, as two controller replicas would run.

Cases: exactly one leads; when the leader dies without a word, the other takes over once
its Lease has expired (never while the first still leads: not before half a lease; and, with
a 2-core machine's slack, within ten lease durations); when the leader stops
gracefully, it hands the Lease back and the other takes over at once; when the API server
stalls under the leader, it stops its work before its Lease can expire; when it resets its
connections, the leader steps down and campaigns again."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from pathlib import Path
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


async def _until(cond, timeout: float, state=lambda: None) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, f"timed out; {state()}"
        await asyncio.sleep(0.05)
    return time.monotonic() - t0


def _elector(api, name: str, who: str, race: Race) -> LeaderElector:
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


@contextlib.asynccontextmanager
async def _running():
    """Start electors' runs; whatever the test's outcome, none outlives it (a run left going
    would call a closed client, and its unretrieved error would surface in a later test)."""
    tasks: list[asyncio.Future] = []

    def start(aw) -> asyncio.Future:
        tasks.append(asyncio.ensure_future(aw))
        return tasks[-1]

    try:
        yield start
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@pytest.fixture
async def electors(control_plane):
    name = f"lease-{uuid.uuid4().hex[:6]}"
    race = Race()
    async with await kube.api_client(str(control_plane.kubeconfig)) as api, _running() as start:
        yield (lambda who: _elector(api, name, who, race)), race, start


@pytest.mark.parametrize("graceful", [False, True], ids=["killed", "stopped"])
async def test_one_leader_and_failover(electors, graceful):
    make, race, start = electors
    a, b = make("a"), make("b")
    task_a = start(a.run(_work, release=graceful))
    await _until(lambda: a.leader, 10)
    task_b = start(b.run(_work))
    await asyncio.sleep(DURATION * 2)  # b watches a renew: it must not take over
    assert race.leading == {"a"} and not b.leader

    task_a.cancel()  # killed: no release; stopped: the Lease is handed back
    with pytest.raises(asyncio.CancelledError):
        await task_a

    # liveness with a 2-core machine's slack; the order of events is what is asserted
    def seen() -> str:
        return f"b saw {b._seen} {time.monotonic() - b._seen_at:.1f}s ago"

    took = await _until(lambda: b.leader or task_b.done(), DURATION * 10, seen)
    assert not task_b.done(), task_b
    task_b.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task_b
    assert race.most == 1, "two leaders at once"
    if graceful:
        assert took < DURATION, f"a released lease is taken at once, took {took:.2f}s"
    else:  # never before a's lease could have run out: a was renewing until it died
        assert took > DURATION * 0.5, f"took over {took:.2f}s after the kill"


class FaultyProxy:
    """A TCP proxy to the API server that fails on demand. Frozen, it keeps every connection
    open and forwards nothing more: an API server that stalls mid-flight, as one does under
    load or behind a dead load balancer. Broken, it resets every connection, open or new: an
    API server restarting."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream, self.frozen, self.broken = upstream, asyncio.Event(), False
        self.writers: set[asyncio.StreamWriter] = set()

    async def _pipe(self, reader, writer) -> None:
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while data := await reader.read(65536):
                if self.frozen.is_set():
                    await asyncio.Event().wait()
                writer.write(data)
                await writer.drain()

    async def _serve(self, reader, writer) -> None:
        if self.broken:
            writer.transport.abort()
            return
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        self.writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    def break_connections(self) -> None:
        self.broken = True
        for w in self.writers:
            w.transport.abort()
        self.writers.clear()

    async def start(self, kubeconfig: Path, tmp_path: Path) -> Path:
        """Listen; a copy of ``kubeconfig`` that goes through the proxy."""
        cfg = yaml.safe_load(kubeconfig.read_text())
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        cfg["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
        path = tmp_path / "kubeconfig"
        path.write_text(yaml.safe_dump(cfg))
        return path


@pytest.fixture
async def proxied(control_plane, tmp_path):
    """An elector "a" whose API server is reached through a FaultyProxy."""
    cfg = yaml.safe_load(control_plane.kubeconfig.read_text())
    url = urlsplit(cfg["clusters"][0]["cluster"]["server"])
    proxy = FaultyProxy((url.hostname, url.port))
    kubeconfig = await proxy.start(control_plane.kubeconfig, tmp_path)
    race = Race()
    try:
        async with await kube.api_client(str(kubeconfig)) as api, _running() as start:
            elector = _elector(api, f"lease-{uuid.uuid4().hex[:6]}", "a", race)
            yield proxy, elector, race, start
    finally:
        proxy.break_connections()
        proxy.server.close()


async def test_a_stalled_api_server_stops_the_work_within_the_renew_deadline(proxied):
    """A renew that hangs (the API server accepts and never answers) must not hold the
    holder's work past renew_deadline: the Lease expires after lease_duration, and another
    replica then leads. Before the fix, the work ran on while the renew call waited."""
    proxy, elector, race, start = proxied
    start(elector.run(_work, release=False))
    await _until(lambda: "a" in race.leading, 10)
    proxy.frozen.set()
    frozen_at = time.monotonic()
    await _until(lambda: "a" not in race.leading, 10)
    stopped_after = time.monotonic() - frozen_at
    assert stopped_after < DURATION, f"worked {stopped_after:.2f}s into a stalled API server"


async def test_reset_connections_cost_the_lease_not_the_elector(proxied):
    """An API server that resets its connections (restarting, behind a load balancer that
    drops them) makes the holder step down, and it leads again once the server is back.
    Before the fix, the connection error ended ``run`` itself, and with it the component."""
    proxy, elector, race, start = proxied
    run = start(elector.run(_work, release=False))
    await _until(lambda: "a" in race.leading, 10)
    proxy.break_connections()
    await _until(lambda: "a" not in race.leading or run.done(), 10)
    await asyncio.sleep(RETRY * 3)  # a few campaign rounds against the broken server
    assert not run.done(), run
    proxy.broken = False
    await _until(lambda: "a" in race.leading or run.done(), DURATION * 10)
    assert not run.done(), run
