"""Snapshot's checkpoint/restore engine: a library with no Kubernetes import, used by the
shim, the node agent and ``snapshotctl`` (the webhook and the controller need only the
contracts, in the top-level ``api`` package).

Layers (one way): ``api`` (the contracts, outside the engine) <- ``artifact``, ``criu``,
``cuda``, ``runc``, ``netns``, ``compat``, ``handshake`` (libraries doing one thing each) <-
``executor`` (coordinates a checkpoint or a restore and times its phases) <- ``cli``.
"""

__version__ = "0.1.0"
