"""The CPU demo's model server survives clients that leave before its answer, as a TCP
readiness probe does (connect, close): it once died of the BrokenPipeError, and a restored
replica restarted cold under the kubelet's probe."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from devnode import free_port
from tests.helpers import ROOT, ask

pytest.importorskip("sklearn", reason="the demo extra (scikit-learn) is not installed")


def test_a_client_that_leaves_early_does_not_stop_the_server():
    port = free_port()
    p = subprocess.Popen(
        [sys.executable, "-m", "examples.cpu_demo.workload", "127.0.0.1", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        first = ask("127.0.0.1", port, timeout=120)
        for _ in range(20):  # connect and close at once, as the kubelet's probe does
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                )
        time.sleep(1)
        assert p.poll() is None, "the server died"
        again = ask("127.0.0.1", port, timeout=10)
        assert again["digest"] == first["digest"] and int(again["count"]) > int(first["count"])
    finally:
        p.kill()
        p.wait()
