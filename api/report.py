"""The restore report: what a restore did, written as JSON to the control directory (and the
shim log) so that operators and the node agent can see why a pod cold-started."""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field

from .annotations import RestoreOutcome


class RestoreReport(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    outcome: RestoreOutcome
    artifact: str
    manifest_digest: str | None = Field(default=None, alias="manifestDigest")
    reason: str | None = None
    failed_phase: str | None = Field(default=None, alias="failedPhase")
    pid: int | None = None
    pod_ip: str | None = Field(default=None, alias="podIP")
    #: seconds per restore phase: verify, setup, criu, cuda, wake, total, unaccounted
    timings: dict[str, float] = Field(default_factory=dict)
    #: bytes the fill wrote from the artifact's memory file (its phase: ``timings["fill"]``)
    fill_bytes: int | None = Field(default=None, alias="fillBytes")
    finished_at: datetime = Field(default_factory=lambda: datetime.now(UTC), alias="finishedAt")

    @property
    def fill_text(self) -> str | None:
        """``filled 14.98 GB at 10.6 GB/s``, for conditions and events."""
        seconds = self.timings.get("fill")
        if not self.fill_bytes or not seconds:
            return None
        return (
            f"filled {self.fill_bytes / 1e9:.2f} GB at {self.fill_bytes / seconds / 1e9:.1f} GB/s"
        )

    def to_json(self) -> bytes:
        return self.model_dump_json(by_alias=True, indent=2).encode() + b"\n"
