"""The workload's side of the snapshot handshake. Standard library only: import it from any
inference server without pulling in the engine.

    from restore_runtime.workload import Handshake

    hs = Handshake()                      # $SNAPSHOT_CONTROL_DIR, default /snapshot-control
    hs.serve_in_background(quiesce=engine.sleep, resume=lambda info: engine.wake_up())

``quiesce`` runs when the agent writes ``checkpoint-requested``: finish in-flight requests,
free the KV cache, drop connections. The helper then writes ``ready-for-snapshot`` and waits.
The process is frozen and dumped while it waits; in a restored replica (or a source left
running) ``restore-complete`` appears and ``resume(info)`` runs with the new pod IP.

An engine that moves its weights to host memory in ``quiesce`` restores fastest with them in
pageable memory: ``restore_runtime.offload.HostCopy``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

from api.handshake import (
    CHECKPOINT_REQUESTED,
    READY_FOR_SNAPSHOT,
    RESTORE_COMPLETE,
    RestoreComplete,
    atomic_write,
    control_dir_from_env,
)

__all__ = ["Handshake", "RestoreComplete"]


class Handshake:
    def __init__(self, control_dir: str | Path | None = None, poll_s: float = 0.05) -> None:
        self.control_dir = Path(control_dir) if control_dir else control_dir_from_env()
        self.poll_s = poll_s

    @property
    def enabled(self) -> bool:
        return self.control_dir.is_dir()

    def checkpoint_requested(self) -> bool:
        return (self.control_dir / CHECKPOINT_REQUESTED).exists()

    def wait_for_checkpoint_request(self, timeout: float | None = None) -> bool:
        return self._wait(CHECKPOINT_REQUESTED, timeout)

    def signal_ready(self, info: dict | None = None) -> None:
        atomic_write(self.control_dir / READY_FOR_SNAPSHOT, json.dumps(info or {}).encode())

    def wait_for_restore(self, timeout: float | None = None) -> RestoreComplete:
        if not self._wait(RESTORE_COMPLETE, timeout):
            raise TimeoutError(
                f"no {RESTORE_COMPLETE} in {self.control_dir} within {timeout}s after "
                f"{READY_FOR_SNAPSHOT}"
            )
        return RestoreComplete.from_json((self.control_dir / RESTORE_COMPLETE).read_bytes())

    def serve(
        self,
        quiesce: Callable[[], dict | None],
        resume: Callable[[RestoreComplete], None],
        stop: threading.Event | None = None,
    ) -> None:
        """Answer checkpoint requests until ``stop`` is set."""
        stop = stop or threading.Event()
        while not stop.is_set():
            if not self.checkpoint_requested():
                stop.wait(self.poll_s)
                continue
            self.signal_ready(quiesce() or {})
            resume(self.wait_for_restore())

    def serve_in_background(
        self, quiesce: Callable[[], dict | None], resume: Callable[[RestoreComplete], None]
    ) -> threading.Event:
        stop = threading.Event()
        threading.Thread(
            target=self.serve, args=(quiesce, resume, stop), name="snapshot-handshake", daemon=True
        ).start()
        return stop

    def _wait(self, name: str, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        path = self.control_dir / name
        while not path.exists():
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(self.poll_s)
        return True
