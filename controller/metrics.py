"""The controller's Prometheus metrics: reconciles by kind and result, the work queue's depth,
whether it leads; its API requests are counted by the client
(``kubeclient.api.count_requests``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from kubeclient.metrics_server import serve_metrics


class ControllerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.reconciles = Counter(
            "snapshot_controller_reconciles",
            "Reconciles, by kind and result (ok, error)",
            ["kind", "result"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "snapshot_controller_queue_depth", "Objects waiting in the work queue", registry=r
        )
        self.leader = Gauge(
            "snapshot_controller_leader",
            "1 while this replica holds the leader Lease",
            registry=r,
        )

    def serve(self, port: int) -> None:
        """/metrics on port, from a background thread (bounded: kubeclient/metrics_server)."""
        serve_metrics(port, self.registry)
