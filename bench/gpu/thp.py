"""Transparent huge pages set to ``always`` for a trial, the host's setting put back after.

CRIU restores a process's madvise() bits only after it has copied its pages, so under the
usual ``madvise`` mode every page of the copy is a 4 KiB fault; ``always`` is the node tuning
a cluster admin can choose instead (docs/gpu-nodes.md)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

KNOB = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def setting() -> str:
    return KNOB.read_text().split("[")[1].split("]")[0]


@contextlib.contextmanager
def always() -> Iterator[str]:
    """Yields the host's own setting."""
    before = setting()
    KNOB.write_text("always")
    try:
        yield before
    finally:
        with contextlib.suppress(OSError):
            KNOB.write_text(before)
