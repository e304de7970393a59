"""A stock engine quiesced and woken through its own HTTP API (api/quiesce.py), on the
loopback of the workload's network namespace: the agent and the shim enter that namespace
(one thread of their own, for the calls only) and never reach anything outside it.

The engine belongs to the pod's tenant, so every answer is hostile input: at most
``MAX_ANSWER`` bytes are read, every call has a timeout, and the whole operation a deadline.
An engine without the endpoints a profile needs is named with the flag that enables them.

    vllm          probe GET /is_sleeping; POST /sleep?level=1, until is_sleeping;
                  wake: POST /wake_up, until not is_sleeping
    sglang        POST /pause_generation (where offered), POST /release_memory_occupation
                  {"tags": ["kv_cache"]}; wake: /resume_memory_occupation, /continue_generation
    tensorrt-llm  probe GET /health; until /metrics shows no request running or queued;
                  wake: GET /health
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from api.quiesce import Engine, Quiesce

from .errors import SnapshotError
from .netns import in_netns

log = logging.getLogger(__name__)
#: the most of an engine's answer read (its JSON answers are tiny)
MAX_ANSWER = 64 * 1024
#: the most one call may take, within the operation's deadline
CALL_TIMEOUT_S = 30.0
POLL_S = 0.2
#: where each engine documents the switch for the endpoints its profile calls
ENABLE = {
    Engine.VLLM: "start vLLM with VLLM_SERVER_DEV_MODE=1 and --enable-sleep-mode",
    Engine.SGLANG: "start SGLang with --enable-memory-saver",
    Engine.TRTLLM: "serve it with trtllm-serve",
}
KV_CACHE = {"tags": ["kv_cache"]}


class EngineApiError(SnapshotError):
    """The engine refused, answered something else, or took too long."""


class _Api:
    def __init__(self, q: Quiesce, deadline: float) -> None:
        self.q, self.deadline = q, deadline

    def call(self, method: str, path: str, body: Any = None, missing_ok: bool = False) -> Any:
        """The answer's JSON (None when empty, or when ``missing_ok`` and it is a 404)."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self._late(f"{method} {path}")
        conn = http.client.HTTPConnection(
            "127.0.0.1", self.q.engine_port, timeout=min(CALL_TIMEOUT_S, left)
        )
        # an engine that trickles its answer keeps every read inside the timeout: the
        # connection is cut at the deadline whatever it is doing
        cut = threading.Timer(left, lambda: _shutdown(conn))
        try:
            conn.connect()
            cut.start()
            data = json.dumps(body).encode() if body is not None else None
            headers = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, path, body=data, headers=headers)
            r = conn.getresponse()
            raw = r.read(MAX_ANSWER + 1)
        except (TimeoutError, http.client.HTTPException, OSError) as e:
            if isinstance(e, TimeoutError) or time.monotonic() >= self.deadline:
                raise self._late(f"{method} {path}") from None
            raise EngineApiError(f"{self.q.engine} {method} {path}: {e}") from e
        finally:
            cut.cancel()
            conn.close()
        if len(raw) > MAX_ANSWER:
            raise EngineApiError(f"{self.q.engine} {method} {path}: answer over {MAX_ANSWER} bytes")
        if r.status == 404 and missing_ok:
            return None
        if r.status == 404:
            raise EngineApiError(
                f"{self.q.engine} has no {method} {path} (404): {ENABLE[self.q.engine]}"
            )
        if r.status >= 300:
            text = raw[:300].decode(errors="replace")
            raise EngineApiError(f"{self.q.engine} {method} {path}: HTTP {r.status} {text}")
        try:
            return json.loads(raw) if raw.strip() else None
        except RecursionError:
            raise EngineApiError(
                f"{self.q.engine} {method} {path}: answer nested too deeply"
            ) from None
        except ValueError:
            return raw[:300].decode(errors="replace")

    def until(self, check: Callable[[], bool], what: str) -> None:
        while True:
            try:
                if check():
                    return
            except EngineApiError:
                if time.monotonic() < self.deadline:
                    raise
            if time.monotonic() >= self.deadline:
                raise self._late(what)
            time.sleep(POLL_S)

    def _late(self, what: str) -> EngineApiError:
        return EngineApiError(
            f"{self.q.engine}: no answer to {what} within {self.q.timeout_seconds}s"
        )

    # -- the profiles ---------------------------------------------------------------------
    def vllm_sleeping(self) -> bool:
        answer = self.call("GET", "/is_sleeping")
        return isinstance(answer, dict) and answer.get("is_sleeping") is True

    def in_flight(self) -> int:
        stats = self.call("GET", "/metrics")  # trtllm-serve: iteration stats, newest last
        last = stats[-1] if isinstance(stats, list) and stats else {}
        if not isinstance(last, dict):
            return 0
        return int(last.get("numActiveRequests", 0)) + int(last.get("numQueuedRequests", 0))


def _shutdown(conn: http.client.HTTPConnection) -> None:
    with contextlib.suppress(OSError, AttributeError):
        conn.sock.shutdown(socket.SHUT_RDWR)


def _run(q: Quiesce, netns: str, steps: Callable[[_Api], None], phase: str) -> float:
    t0 = time.monotonic()
    api = _Api(q, t0 + q.timeout_seconds)
    try:
        try:
            in_netns(netns, lambda: steps(api))  # the engine's loopback is its namespace's
        except (TypeError, ValueError, ArithmeticError, RecursionError) as e:
            # the tenant's answers, converted: JSON Infinity (OverflowError), an object
            # where a number belongs (TypeError), nesting past the parser (RecursionError)
            raise EngineApiError(
                f"{q.engine}: malformed answer ({type(e).__name__}: {str(e)[:200]})"
            ) from None
    except EngineApiError as e:
        e.phase = phase  # what a restore report names as the failed phase
        raise
    return time.monotonic() - t0


def quiesce(q: Quiesce, netns: str) -> float:
    """Probe the engine for its profile's endpoints, then quiesce it; the seconds taken."""

    def steps(api: _Api) -> None:
        if q.engine == Engine.VLLM:
            if api.vllm_sleeping():
                raise EngineApiError(
                    "vllm is asleep already: another checkpoint's, or a restore not woken"
                )
            api.call("POST", "/sleep?level=1")
            api.until(api.vllm_sleeping, "vllm reporting is_sleeping")
        elif q.engine == Engine.SGLANG:
            api.call("POST", "/pause_generation", {}, missing_ok=True)
            api.call("POST", "/release_memory_occupation", KV_CACHE)
        elif q.engine == Engine.TRTLLM:
            api.call("GET", "/health")
            api.until(lambda: api.in_flight() == 0, "requests in flight to finish")

    seconds = _run(q, netns, steps, "quiesce")
    log.info("%s quiesced through its API in %.2fs", q.engine, seconds)
    return seconds


def wake(q: Quiesce, netns: str) -> float:
    """Wake the engine (after its restore, or a checkpoint that keeps it running), and
    wait until it reports so; the seconds taken."""

    def steps(api: _Api) -> None:
        if q.engine == Engine.VLLM:
            api.call("POST", "/wake_up")
            api.until(lambda: not api.vllm_sleeping(), "vllm reporting awake")
        elif q.engine == Engine.SGLANG:
            api.call("POST", "/resume_memory_occupation", KV_CACHE)
            api.call("POST", "/continue_generation", {}, missing_ok=True)
        elif q.engine == Engine.TRTLLM:
            api.call("GET", "/health")

    seconds = _run(q, netns, steps, "wake")
    log.info("%s woken through its API in %.2fs", q.engine, seconds)
    return seconds
