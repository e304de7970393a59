"""containerd shim v2 for Snapshot: ``containerd-shim-snapshot-v2`` (runtime
io.containerd.snapshot.v2). Behaves as containerd's runc shim, except that a container whose
annotations name an artifact is restored instead of started (shim/process/restore.py)."""

VERSION = "snapshot-shim/0.1.0"
