"""The components' /metrics listener, bounded: prometheus-client's ``start_http_server``
gives every connection a thread with no timeout and no cap, so idle connections from any pod
(400 held 400 threads) starved the agent and the controller of threads, or memory. Here a
connection that says nothing for ``timeout_s`` is closed, and past ``max_connections`` at
once a new one is closed unanswered; a scrape takes milliseconds, so neither touches
Prometheus. ``/healthz`` answers the kubelet's probes on the same port."""

from __future__ import annotations

import logging
import threading
from http.server import ThreadingHTTPServer
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, MetricsHandler

log = logging.getLogger(__name__)
M = TypeVar("M", Counter, Histogram)
MAX_CONNECTIONS = 16
IDLE_TIMEOUT_S = 10.0


def zeroed(metric: M, *values: str) -> M:
    """``metric`` with a series for each of its known label values from the start: a series
    that appears only at its first event has no rate before it, and an alert on it (or a
    check that the labels exist) sees nothing until something has gone wrong once."""
    for value in values:
        metric.labels(value)
    return metric


class _HealthOrMetrics(MetricsHandler):
    """/healthz: the process serves (the kubelet's probes); any other path: the metrics."""

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] != "/healthz":
            return super().do_GET()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


class BoundedMetricsServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        port: int,
        registry: CollectorRegistry,
        addr: str = "0.0.0.0",
        max_connections: int = MAX_CONNECTIONS,
        timeout_s: float = IDLE_TIMEOUT_S,
    ) -> None:
        handler = type(
            "Handler", (_HealthOrMetrics, MetricsHandler.factory(registry)), {"timeout": timeout_s}
        )
        self.slots = threading.BoundedSemaphore(max_connections)
        super().__init__((addr, port), handler)

    def process_request(self, request, client_address) -> None:
        if not self.slots.acquire(blocking=False):
            log.warning(
                "metrics: over %s connections at once, closed one from %s",
                self.slots._initial_value,
                client_address[0],
            )
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def serve_metrics(port: int, registry: CollectorRegistry, **bounds) -> BoundedMetricsServer:
    """/metrics (any path) on ``port``, from a background thread."""
    server = BoundedMetricsServer(port, registry, **bounds)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
