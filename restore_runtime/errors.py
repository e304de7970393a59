"""Typed errors of the engine. Every failure a user can meet is one of these, with a message
that says what happened and, where one exists, what to do."""

from __future__ import annotations

from dataclasses import dataclass


class SnapshotError(Exception):
    """Base class: the operation failed and left nothing half-done behind."""

    #: which phase of a checkpoint or restore failed (setup, quiesce, cuda, criu, pack, wake)
    phase: str = "setup"


class CriuError(SnapshotError):
    """CRIU exited non-zero. Carries the error lines of its log, never just an exit status."""

    phase = "criu"

    def __init__(self, action: str, returncode: int, log_lines: list[str], log_path: str | None):
        self.action = action
        self.returncode = returncode
        self.log_lines = log_lines
        self.log_path = log_path
        detail = "\n  ".join(log_lines) if log_lines else "(no error lines in the CRIU log)"
        where = f" (full log: {log_path})" if log_path else ""
        super().__init__(f"criu {action} failed with exit status {returncode}{where}:\n  {detail}")


class CudaError(SnapshotError):
    """A CUDA driver call failed, or no usable CUDA driver/GPU is present."""

    phase = "cuda"

    def __init__(self, message: str, call: str | None = None, code: int | None = None):
        self.call = call
        self.code = code
        super().__init__(message)


@dataclass(frozen=True)
class Problem:
    """One reason an artifact failed verification."""

    path: str
    kind: str  # missing | extra | truncated | modified | unsafe-path | manifest | signature
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.path}: {self.detail}"


class VerificationError(SnapshotError):
    phase = "verify"

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        lines = "\n  ".join(str(p) for p in problems)
        super().__init__(f"artifact failed verification ({len(problems)} problem(s)):\n  {lines}")


@dataclass(frozen=True)
class CompatReason:
    """Why this host cannot restore an artifact: which field, what the artifact needs,
    what the host has."""

    field: str
    expected: str
    found: str

    def __str__(self) -> str:
        return f"{self.field}: artifact needs {self.expected!r}, host has {self.found!r}"


class IncompatibleError(SnapshotError):
    phase = "compat"

    def __init__(self, reasons: list[CompatReason]):
        self.reasons = reasons
        lines = "\n  ".join(str(r) for r in reasons)
        super().__init__(f"host is incompatible with the artifact:\n  {lines}")


class HandshakeTimeout(SnapshotError):
    phase = "quiesce"


class ArtifactExists(SnapshotError):
    def __init__(self, path: str):
        self.path = path
        super().__init__(f"output {path} already exists; refusing to overwrite an artifact")
