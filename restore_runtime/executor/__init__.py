"""Coordinates checkpoints and restores; the libraries beside it do the work."""

from .checkpoint import CheckpointRequest, CheckpointResult, checkpoint
from .restore import RestoreRequest, restore

__all__ = ["CheckpointRequest", "CheckpointResult", "RestoreRequest", "checkpoint", "restore"]
