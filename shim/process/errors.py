"""What a container or process operation refuses, or fails with, in the shim's own terms. The
task service maps each kind to its ttrpc status once, at the RPC boundary (task/errors.py),
as containerd's runc shim maps its errdefs (``errgrpc.ToGRPC``)."""

from __future__ import annotations


class ProcessError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(ProcessError):
    """No such container, process or exec; or it is already gone (containerd treats a kill's
    NotFound as "already exited")."""


class AlreadyExists(ProcessError):
    pass


class InvalidArgument(ProcessError):
    pass


class FailedPrecondition(ProcessError):
    """Not allowed in the process's state (a strict restore that failed among them)."""


class Unimplemented(ProcessError):
    pass


class RuntimeFailed(ProcessError):
    """runc, or the system below it, failed."""


class MountFailed(ProcessError):
    pass
