"""Snapshot's checkpoint/restore engine: a library with no Kubernetes import, used by every
component above it (shim, webhook, controller, agent) and by ``snapshotctl``.

Layers (one way): ``contracts`` (typed models shared by every component) <- ``artifact``,
``criu``, ``cuda``, ``runc``, ``netns``, ``compat``, ``handshake`` (libraries doing one thing
each) <- ``executor`` (coordinates a checkpoint or a restore and times its phases) <- ``cli``.
"""

__version__ = "0.1.0"
