"""A stand-in for an inference engine's HTTP server, for the engine profiles' tests: not the
engine, but the endpoints its profile calls, with their answers' shapes (restore_runtime/
engine_api.py), and a stateful ``GET /generate`` that serves only while the engine would:
``{"count": N, "digest": HEX}`` (a counter, and the digest of a 16 MiB random buffer made at
start, which only a faithful restore keeps). Quiescing frees its "KV cache" (32 MiB), waking
allocates it again. STANDIN_ENGINE picks the engine:

- ``vllm`` (default): ``POST /sleep?level=1``, ``POST /wake_up``, ``GET /is_sleeping`` ->
  ``{"is_sleeping": bool}``; asleep, it does not serve.
- ``sglang``: ``POST /pause_generation``, ``POST /release_memory_occupation`` and
  ``/resume_memory_occupation`` (``{"tags": ["kv_cache"]}``), ``POST /continue_generation``;
  paused or released, it does not serve.
- ``tensorrt-llm``: ``GET /health``; ``GET /metrics``, iteration stats whose active requests
  drain (two at start, one fewer per call).

Threads answer the calls, so a hung one holds up no other. STANDIN_MODE picks a broken vLLM:
``no-sleep-mode`` (404 on the sleep endpoints, as a vLLM started without
--enable-sleep-mode), ``never-sleeps``, ``hangs`` (the sleep call never answers), ``huge``
(is_sleeping answers 8 MiB), ``wake-fails`` (500 on /wake_up); and a hostile TensorRT-LLM's
/metrics: ``infinity`` (JSON Infinity), ``object`` (an object for a number), ``nested``
(20000 levels of arrays).

    python standin_engine.py HOST PORT
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ENGINE = os.environ.get("STANDIN_ENGINE", "vllm")
MODE = os.environ.get("STANDIN_MODE", "ok")
KV_MB = 32
#: hostile answers of a TensorRT-LLM's /metrics, by STANDIN_MODE
HOSTILE = {
    "infinity": b'[{"numActiveRequests": Infinity, "numQueuedRequests": 0}]',
    "object": b'[{"numActiveRequests": {"a": 1}, "numQueuedRequests": 0}]',
    "nested": b"[" * 20000 + b"]" * 20000,
}


class State:
    def __init__(self) -> None:
        self.weights = os.urandom(16 * 1024 * 1024)
        self.digest = hashlib.sha256(self.weights).hexdigest()[:16]
        self.kv: bytearray | None = bytearray(KV_MB << 20)
        self.count = 0
        self.sleeping = False  # vllm asleep; sglang paused or released
        self.active = 2  # tensorrt-llm: requests still running

    def free(self) -> None:
        self.sleeping, self.kv = True, None

    def allocate(self) -> None:
        self.sleeping, self.kv = False, bytearray(KV_MB << 20)


STATE = State()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:  # stdout is the test's log
        print(self.requestline, flush=True)

    def answer(self, status: int, body: object = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def raw(self, data: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/generate":
            if STATE.sleeping:
                return self.answer(503, {"error": "not serving"})
            STATE.count += 1
            return self.answer(200, {"count": STATE.count, "digest": STATE.digest})
        if ENGINE == "vllm" and self.path == "/is_sleeping":
            if MODE == "no-sleep-mode":
                return self.answer(404, {"detail": "Not Found"})
            if MODE == "huge":
                return self.answer(200, {"is_sleeping": False, "pad": "x" * (8 << 20)})
            return self.answer(200, {"is_sleeping": STATE.sleeping})
        if ENGINE == "tensorrt-llm" and self.path == "/health":
            return self.answer(200)
        if ENGINE == "tensorrt-llm" and self.path == "/metrics" and MODE in HOSTILE:
            return self.raw(HOSTILE[MODE])
        if ENGINE == "tensorrt-llm" and self.path == "/metrics":
            STATE.active = max(0, STATE.active - 1)
            return self.answer(
                200, [{"iter": 1, "numActiveRequests": STATE.active, "numQueuedRequests": 0}]
            )
        self.answer(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        if ENGINE == "vllm":
            return self.vllm()
        if ENGINE == "sglang" and self.path in ("/pause_generation", "/release_memory_occupation"):
            STATE.free()
            return self.answer(200, {"success": True, "message": ""})
        if ENGINE == "sglang" and self.path == "/resume_memory_occupation":
            STATE.kv = bytearray(KV_MB << 20)
            return self.answer(200, {"success": True, "message": ""})
        if ENGINE == "sglang" and self.path == "/continue_generation":
            STATE.sleeping = False
            return self.answer(200, {"success": True, "message": ""})
        self.answer(404, {"detail": "Not Found"})

    def vllm(self) -> None:
        if self.path.startswith("/sleep"):
            if MODE == "no-sleep-mode":
                return self.answer(404, {"detail": "Not Found"})
            if MODE == "hangs":
                time.sleep(3600)
            if MODE != "never-sleeps":
                STATE.free()
            return self.answer(200)
        if self.path == "/wake_up":
            if MODE == "wake-fails":
                return self.answer(500, {"error": "CUDA out of memory"})
            STATE.allocate()
            return self.answer(200)
        self.answer(404, {"detail": "Not Found"})


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    server = ThreadingHTTPServer((host, port), Handler)
    print(f"listening on {host}:{port} ({ENGINE}, mode {MODE})", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
