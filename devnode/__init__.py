"""A private containerd node on this machine (containerd + CRI + CNI bridge + our shim),
for the demo and the integration tests. Nothing here is part of the product."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port nothing listens on now, on loopback (for servers the tests start)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
