"""The agent's Prometheus metrics, one registry per agent (no globals: tests run several)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from api.annotations import RestoreOutcome
from kubeclient.metrics_server import serve_metrics, zeroed

RESTORE_BUCKETS = (0.25, 0.5, 1, 2, 3, 5, 8, 13, 20, 30, 60, 120, 300)


class AgentMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.checkpoints = zeroed(
            Counter(
                "snapshot_agent_checkpoints",
                "Checkpoints, by result (captured, failed)",
                ["result"],
                registry=r,
            ),
            "captured",
            "failed",
        )
        self.checkpoint_seconds = Histogram(
            "snapshot_agent_checkpoint_seconds",
            "Checkpoint duration, handshake to artifact",
            buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
            registry=r,
        )
        self.artifact_bytes = Counter(
            "snapshot_agent_artifact_bytes", "Bytes of artifacts written", registry=r
        )
        self.pre_pulls = zeroed(
            Counter(
                "snapshot_agent_pre_pulls",
                "Artifacts pulled ahead of a restore, by result (pulled, failed)",
                ["result"],
                registry=r,
            ),
            "pulled",
            "failed",
        )
        self.recovered = Counter(
            "snapshot_agent_recovered",
            "Checkpoints found interrupted at the agent's start "
            "(it was killed mid-way) whose source was given back",
            registry=r,
        )
        self.source_not_resumed = Counter(
            "snapshot_agent_source_not_resumed",
            "Checkpoints whose source should serve on "
            "(keepSourceRunning, or a failure after the commit) but did not wake again",
            registry=r,
        )
        outcomes = [o.value for o in RestoreOutcome]
        self.restores = zeroed(
            Counter(
                "snapshot_agent_restores_reported",
                "Restore outcomes reported on pods (restored, fell-back, failed)",
                ["outcome"],
                registry=r,
            ),
            *outcomes,
        )

        self.restore_seconds = zeroed(
            Histogram(
                "snapshot_agent_restore_seconds",
                "Restore duration as the shim reported it (start to serving, or to the fallback's "
                "decision), by outcome",
                ["outcome"],
                buckets=RESTORE_BUCKETS,
                registry=r,
            ),
            *outcomes,
        )

    def restored(self, outcome: str, seconds: float | None) -> None:
        self.restores.labels(outcome).inc()
        # the report is in the tenant's volume: a forged figure is dropped, not plotted
        if seconds is not None and 0 <= seconds <= RESTORE_BUCKETS[-1]:
            self.restore_seconds.labels(outcome).observe(seconds)

    def serve(self, port: int) -> None:
        """/metrics on port, from a background thread (bounded: kubeclient/metrics_server)."""
        serve_metrics(port, self.registry)
