"""A stand-in for vLLM's HTTP server, for the engine profile's tests: not vLLM, but its
sleep-mode endpoints with their real answers (``POST /sleep?level=1``, ``POST /wake_up``,
``GET /is_sleeping`` -> ``{"is_sleeping": bool}``), and a stateful ``GET /generate`` that
serves only while awake: ``{"count": N, "digest": HEX}`` (a counter, and the digest of a
16 MiB random buffer made at start, which only a faithful restore keeps). Sleep frees its
"KV cache" (a 32 MiB buffer), wake allocates it again.

Threads answer the calls, so a hung one holds up no other. STANDIN_MODE picks a broken
engine: ``no-sleep-mode`` (404 on the sleep endpoints, as a vLLM
started without --enable-sleep-mode), ``never-sleeps``, ``hangs`` (the sleep call never
answers), ``huge`` (is_sleeping answers 8 MiB), ``wake-fails`` (500 on /wake_up).

    python standin_vllm.py HOST PORT
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODE = os.environ.get("STANDIN_MODE", "ok")
KV_MB = 32


class State:
    def __init__(self) -> None:
        self.weights = os.urandom(16 * 1024 * 1024)
        self.digest = hashlib.sha256(self.weights).hexdigest()[:16]
        self.kv: bytearray | None = bytearray(KV_MB << 20)
        self.count = 0
        self.sleeping = False


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

    def do_GET(self) -> None:
        if self.path == "/is_sleeping":
            if MODE == "no-sleep-mode":
                return self.answer(404, {"detail": "Not Found"})
            if MODE == "huge":
                return self.answer(200, {"is_sleeping": False, "pad": "x" * (8 << 20)})
            return self.answer(200, {"is_sleeping": STATE.sleeping})
        if self.path == "/generate":
            if STATE.sleeping:
                return self.answer(503, {"error": "asleep"})
            STATE.count += 1
            return self.answer(200, {"count": STATE.count, "digest": STATE.digest})
        self.answer(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        if self.path.startswith("/sleep"):
            if MODE == "no-sleep-mode":
                return self.answer(404, {"detail": "Not Found"})
            if MODE == "hangs":
                time.sleep(3600)
            if MODE != "never-sleeps":
                STATE.sleeping, STATE.kv = True, None
            return self.answer(200)
        if self.path == "/wake_up":
            if MODE == "wake-fails":
                return self.answer(500, {"error": "CUDA out of memory"})
            STATE.sleeping, STATE.kv = False, bytearray(KV_MB << 20)
            return self.answer(200)
        self.answer(404, {"detail": "Not Found"})


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    server = ThreadingHTTPServer((host, port), Handler)
    print(f"listening on {host}:{port} (mode {MODE})", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
