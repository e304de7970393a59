"""The agent's and controller's /metrics listener is bounded (kubeclient/metrics_server.py):
isolation round 3, attack 5. With prometheus-client's start_http_server, 400 idle
connections from any pod held 400 threads in each component. Tested with real idle TCP
connections inside a network namespace of the test's own (the listener and its clients are
on that namespace's loopback):

- past the cap, the listener holds no more threads, however many connections wait;
- an idle connection is closed after the idle timeout, and a scrape then answers;
- a scrape answers the registry's metrics, and /healthz the kubelet's probes."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from prometheus_client import CollectorRegistry, Counter

from kubeclient.metrics_server import BoundedMetricsServer
from restore_runtime.netns import in_netns

pytestmark = pytest.mark.root


def _connect(netns: str, port: int) -> socket.socket:
    return in_netns(netns, lambda: socket.create_connection(("127.0.0.1", port), timeout=5))


def _scrape(netns: str, port: int, path: str = "/metrics") -> bytes:
    s = _connect(netns, port)
    with s:
        s.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def test_idle_connections_hold_no_more_threads_than_the_cap_and_time_out(netns):
    registry = CollectorRegistry()
    Counter("snapshot_test_things", "things", registry=registry).inc(3)
    server = in_netns(
        netns,
        lambda: BoundedMetricsServer(
            0, registry, addr="127.0.0.1", max_connections=4, timeout_s=1.5
        ),
    )
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert b"snapshot_test_things_total 3.0" in _scrape(netns, port)
        assert _scrape(netns, port, "/healthz").endswith(b"\r\n\r\nok")
        before = threading.active_count()
        idle = [_connect(netns, port) for _ in range(40)]
        time.sleep(0.5)  # every connection accepted: 4 held, 36 closed unanswered
        assert threading.active_count() - before <= 4, "a thread per idle connection"
        closed = 0
        for s in idle:
            s.settimeout(5)
            try:
                closed += s.recv(1) == b""
            except OSError:
                closed += 1
        assert closed == 40, "every idle connection is closed: over the cap, or idle too long"
        for s in idle:
            s.close()
        assert b"snapshot_test_things_total 3.0" in _scrape(netns, port), "scrapes answer again"
    finally:
        server.shutdown()
        server.server_close()
