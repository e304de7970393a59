"""Coordinates checkpoints and restores; the libraries beside it do the work."""

from .checkpoint import CheckpointRequest, CheckpointResult, checkpoint
from .restore import Restore, RestoreRequest, prepare, restore

__all__ = [
    "CheckpointRequest",
    "CheckpointResult",
    "Restore",
    "RestoreRequest",
    "checkpoint",
    "prepare",
    "restore",
]
