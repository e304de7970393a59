"""Time to first response: poll a line-oriented TCP service until it answers. Used to time
cold starts and restores the same way (benchmarks, the demo, tests)."""

from __future__ import annotations

import socket
import time


def ask_line(host: str, port: int, timeout: float = 120.0) -> str | None:
    """Connect, read one line; None when nothing answers yet."""
    try:
        with socket.create_connection((host, port), timeout=min(timeout, 5.0)) as s:
            s.settimeout(timeout)
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
            return data.decode().strip() or None
    except OSError:
        return None


def first_response(host: str, port: int, since: float, timeout: float) -> tuple[float, str]:
    """Poll until the service answers; return (seconds since ``since`` (a time.monotonic()
    value), the answer)."""
    while time.monotonic() - since < timeout:
        line = ask_line(host, port)
        if line:
            return time.monotonic() - since, line
        time.sleep(0.005)
    raise TimeoutError(f"{host}:{port} did not answer within {timeout:g}s")


def parse(line: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
