"""The engine adapters, driven through the real handshake (the agent's side from
restore_runtime.control_files, files in a real control directory) against a stand-in engine: an
HTTP server on loopback that answers the engine's endpoints and records every call.

The stand-in is a fake by necessity: vLLM, SGLang and TensorRT-LLM need GPUs and cannot be
installed here. What it checks is the adapters' side of the contract: which calls, in which
order, and that the handshake only completes once the engine says it is quiesced."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from examples.engine_adapter import Http, serve
from examples.sglang.adapter import SglangEngine
from examples.tensorrt_llm.adapter import TrtllmEngine
from examples.vllm.adapter import VllmEngine
from restore_runtime import control_files
from restore_runtime.workload import Handshake


class StandIn:
    """Records (method, path, query, body); per-engine behaviour in `answer`."""

    def __init__(self, missing: set[str] = frozenset()) -> None:
        self.calls: list[tuple[str, str, dict, object]] = []
        self.sleeping = False
        self.active = 3  # TensorRT-LLM requests in flight, drained one per /metrics poll
        self.missing = missing
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _handle(self, method):
                url = urllib.parse.urlparse(self.path)
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else None
                query = dict(urllib.parse.parse_qsl(url.query))
                outer.calls.append((method, url.path, query, body))
                code, payload = outer.answer(method, url.path)
                data = json.dumps(payload).encode() if payload is not None else b""
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, method: str, path: str):
        if path in self.missing:
            return 404, {"detail": "Not Found"}
        if path == "/sleep":
            # like vLLM with frontend multiprocessing: the state changes after the reply
            threading.Timer(0.3, lambda: setattr(self, "sleeping", True)).start()
            return 200, None
        if path == "/wake_up":
            self.sleeping = False
            return 200, None
        if path == "/is_sleeping":
            return 200, {"is_sleeping": self.sleeping}
        if path == "/metrics":
            self.active = max(0, self.active - 1)
            return 200, [{"numActiveRequests": self.active, "numQueuedRequests": 0}]
        return 200, {}

    def paths(self) -> list[str]:
        return [f"{m} {p}" for m, p, _, _ in self.calls if p not in ("/is_sleeping", "/metrics")]


@pytest.fixture
def engine_server():
    servers = []

    def make(**kw) -> StandIn:
        s = StandIn(**kw)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.server.shutdown()


def run_handshake(engine, tmp_path, register_url=None, port=8000):
    """Agent side: request a checkpoint, wait for ready-for-snapshot, then restore-complete.
    Returns the ready-for-snapshot payload."""
    control = tmp_path / "ctl"
    control.mkdir()
    stop = threading.Event()
    t = threading.Thread(
        target=serve,
        args=(engine, Handshake(control, poll_s=0.01), register_url, port, stop),
        daemon=True,
    )
    t.start()
    ready = control_files.request_checkpoint(control, timeout_s=10)
    return control, stop, t, ready


def finish(control, stop, server, last_path, pod_ip="10.0.0.9"):
    """restore-complete, then wait for the adapter's last call."""
    control_files.complete_restore(control, pod_ip, {"criu": 1.0})
    deadline = time.monotonic() + 10
    while not any(p == last_path for _, p, _, _ in server.calls):
        assert time.monotonic() < deadline, f"no {last_path} after restore-complete"
        time.sleep(0.02)
    time.sleep(0.1)  # anything after it would show up now
    stop.set()


def test_vllm_sleeps_before_ready_and_wakes_on_restore(engine_server, tmp_path):
    s = engine_server()
    control, stop, _, ready = run_handshake(VllmEngine(Http(s.url)), tmp_path)
    # ready-for-snapshot came only after vLLM reported is_sleeping (0.3 s after /sleep)
    assert s.sleeping and ready["engine"] == "vllm" and ready["sleepLevel"] == 1
    assert ready["quiesceSeconds"] >= 0.25
    assert s.paths() == ["POST /sleep"] and s.calls[0][2] == {"level": "1"}
    finish(control, stop, s, "/wake_up")
    assert s.paths() == ["POST /sleep", "POST /wake_up"] and not s.sleeping


def test_sglang_releases_the_kv_cache_and_registers_the_new_address(engine_server, tmp_path):
    s = engine_server()
    router = engine_server()
    url = router.url + "/add_worker?url={url}"
    control, stop, _, ready = run_handshake(SglangEngine(Http(s.url)), tmp_path, url, 30000)
    assert ready["released"] == ["kv_cache"]
    assert s.paths() == ["POST /pause_generation", "POST /release_memory_occupation"]
    assert s.calls[1][3] == {"tags": ["kv_cache"]}
    finish(control, stop, router, "/add_worker", pod_ip="10.0.0.9")
    assert s.paths()[2:] == ["POST /resume_memory_occupation", "POST /continue_generation"]
    ((method, path, query, body),) = router.calls
    assert (method, path) == ("POST", "/add_worker")
    assert query == {"url": "http://10.0.0.9:30000"} and body == {"url": "http://10.0.0.9:30000"}


def test_sglang_without_pause_generation(engine_server, tmp_path):
    s = engine_server(missing={"/pause_generation", "/continue_generation"})
    control, stop, _, _ = run_handshake(SglangEngine(Http(s.url)), tmp_path)
    finish(control, stop, s, "/continue_generation")
    assert "POST /resume_memory_occupation" in s.paths()


def test_tensorrt_llm_drains_and_keeps_state_resident(engine_server, tmp_path):
    s = engine_server()
    flag = tmp_path / "serving"
    engine = TrtllmEngine(Http(s.url), serving_flag=flag)
    assert flag.exists()
    control, stop, _, ready = run_handshake(engine, tmp_path)
    assert ready["resident"] is True and not flag.exists()
    assert s.active == 0, "ready only after the in-flight requests drained"
    assert not any(p in ("/sleep", "/release_memory_occupation") for _, p, _, _ in s.calls)
    finish(control, stop, s, "/health")
    assert flag.exists() and s.paths()[-1] == "GET /health"


def test_engine_error_is_clear(engine_server, tmp_path):
    s = engine_server(missing={"/sleep"})
    with pytest.raises(Exception, match=r"POST .*/sleep\?level=1: HTTP 404"):
        VllmEngine(Http(s.url)).quiesce()
