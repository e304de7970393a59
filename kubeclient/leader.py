"""Leader election through a ``coordination.k8s.io/v1`` Lease, as client-go's leaderelection
does it: several replicas of a component run; one holds the Lease and works, the others wait
and take over once the holder stops renewing.

- Expiry is judged by the observer's own clock: a candidate notes when it last saw the Lease
  change and takes it only after ``lease_duration`` without a change. Clocks of different
  machines are never compared.
- Every write is a compare-and-swap on the Lease's resourceVersion: two candidates racing
  for an expired Lease cannot both win.
- The holder renews every ``retry_period``; if it cannot renew for ``renew_deadline`` (a
  renew that hangs ends then too) it stops its work before the Lease can expire, so two
  leaders never work at once.
- On a graceful stop the holder releases the Lease (empty holder), so a successor takes over
  at once instead of after ``lease_duration``.

Why not ``kubernetes_asyncio.leaderelection`` (installed): it never releases the Lease (every
rolling update would leave the components without a leader for ``lease_duration``), and
its renew loop puts no deadline on a call, so a renew hung on a stalled API server outlasts
``renew_deadline`` and the Lease itself: its holder would go on working while another
replica takes over. Its compare-and-swap (a replace with the read resourceVersion) is the
same as ours."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from .api import unless_absent

log = logging.getLogger(__name__)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LeaderElector:
    api: client.ApiClient
    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    #: called with True on becoming leader and False on losing it (metrics, logs)
    on_change: Callable[[bool], None] | None = None

    def __post_init__(self) -> None:
        self.leases = client.CoordinationV1Api(self.api)
        self._seen: tuple[str, str] | None = None  # (resourceVersion, holder) last observed
        self._seen_at = 0.0
        self.leader = False

    async def run(self, work: Callable[[], Awaitable[None]], release: bool = True) -> None:
        """Campaign until leader, run ``work`` while leading; if leadership is lost, cancel
        it and campaign again. Returns when the work ends by itself (a SIGTERM, say);
        cancelling ``run`` stops the work. Either way, with ``release``, the Lease is handed
        back."""
        try:
            while True:
                while not await self._attempt(self.renew_deadline):
                    await asyncio.sleep(self.retry_period)
                self._set_leader(True)
                task = asyncio.ensure_future(work())
                try:
                    finished = await self._renew_until_lost(task)
                finally:
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
                    self._set_leader(False)
                if finished:
                    return
        finally:
            if release and self._seen is not None and self._seen[1] == self.identity:
                with contextlib.suppress(ApiException, aiohttp.ClientError, OSError, TimeoutError):
                    await asyncio.wait_for(self._release(), self.renew_deadline)

    # -- the Lease ---------------------------------------------------------------------------
    async def _renew_until_lost(self, task: asyncio.Future) -> bool:
        """Renew while the work runs: True when it ended by itself, False when leadership
        was lost."""
        last_renewal = time.monotonic()
        while not task.done():
            await asyncio.wait([task], timeout=self.retry_period)
            if task.done():
                break
            # a renew hung on a stalled API server ends with the deadline: the Lease must
            # not expire under work that still runs
            left = max(0.0, self.renew_deadline - (time.monotonic() - last_renewal))
            if await self._attempt(left):
                last_renewal = time.monotonic()
            elif time.monotonic() - last_renewal >= self.renew_deadline:
                log.error(
                    "lease %s/%s: could not renew for %gs; stepping down",
                    self.namespace,
                    self.name,
                    self.renew_deadline,
                )
                return False
        task.result()  # the work ended by itself: its error (if any) surfaces here
        return True

    async def _attempt(self, deadline: float) -> bool:
        """One try to acquire or renew, given up (as failed) after ``deadline`` seconds or
        when the connection fails: an API server restarting or a load balancer resetting
        connections must cost a round, not the elector (and with it the component)."""
        try:
            return await asyncio.wait_for(self._try_acquire_or_renew(), deadline)
        except TimeoutError:
            log.warning("lease %s/%s: no answer within %gs", self.namespace, self.name, deadline)
        except (aiohttp.ClientError, OSError) as e:
            log.warning("lease %s/%s: %s", self.namespace, self.name, e or type(e).__name__)
        return False

    async def _try_acquire_or_renew(self) -> bool:
        try:
            lease = await unless_absent(
                self.leases.read_namespaced_lease(self.name, self.namespace)
            )
        except ApiException as e:
            log.warning("lease %s/%s: %s %s", self.namespace, self.name, e.status, e.reason)
            return False
        if lease is None:
            return await self._write(None, transitions=0)
        spec = lease.spec
        holder = spec.holder_identity or ""
        seen = (lease.metadata.resource_version, holder)
        if seen != self._seen:
            self._seen, self._seen_at = seen, time.monotonic()
        if holder and holder != self.identity:
            duration = spec.lease_duration_seconds or self.lease_duration
            if time.monotonic() - self._seen_at < duration:
                return False  # another holder, still renewing
        transitions = (spec.lease_transitions or 0) + (holder != self.identity)
        acquired = spec.acquire_time if holder == self.identity else None
        return await self._write(lease.metadata.resource_version, transitions, acquired)

    async def _write(
        self,
        resource_version: str | None,
        transitions: int,
        acquire_time: Any = None,
        holder: str | None = None,
    ) -> bool:
        now = _now()
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity if holder is None else holder,
                "leaseDurationSeconds": int(self.lease_duration),
                "acquireTime": acquire_time or now,
                "renewTime": now,
                "leaseTransitions": transitions,
            },
        }
        try:
            if resource_version is None:
                out = await self.leases.create_namespaced_lease(self.namespace, body)
            else:
                body["metadata"]["resourceVersion"] = resource_version
                out = await self.leases.replace_namespaced_lease(self.name, self.namespace, body)
        except ApiException as e:
            if e.status in (409, 422):  # someone else wrote first: not ours this round
                return False
            log.warning("lease %s/%s: %s %s", self.namespace, self.name, e.status, e.reason)
            return False
        self._seen = (out.metadata.resource_version, out.spec.holder_identity or "")
        self._seen_at = time.monotonic()
        return True

    async def _release(self) -> None:
        lease = await self.leases.read_namespaced_lease(self.name, self.namespace)
        if lease.spec.holder_identity == self.identity:
            await self._write(
                lease.metadata.resource_version, lease.spec.lease_transitions or 0, holder=""
            )
            log.info("lease %s/%s released", self.namespace, self.name)

    def _set_leader(self, leader: bool) -> None:
        if leader != self.leader:
            log.info(
                "lease %s/%s: %s",
                self.namespace,
                self.name,
                "leading" if leader else "no longer leading",
            )
        self.leader = leader
        if self.on_change:
            self.on_change(leader)
