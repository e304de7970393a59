"""Phase timings: every checkpoint and restore records where its seconds went, including the
time no phase accounts for."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)


class PhaseTimer:
    def __init__(self, on_phase: Callable[[str], None] | None = None) -> None:
        self._start = time.monotonic()
        self.phases: dict[str, float] = {}
        self._on_phase = on_phase

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self._on_phase:
            self._on_phase(name)
        t0 = time.monotonic()
        try:
            yield
        finally:
            dt = time.monotonic() - t0
            self.phases[name] = round(self.phases.get(name, 0.0) + dt, 4)
            log.info("phase %s took %.3fs", name, dt)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """A part of a phase, timed in the log only (the report keeps the phases): where a
        phase's time goes."""
        t0 = time.monotonic()
        try:
            yield
        finally:
            log.info("  step %s took %.3fs", name, time.monotonic() - t0)

    def result(self) -> dict[str, float]:
        total = time.monotonic() - self._start
        out = dict(self.phases)
        out["total"] = round(total, 4)
        out["unaccounted"] = round(max(0.0, total - sum(self.phases.values())), 4)
        return out


def phases_text(timings: dict[str, float]) -> str:
    """``verify 0.01s, setup 0.26s, ...``: phase timings as logs, events and the CLI show
    them (the total is shown apart)."""
    return ", ".join(f"{k} {v:.2f}s" for k, v in timings.items() if k != "total")
