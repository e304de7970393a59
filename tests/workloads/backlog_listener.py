"""A TCP listener that never accepts: every connection made to it stays in its accept queue,
"in flight" for CRIU, as a kubelet tcpSocket probe is while the tree is frozen for a dump.

    python backlog_listener.py HOST PORT
"""

from __future__ import annotations

import socket
import sys
import time


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    srv = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, port))
    srv.listen(16)
    print(f"listening on {host}:{port}", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
