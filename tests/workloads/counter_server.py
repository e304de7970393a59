"""A small stateful TCP server used by the engine tests (and the CPU demo).

It holds state that only survives a real memory checkpoint: a counter bumped per request, a
random 16 MiB buffer made at start (its digest proves the pages came back) and the PID it
sees. Each connection gets one line: ``count=N digest=HEX nspid=P addr=IP:PORT``.
With SNAPSHOT_CONTROL_DIR set it answers the snapshot handshake and logs each resume.
COUNTER_EXTRA_MB adds that much touched memory (a longer dump); with COUNTER_QUIESCE_GATE
set, a quiesce stops serving at once but answers ready only once that file exists (a test
chooses the moment).

    python counter_server.py HOST PORT
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from restore_runtime.workload import Handshake


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port, announced on stdout."""
    srv = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, port))
    srv.listen(16)
    print(f"listening on {host}:{port}", flush=True)
    return srv


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    state = bytearray(os.urandom(16 * 1024 * 1024))
    ballast = b"\x01" * (int(os.environ.get("COUNTER_EXTRA_MB", "0")) << 20)  # noqa: F841
    gate = os.environ.get("COUNTER_QUIESCE_GATE")
    digest = hashlib.sha256(state).hexdigest()[:16]
    count = 0
    lock = threading.Lock()
    hs = Handshake()
    if hs.enabled:

        def quiesce() -> dict:
            lock.acquire()  # no request is served while quiesced
            while gate and not os.path.exists(gate):
                time.sleep(0.02)
            return {"count": count}

        def resume(info) -> None:
            print(f"resumed mode={info.mode} podIP={info.pod_ip}", flush=True)
            lock.release()

        hs.serve_in_background(quiesce, resume)
    srv = listen(host, port)
    while True:
        conn, _ = srv.accept()
        with lock, conn:
            count += 1
            addr = conn.getsockname()
            line = f"count={count} digest={digest} nspid={os.getpid()} addr={addr[0]}:{addr[1]}\n"
            conn.sendall(line.encode())


if __name__ == "__main__":
    main()
