"""The page images hashed while CRIU still writes them.

CRIU's page dump runs on one thread (2.4-2.7 GB/s on a GPU node), and the checkpoint then
hashed the memory file on every core (1.1 s of 11.6 s for 6.65 B parameters). The memory file
is CRIU's largest page file, renamed (criu/memfile.py), so its chunks can be hashed on the
other cores while the dump appends them: a chunk is final once the file has grown past it
(CRIU only ever appends to a page file). The split then punches out the runs that stay with
CRIU and appends other processes' runs at the end; the chunks those touch are hashed again
with the rest (``still_valid``).

Zero blocks are punched out as they are hashed, as the memory file's are anyway: a hole reads
as the zeros it replaced, so the bytes CRIU and the split read stay the same.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from api.manifest import FILE_DIGEST, FileDigest

from .hashing import hash_range

log = logging.getLogger(__name__)

#: how often the page files' sizes are looked at
POLL_S = 0.05


class PageFollower:
    """Hashes every whole ``chunk_size`` chunk of the ``pages-*.img`` files in ``images`` as
    they grow, on ``workers`` threads (default: one core left to CRIU), until ``stop``."""

    def __init__(
        self,
        images: Path,
        chunk_size: int,
        workers: int | None = None,
        algorithm: FileDigest = FILE_DIGEST,
    ) -> None:
        self.images, self.chunk_size, self.algorithm = images, chunk_size, algorithm
        n = workers or max(1, (os.cpu_count() or 2) - 1)
        self._pool = ThreadPoolExecutor(n, "follow-hash")
        self._chunks: dict[tuple[str, int], Future[str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="follow-pages", daemon=True)

    def __enter__(self) -> PageFollower:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _follow(self) -> None:
        while not self._stop.wait(POLL_S):
            self._scan()

    def _scan(self) -> None:
        for path in self.images.glob("pages-*.img"):
            with contextlib.suppress(FileNotFoundError):
                whole = path.stat().st_size // self.chunk_size
                for k in range(whole):
                    if (path.name, k) not in self._chunks:
                        at, n = k * self.chunk_size, self.chunk_size
                        self._chunks[path.name, k] = self._pool.submit(
                            hash_range, path, at, n, self.algorithm, holes=True
                        )

    def stop(self) -> dict[str, dict[int, str]]:
        """Stop following once the dump ended; the digests of the chunks hashed, per page
        file name and chunk index. Chunks still queued are dropped (the checkpoint hashes
        them with the rest, on every core), and so is a chunk whose hashing failed."""
        self._stop.set()
        self._thread.join()
        out: dict[str, dict[int, str]] = {}
        for (name, k), future in self._chunks.items():
            if future.cancel():
                continue
            try:
                out.setdefault(name, {})[k] = future.result()
            except OSError as e:
                log.warning("chunk %d of %s not hashed during the dump: %s", k, name, e)
        self._pool.shutdown(wait=True)
        return out


def still_valid(
    digests: dict[int, str],
    chunk_size: int,
    size: int,
    changed: list[tuple[int, int]],
) -> dict[int, str]:
    """Those of ``digests`` (chunk index -> digest of a file of ``size`` bytes when hashed)
    whose chunk no range of ``changed`` ((offset, length), written or punched since) touches,
    and that lay wholly inside the file."""
    touched = {
        k
        for o, n in changed
        if n > 0
        for k in range(o // chunk_size, (o + n - 1) // chunk_size + 1)
    }
    return {k: d for k, d in digests.items() if (k + 1) * chunk_size <= size and k not in touched}
