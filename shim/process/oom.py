"""OOM kills of a container, read from its memory cgroup (v1 memory.oom_control or v2
memory.events), so the shim can publish TaskOOM and CRI reports reason OOMKilled."""

from __future__ import annotations

from pathlib import Path


def oom_kills(memory_dir: Path | None) -> int:
    """How many processes the kernel OOM-killed in this memory cgroup (0 when unknown)."""
    if memory_dir is None:
        return 0
    for f in (memory_dir / "memory.oom_control", memory_dir / "memory.events"):  # v1, v2
        try:
            text = f.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    return 0
