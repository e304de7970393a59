"""What a checkpoint holds of its source, and how it gives it back: the tree's CUDA
processes (locked, checkpointed), the workload's wake, and, for an agent that ends the source
only once its artifact is durable, the source held past the commit."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .. import procs
from ..errors import CudaError, SnapshotError
from .recovery import resume_in_place

if TYPE_CHECKING:
    from .checkpoint import CheckpointRequest
    from .tree_access import Dumper

log = logging.getLogger(__name__)


class GpuState:
    """The CUDA processes of the tree, and how far their checkpoint got, so a failure can
    hand the GPU state back to a source that keeps running."""

    def __init__(self) -> None:
        self.pids: list[int] = []
        self.locked: list[int] = []
        self.checkpointed: list[int] = []
        self._drv = None

    @property
    def drv(self):
        if self._drv is None:
            from ..cuda.driver import CudaDriver

            self._drv = CudaDriver()
        return self._drv

    def classify(self, root: int) -> None:
        """Find the tree's CUDA processes. Run after the quiesce, which may end helpers.
        Only processes holding NVIDIA device files can be CUDA processes: ask the driver
        about those alone, so a CPU-only tree never touches it."""
        candidates = procs.cuda_pids(root)
        self.pids = [p for p in candidates if self.drv.is_cuda_process(p)]
        stray = [p for p in candidates if p not in self.pids and procs.maps_nvidia_device(p)]
        if stray:
            raise CudaError(
                f"process(es) {stray} map NVIDIA device memory without a CUDA context of "
                "their own (children forked after CUDA initialisation, such as torch.compile's "
                "worker pool); CRIU cannot dump them. End them when the workload quiesces "
                "(torch: torch._inductor.async_compile.shutdown_compile_workers()) or start "
                "them before CUDA is initialised."
            )

    def suspend(self) -> None:
        for p in self.pids:
            self.drv.lock(p)
            self.locked.append(p)
        for p in self.pids:
            self.drv.checkpoint(p)
            self.checkpointed.append(p)

    def resume(self) -> None:
        for p in self.checkpointed:
            self.drv.restore(p)
        for p in self.locked:
            self.drv.unlock(p)
        self.checkpointed, self.locked = [], []


class HeldSource:
    """A source whose artifact is committed, still alive and quiesced (its GPU state in host
    memory): the caller ends it once the artifact is durable, or gives it back; whichever
    comes first counts, later calls do nothing. Its journal stays until then, so an agent
    that dies meanwhile gives it back at its next start."""

    def __init__(
        self, req: CheckpointRequest, dumper: Dumper, gpu: GpuState, quiesced: bool, journal: Path
    ) -> None:
        self.req, self.dumper, self.gpu, self.quiesced = req, dumper, gpu, quiesced
        self.journal = journal
        self.settled = False

    def end(self) -> list[str]:
        """End the source; one that cannot be ended is given back (it keeps serving) and
        the problems are returned."""
        if self._settle():
            return []
        try:
            self.dumper.end(self.req.pid)
            return []
        except SnapshotError as e:  # the artifact is whole: the source keeps serving
            log.error("could not end the source after its checkpoint: %s", e)
            return [f"could not end the source: {e}", *give_back(self.req, self.gpu, self.quiesced)]
        finally:
            self.journal.unlink(missing_ok=True)

    def give_back(self) -> list[str]:
        """The source serves again, as if it had never been checkpointed."""
        if self._settle():
            return []
        try:
            return give_back(self.req, self.gpu, self.quiesced)
        finally:
            self.journal.unlink(missing_ok=True)

    def _settle(self) -> bool:
        """Whether it was already ended or given back (each happens once)."""
        done, self.settled = self.settled, True
        return done


#: tries to wake a source that keeps running, and the pause before each retry
WAKE_TRIES = 3
WAKE_RETRY_S = 1.0


def give_back(req: CheckpointRequest, gpu: GpuState, quiesced: bool) -> list[str]:
    """Let a source that is still alive continue: GPU state back, workload resumed (a wake
    that fails is tried again). Returns what could not be done, for the caller to report:
    a source left asleep must not be silent."""
    if not procs.exists(req.pid):
        return []
    problems = []
    try:
        gpu.resume()
    except SnapshotError as e:
        log.error("could not hand GPU state back to PID %d: %s", req.pid, e)
        problems.append(f"could not hand the GPU state back: {e}")
    if quiesced:
        for attempt in range(1, WAKE_TRIES + 1):
            try:
                resume_in_place(req.pid, req.http_quiesce, req.control_dir)
                break
            except SnapshotError as e:
                log.error(
                    "could not wake the source (PID %d), try %d of %d: %s",
                    req.pid,
                    attempt,
                    WAKE_TRIES,
                    e,
                )
                if attempt == WAKE_TRIES:
                    problems.append(f"the source did not wake after {WAKE_TRIES} tries: {e}")
                else:
                    time.sleep(WAKE_RETRY_S * attempt)
    return problems
