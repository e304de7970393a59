"""``make clean-node`` (``python -m devnode.sweep``): remove what a killed devnode run left on
this machine: its processes (containerd and its shims, the kubelet, the control plane,
registries), its containers, mounts, network namespaces, veths and bridges, iptables chains
and its directories under /tmp.

It touches only what devnode made, found by devnode's own marks, never by guessing:

- a process is devnode's when its environment names a devnode run (:data:`OWNER_ENV`, which
  every process devnode starts inherits); it is left over when that run is gone;
- a directory ``/tmp/snapshot-*`` holds :data:`OWNER_FILE`; without one (a work directory, a
  shim's restore staging) it is left over only when no devnode run is alive at all;
- a container is left over when its runc bundle lies in a left-over directory;
- a network namespace ``/run/netns/cni-*`` when no process is in it and it holds an address
  of devnode's pod range (10.233.0.0/16); a bridge ``snapbr*`` when no live run's node uses it;
- iptables chains ``KUBE-*`` only when no kubelet or kube-proxy runs any more, ``CNI-*``
  only when no containerd does (the host's own included: then they cannot be the host's).

A live run (a test session, ``make cluster``) keeps everything it owns. ``--dry-run`` lists
what would go."""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import OWNER_ENV, OWNER_FILE, docker, iptables, links, unmount_under
from .cluster import API_IFACE
from .containerd import CONTAINERD2

