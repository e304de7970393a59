"""containerd-shim-snapshot-v2: see shim/bootstrap.py."""

import sys

from .bootstrap import main

sys.exit(main())
