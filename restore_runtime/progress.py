"""Progress on a terminal: the phase, and bytes where a phase moves bytes. Silent when stderr
is not a terminal (logs, CI) or when --json is given."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def dir_bytes(path: Path) -> int:
    total = 0
    for dirpath, _d, files in os.walk(path):
        for f in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


class Progress:
    def __init__(self, enabled: bool | None = None, stream=None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self._phase = ""
        self._bytes = 0
        self._lock = threading.Lock()
        self._last = 0.0

    def phase(self, name: str) -> None:
        with self._lock:
            self._phase, self._bytes = name, 0
        self._draw(force=True)

    def add_bytes(self, n: int) -> None:
        with self._lock:
            self._bytes += n
        self._draw()

    def set_bytes(self, n: int) -> None:
        with self._lock:
            self._bytes = n
        self._draw()

    def _draw(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.2:
            return
        self._last = now
        self.stream.write(f"\r\x1b[K{self._phase}: {human(self._bytes)}")
        self.stream.flush()

    def done(self) -> None:
        if self.enabled:
            self.stream.write("\r\x1b[K")
            self.stream.flush()

    def watch_dir(self, path: Path) -> Callable[[], None]:
        """Report the growing size of ``path`` (CRIU writing images) until the returned
        function is called."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(0.5):
                self.set_bytes(dir_bytes(path))

        t = threading.Thread(target=loop, daemon=True)
        if self.enabled:
            t.start()

        def finish() -> None:
            stop.set()
            if t.is_alive():
                t.join()

        return finish