POD_RANGE = ipaddress.ip_network("10.233.0.0/16")
RUNC_ROOTS = Path("/run/containerd/runc")
NETNS = Path("/run/netns")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner_of_process(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    prefix = f"{OWNER_ENV}=".encode()
    for item in env:
        if item.startswith(prefix):
            with contextlib.suppress(ValueError):
                return int(item[len(prefix) :])
    return None


def _owner_of_dir(path: Path) -> int | None:
    try:
        return int((path / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


@dataclass
class Plan:
    """What a sweep removes; :func:`plan` finds it, :func:`sweep` removes it."""

    processes: dict[int, str] = field(default_factory=dict)  # pid -> command line
    containers: list[tuple[Path, str]] = field(default_factory=list)  # (runc root, id)
    directories: list[Path] = field(default_factory=list)
    live_owners: set[int] = field(default_factory=set)

    def lines(self) -> list[str]:
        return (
            [f"process {pid}: {cmd[:120]}" for pid, cmd in sorted(self.processes.items())]
            + [f"container {cid} (runc root {root})" for root, cid in self.containers]
            + [f"directory {d}" for d in self.directories]
        )


def _runc() -> str:
    """Either runc reads the other's state; the newer one first."""
    for candidate in (CONTAINERD2 / "usr/sbin/runc", Path("/usr/sbin/runc")):
        if candidate.exists():
            return str(candidate)
    return "runc"


def _containers(roots: Path = RUNC_ROOTS) -> list[tuple[Path, str, str]]:
    """(runc root, container id, bundle) of every container under containerd's runc roots."""
    found = []
    for root in sorted(roots.glob("*")) if roots.is_dir() else []:
        p = subprocess.run(
            [_runc(), "--root", str(root), "list", "--format", "json"],
            capture_output=True,
            text=True,
        )
        listed = (json.loads(p.stdout or "null") if p.returncode == 0 else None) or []
        found += [(root, c["id"], c.get("bundle", "")) for c in listed]
    return found


def plan(me: int | None = None) -> Plan:
    me = os.getpid() if me is None else me
    out = Plan()
    owners: dict[int, int] = {}
    for pid in _pids():
        owner = _owner_of_process(pid)
        if owner is not None and pid != me:
            owners[pid] = owner
    dirs = {d: _owner_of_dir(d) for d in sorted(Path("/tmp").glob("snapshot-*"))}
    # runs still alive, this sweep aside: by their processes' marks and their directories'
    out.live_owners = {
        o for o in {*owners.values(), *dirs.values()} if o is not None and o != me and _alive(o)
    }
    for pid, owner in owners.items():
        if owner not in out.live_owners and owner != me:
            out.processes[pid] = _cmdline(pid)
    for d, owner in dirs.items():
        if owner is None and out.live_owners:
            continue  # a live run may be using it
        if owner is not None and owner in out.live_owners:
            continue
        out.directories.append(d)
    gone = tuple(f"{d}/" for d in out.directories)
    out.containers = [
        (root, cid) for root, cid, bundle in _containers() if f"{bundle}/".startswith(gone)
    ]
    return out


def _netns_in_use() -> set[int]:
    inodes = set()
    for pid in _pids():
        with contextlib.suppress(OSError):
            inodes.add(os.stat(f"/proc/{pid}/ns/net").st_ino)
    return inodes


def _addresses(netns: str) -> list[str]:
    p = subprocess.run(["ip", "-n", netns, "-j", "addr"], capture_output=True, text=True)
    if p.returncode != 0:
        return []
    return [
        a["local"]
        for link in json.loads(p.stdout or "[]")
        for a in link.get("addr_info", [])
        if a.get("family") == "inet"
    ]


def _left_netns() -> list[str]:
    if not NETNS.is_dir():
        return []
    in_use = _netns_in_use()
    left = []
    for ns in sorted(NETNS.glob("cni-*")):
        with contextlib.suppress(OSError):
            if os.stat(ns).st_ino in in_use:
                continue
            if any(ipaddress.ip_address(a) in POD_RANGE for a in _addresses(ns.name)):
                left.append(ns.name)
    return left


def _bridges_in_use(live_owners: set[int]) -> set[str]:
    """The bridges of live runs' nodes (each node's CNI config names its bridge)."""
    used = set()
    for d in Path("/tmp").glob("snapshot-*"):
        owner = _owner_of_dir(d)
        if owner is None or owner not in live_owners:
            continue
        for conf in d.glob("cni/*.conflist"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                used.add(json.loads(conf.read_text())["plugins"][0]["bridge"])
        if d.name.startswith("snapshot-k8s-"):
            used.add(API_IFACE)
    return used


def sweep(p: Plan, log=print) -> None:
    for pid in p.processes:  # their children are in the list too: none is spared to respawn
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in p.processes) and time.monotonic() < deadline:
        time.sleep(0.1)
    for root, cid in p.containers:
        subprocess.run([_runc(), "--root", str(root), "kill", cid, "KILL"], capture_output=True)
        subprocess.run(
            [_runc(), "--root", str(root), "delete", "--force", cid], capture_output=True
        )
    unmount_under(*p.directories)
    for ns in _left_netns():
        log(f"network namespace {ns}")
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    used = _bridges_in_use(p.live_owners)
    for link in links():
        name = link.get("ifname", "")
        if (name.startswith("snapbr") or name == API_IFACE) and name not in used:
            log(f"link {name}")
            subprocess.run(["ip", "link", "del", name], capture_output=True)
            shutil.rmtree(f"/run/{name}-ipam", ignore_errors=True)
    for chain in iptables.remove_kube_chains():
        log(f"chain {chain}")
    if not iptables.running("containerd"):
        for chain in iptables.remove_chains(("CNI-",)):
            log(f"chain {chain}")
    for d in p.directories:
        shutil.rmtree(d, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    a = argparse.ArgumentParser(prog="python -m devnode.sweep", description=__doc__.split("\n")[0])
    a.add_argument("--dry-run", action="store_true", help="list what would be removed")
    args = a.parse_args(argv)
    if os.geteuid() != 0:
        print("devnode.sweep must run as root", file=sys.stderr)
        return 1
    p = plan()
    for line in p.lines():
        print(("would remove " if args.dry_run else "removing ") + line)
    if p.live_owners:
        print(f"kept: what the live devnode runs {sorted(p.live_owners)} own", file=sys.stderr)
    if not args.dry_run:
        if not p.live_owners:  # the kind smoke's Docker daemon, first: it removes its nodes
            docker.sweep()
        sweep(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
