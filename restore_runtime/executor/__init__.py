"""Coordinates checkpoints and restores; the libraries beside it do the work.

``checkpoint.py`` and ``restore.py`` are imported by name, never through this package: a
restoring shim imports the restore side alone, and does not pay for the checkpoint side's
modules on its critical path.
"""
