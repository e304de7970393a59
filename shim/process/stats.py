"""Container metrics for the Stats RPC, read from the container's cgroup (v1 or v2) into
containerd's cgroups Metrics messages, which the CRI plugin turns into container stats for
the kubelet. A node whose shims cannot answer Stats loses stats for every container, so a
missing file yields zeros, never an error."""

from __future__ import annotations

import os
from pathlib import Path

from google.protobuf import any_pb2
from google.protobuf.message import Message

from ..proto import cgroups_v1_pb2 as v1
from ..proto import cgroups_v2_pb2 as v2

CGROUP_ROOT = Path("/sys/fs/cgroup")
_UNLIMITED_V1 = 0x7FFFFFFFFFFFF000


def _int(path: Path) -> int:
    try:
        text = path.read_text().strip()
    except OSError:
        return 0
    if text == "max":
        return 0
    try:
        return int(text)
    except ValueError:
        return 0


def _kv(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        k, _, v = line.partition(" ")
        if v.strip().isdigit():
            out[k] = int(v)
    return out


def cgroup_dirs(pid: int) -> dict[str, Path]:
    """The cgroup directory of ``pid`` per controller ("" for the v2 unified tree), read
    from /proc/PID/cgroup: right whatever cgroup driver (cgroupfs, systemd) named it."""
    out: dict[str, Path] = {}
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if not controllers:
            out[""] = CGROUP_ROOT / rel
        for ctl in controllers.split(","):
            if ctl and not ctl.startswith("name="):
                out[ctl] = CGROUP_ROOT / ctl / rel
    return out


def memory_dir(dirs: dict[str, Path]) -> Path | None:
    return dirs.get("memory") or dirs.get("")


def metrics(dirs: dict[str, Path]) -> any_pb2.Any:
    msg: Message = _v1(dirs) if "memory" in dirs else _v2(dirs.get("", CGROUP_ROOT))
    return any_pb2.Any(type_url=msg.DESCRIPTOR.full_name, value=msg.SerializeToString())


def _v1(dirs: dict[str, Path]) -> v1.Metrics:
    none = Path("/nonexistent")
    mem, cpu, pids = dirs.get("memory", none), dirs.get("cpuacct", none), dirs.get("pids", none)
    ms = _kv(mem / "memory.stat")
    tick_ns = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    cs = _kv(cpu / "cpuacct.stat")
    limit = _int(mem / "memory.limit_in_bytes")
    pids_max = _int(pids / "pids.max")
    oom = _kv(mem / "memory.oom_control")
    return v1.Metrics(
        pids=v1.PidsStat(current=_int(pids / "pids.current"), limit=pids_max),
        cpu=v1.CPUStat(
            usage=v1.CPUUsage(
                total=_int(cpu / "cpuacct.usage"),
                kernel=cs.get("system", 0) * tick_ns,
                user=cs.get("user", 0) * tick_ns,
            )
        ),
        memory=v1.MemoryStat(
            cache=ms.get("cache", 0),
            rss=ms.get("rss", 0),
            mapped_file=ms.get("mapped_file", 0),
            pg_fault=ms.get("pgfault", 0),
            pg_maj_fault=ms.get("pgmajfault", 0),
            inactive_anon=ms.get("inactive_anon", 0),
            active_anon=ms.get("active_anon", 0),
            inactive_file=ms.get("inactive_file", 0),
            active_file=ms.get("active_file", 0),
            total_cache=ms.get("total_cache", 0),
            total_rss=ms.get("total_rss", 0),
            total_inactive_file=ms.get("total_inactive_file", 0),
            total_active_file=ms.get("total_active_file", 0),
            usage=v1.MemoryEntry(
                limit=0 if limit >= _UNLIMITED_V1 else limit,
                usage=_int(mem / "memory.usage_in_bytes"),
                max=_int(mem / "memory.max_usage_in_bytes"),
                failcnt=_int(mem / "memory.failcnt"),
            ),
        ),
        memory_oom_control=v1.MemoryOomControl(
            oom_kill_disable=oom.get("oom_kill_disable", 0),
            under_oom=oom.get("under_oom", 0),
            oom_kill=oom.get("oom_kill", 0),
        ),
    )


def _v2(path: Path) -> v2.Metrics:
    cs, ms, ev = _kv(path / "cpu.stat"), _kv(path / "memory.stat"), _kv(path / "memory.events")
    return v2.Metrics(
        pids=v2.PidsStat(current=_int(path / "pids.current"), limit=_int(path / "pids.max")),
        cpu=v2.CPUStat(
            usage_usec=cs.get("usage_usec", 0),
            user_usec=cs.get("user_usec", 0),
            system_usec=cs.get("system_usec", 0),
            nr_periods=cs.get("nr_periods", 0),
            nr_throttled=cs.get("nr_throttled", 0),
            throttled_usec=cs.get("throttled_usec", 0),
        ),
        memory=v2.MemoryStat(
            anon=ms.get("anon", 0),
            file=ms.get("file", 0),
            file_mapped=ms.get("file_mapped", 0),
            inactive_anon=ms.get("inactive_anon", 0),
            active_anon=ms.get("active_anon", 0),
            inactive_file=ms.get("inactive_file", 0),
            active_file=ms.get("active_file", 0),
            pgfault=ms.get("pgfault", 0),
            pgmajfault=ms.get("pgmajfault", 0),
            usage=_int(path / "memory.current"),
            usage_limit=_int(path / "memory.max"),
            swap_usage=_int(path / "memory.swap.current"),
            swap_limit=_int(path / "memory.swap.max"),
            max_usage=_int(path / "memory.peak"),
        ),
        memory_events=v2.MemoryEvents(
            low=ev.get("low", 0),
            high=ev.get("high", 0),
            max=ev.get("max", 0),
            oom=ev.get("oom", 0),
            oom_kill=ev.get("oom_kill", 0),
        ),
    )
