"""Snapshot's checkpoint/restore engine.

Layers (one way): ``contracts`` (typed models shared by every component) <- ``artifact``,
``criu``, ``cuda``, ``netrebind``, ``compat``, ``handshake`` (libraries doing one thing each)
<- ``executor`` (coordinates a checkpoint or a restore and times its phases) <- ``cli``.
"""

__version__ = "0.1.0"
