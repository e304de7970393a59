"""What a restore reads of the namespaces it restores into: a network namespace's addresses
(with pyroute2, over netlink), for recording a source's pod IPs and finding the restore
target's, and a UTS namespace's host name."""

from __future__ import annotations

import ctypes
import os
import socket
import threading
from collections.abc import Callable
from typing import TypeVar

_SCOPE_UNIVERSE = 0
CLONE_NEWNET = 0x40000000
CLONE_NEWUTS = 0x04000000
_libc = ctypes.CDLL(None, use_errno=True)
T = TypeVar("T")


def global_addresses(netns: str | None = None) -> list[str]:
    """Global-scope addresses (no loopback, no link-local), IPv4 first. ``netns`` is a name
    under /run/netns or a path such as /proc/PID/ns/net; None means our own namespace."""
    return in_netns(netns, _read_addresses) if netns else _read_addresses()


def in_netns(netns: str, fn: Callable[[], T]) -> T:
    """``fn()`` run inside network namespace ``netns`` (a name or a path)."""
    return in_namespace(netns_path(netns), CLONE_NEWNET, fn)


def in_namespace(path: str, nstype: int, fn: Callable[[], T]) -> T:
    """``fn()`` run inside the namespace at ``path`` (of type ``nstype``, a CLONE_NEW*
    flag), by a short-lived thread that setns(2)s into it: only that thread moves. Never a
    forked helper (pyroute2's NetNS forks): a fork of an asyncio process, such as the shim,
    shares its signal wake-up socket, so the helper's SIGTERM would reach the shim's loop."""
    result: list[T] = []
    error: list[BaseException] = []

    def inside() -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                if _libc.setns(fd, nstype) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns {path}: {os.strerror(err)}")
            finally:
                os.close(fd)
            result.append(fn())
        except BaseException as e:  # handed to the caller's thread
            error.append(e)

    t = threading.Thread(target=inside, name="ns-reader")
    t.start()
    t.join()
    if error:
        raise error[0]
    return result[0]


def hostname_of(spec: dict) -> str | None:
    """The host name a container of OCI spec ``spec`` has: that of the UTS namespace it
    joins (a pod's sandbox's: every container of a Kubernetes pod joins it), else the one the
    spec sets for a namespace of its own; None when it shares the host's, or sets none."""
    linux = spec.get("linux") or {}
    uts = next((n for n in linux.get("namespaces") or [] if n.get("type") == "uts"), None)
    if uts is None:
        return None
    if uts.get("path"):
        return in_namespace(uts["path"], CLONE_NEWUTS, lambda: os.uname().nodename)
    return spec.get("hostname") or None


def preload() -> None:
    """Load what reading addresses needs, ahead of a restore that will: pyroute2 imports
    much of itself on its first use (0.07-0.15 s on the 2-core VM), so this reads this
    namespace's addresses once."""
    _read_addresses()


def _read_addresses() -> list[str]:
    from pyroute2 import IPRoute  # imported here: preload() takes it off the restore's path

    with IPRoute() as ipr:
        addrs = [
            (a.get("family"), a.get_attr("IFA_ADDRESS"))
            for a in ipr.get_addr()
            if a.get("scope") == _SCOPE_UNIVERSE
        ]
    v4 = [ip for fam, ip in addrs if fam == socket.AF_INET]
    v6 = [ip for fam, ip in addrs if fam == socket.AF_INET6]
    return v4 + v6


def rebind_map(old_ips: list[str], new_ips: list[str]) -> dict[str, str]:
    """Pair the source's pod IPs with the target's, per address family, in order."""
    mapping: dict[str, str] = {}
    for is_v6 in (False, True):
        olds = [ip for ip in old_ips if (":" in ip) == is_v6]
        news = [ip for ip in new_ips if (":" in ip) == is_v6]
        for old, new in zip(olds, news, strict=False):
            if old != new:
                mapping[old] = new
    return mapping


def netns_path(netns: str) -> str:
    """A network namespace given by name (``ip netns``) or by path, as a path."""
    return netns if "/" in netns else f"/run/netns/{netns}"
