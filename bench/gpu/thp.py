"""Transparent huge pages set to ``always`` for a trial, the host's setting put back after.

CRIU restores a process's madvise() bits only after it has copied its pages, so under the
usual ``madvise`` mode every page of the copy is a 4 KiB fault; ``always`` is the node tuning
a cluster admin can choose instead (docs/gpu-nodes.md)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

THP = Path("/sys/kernel/mm/transparent_hugepage")
KNOB = THP / "enabled"


def setting(knob: Path = KNOB) -> str:
    return knob.read_text().split("[")[1].split("]")[0]


def always() -> contextlib.AbstractContextManager[str]:
    """Yields the host's own setting."""
    return trial("enabled=always")


@contextlib.contextmanager
def trial(spec: str) -> Iterator[str]:
    """One host setting for a trial: ``enabled=VALUE`` or ``defrag=VALUE`` (the THP knobs),
    or ``compact`` (the kernel compacts free memory first, once). Yields what was set
    before."""
    if spec == "compact":
        Path("/proc/sys/vm/compact_memory").write_text("1")
        yield "-"
        return
    name, value = spec.split("=", 1)
    knob = THP / name
    before = setting(knob)
    knob.write_text(value)
    try:
        yield before
    finally:
        with contextlib.suppress(OSError):
            knob.write_text(before)
