"""OOM kills of a container, read from its memory cgroup (v1 memory.oom_control or v2
memory.events), so the shim can publish TaskOOM and CRI reports reason OOMKilled."""

from __future__ import annotations

from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _files(cgroups_path: str) -> list[Path]:
    rel = cgroups_path.lstrip("/")
    return [CGROUP_ROOT / "memory" / rel / "memory.oom_control",  # v1
            CGROUP_ROOT / rel / "memory.events"]  # v2  # fmt: skip


def oom_kills(cgroups_path: str | None) -> int:
    """How many processes the kernel OOM-killed in this cgroup (0 when unknown)."""
    if not cgroups_path or ":" in cgroups_path:  # systemd-style paths: not resolved here
        return 0
    for f in _files(cgroups_path):
        try:
            text = f.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    return 0
