"""A TCP listener that never accepts: every connection made to it stays in its accept queue,
"in flight" for CRIU, as a kubelet tcpSocket probe is while the tree is frozen for a dump.

    python backlog_listener.py HOST PORT
"""

from __future__ import annotations

import sys
import time

from counter_server import listen  # its sibling script (this directory is on sys.path)


def main() -> None:
    srv = listen(sys.argv[1], int(sys.argv[2]))
    while srv.fileno() >= 0:  # kept open, never accepted
        time.sleep(3600)


if __name__ == "__main__":
    main()
