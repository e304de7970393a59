"""The fill's own speed on this machine's cores (no GPU): restore_runtime/memfill.py filling a
stopped process's private anonymous mapping from a memory file on tmpfs, against the raw copy
(``process_vm_writev`` alone, no read and no hash) with as many threads, with and without
``MADV_HUGEPAGE`` on the target, and against reading and hashing the file alone (what the
verification costs). One run, so the ratios compare.

    python3 bench/gpu/fill_bench.py --gib 4 --threads 1,4,16 --out fill.json
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import mmap
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from blake3 import blake3  # noqa: E402

from api.manifest import CHUNK_SIZE, FILE_DIGEST  # noqa: E402
from api.memory import MemoryRange  # noqa: E402
from restore_runtime import memfill  # noqa: E402
from restore_runtime.artifact.hashing import hash_slices, new_hash, slices  # noqa: E402

_MAP_NORESERVE = 0x4000  # not in every Python's mmap module


def _targets(sizes: list[int], huge: bool) -> tuple[int, list[int]]:
    """A stopped child with one untouched mapping per size: (pid, their addresses)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE
            maps = [mmap.mmap(-1, size, flags=flags) for size in sizes]
            for m in maps:
                if huge:
                    m.madvise(mmap.MADV_HUGEPAGE)
                os.write(w, ctypes.addressof(ctypes.c_char.from_buffer(m)).to_bytes(8, "little"))
            os.kill(os.getpid(), signal.SIGSTOP)
        except BaseException as e:
            os.write(2, f"target: {e!r}\n".encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 4096):
        data += chunk
        if len(data) == 8 * len(sizes):
            break
    os.close(r)
    if len(data) != 8 * len(sizes):
        os.waitpid(pid, 0)
        raise RuntimeError(f"the target could not map {len(sizes)} region(s)")
    os.waitpid(pid, os.WSTOPPED)
    return pid, [int.from_bytes(data[i : i + 8], "little") for i in range(0, len(data), 8)]


def _target(size: int, huge: bool) -> tuple[int, int]:
    pid, (addr,) = _targets([size], huge)
    return pid, addr


def _layout_target(ranges: list[MemoryRange], huge: bool) -> tuple[int, list[MemoryRange]]:
    """A stopped child with the ranges' layout: each cluster of them (gaps under 64 MiB) in a
    fresh mapping, at its offset from the cluster's 2 MiB-aligned start, so alignment holds.
    Returns (pid, the ranges moved there, as pid 1)."""
    clusters: list[list[MemoryRange]] = []
    for r in sorted(ranges, key=lambda r: r.vaddr):
        if clusters and r.vaddr - (clusters[-1][-1].vaddr + clusters[-1][-1].length) < 64 << 20:
            clusters[-1].append(r)
        else:
            clusters.append([r])
    starts = [c[0].vaddr & ~((2 << 20) - 1) for c in clusters]
    sizes = [c[-1].vaddr + c[-1].length - lo for c, lo in zip(clusters, starts, strict=True)]
    pid, bases = _targets(sizes, huge)
    moved = [
        MemoryRange(pid=1, vaddr=base + r.vaddr - lo, length=r.length, offset=r.offset)
        for c, lo, base in zip(clusters, starts, bases, strict=True)
        for r in c
    ]
    return pid, moved


def replay(artifact: Path, threads: int | None = None) -> dict:
    """The artifact's own fill (its memory file, index and digests) into a fresh stopped
    process instead of the restored tree: what the fill costs apart from the target a CUDA
    restore made. The biggest process's ranges only (its layout, one mapping)."""
    from api.manifest import Manifest
    from api.memory import MEMORY_INDEX, MEMORY_PAGES, MemoryIndex

    manifest = Manifest.from_json((artifact / "manifest.json").read_bytes())
    entry = next(f for f in manifest.files if f.path == MEMORY_PAGES)
    index = MemoryIndex.from_json((artifact / MEMORY_INDEX).read_bytes())
    by_pid: dict[int, list[MemoryRange]] = {}
    for r in index.ranges:
        by_pid.setdefault(r.pid, []).append(r)
    ranges = max(by_pid.values(), key=lambda rs: sum(r.length for r in rs))
    lengths = sorted(r.length for r in ranges)
    out: dict = {
        "ranges": len(lengths),
        "bytes": sum(lengths),
        "processes": len(by_pid),
        "length_p10_p50_p90": [lengths[len(lengths) * q // 10] for q in (1, 5, 9)],
        "runs": [],
    }
    for block in (1 << 20, 4 << 20):
        for huge in (True, False):
            pid, moved = _layout_target(ranges, huge)
            memfill._BLOCK, t0 = block, time.monotonic()
            try:
                memfill.fill(
                    artifact / MEMORY_PAGES,
                    manifest.chunk_size,
                    entry.digests,
                    manifest.file_digest,
                    moved,
                    {1: pid},
                    threads,
                )
                dt, err = time.monotonic() - t0, None
            except Exception as e:  # other processes' ranges fail their chunks' digests
                dt, err = time.monotonic() - t0, f"{type(e).__name__}: {e}"[:300]
            finally:
                memfill._BLOCK = 1 << 20
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            gb_s = round(out["bytes"] / dt / 1e9, 2)
            out["runs"].append(
                {"block": block, "huge": huge, "seconds": round(dt, 3), "gb_s": gb_s, "error": err}
            )
    return out


def _raw(src: mmap.mmap, pid: int, addr: int, threads: int) -> None:
    base = ctypes.addressof(ctypes.c_char.from_buffer(src))
    pieces = range(0, len(src), CHUNK_SIZE)

    def one(off: int) -> None:
        buf = (ctypes.c_char * min(CHUNK_SIZE, len(src) - off)).from_address(base + off)
        memfill._write(pid, buf, 0, addr + off, len(buf))

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, pieces))


def _hash_mapped(path: Path, size: int, threads: int, new) -> None:
    """Each chunk hashed straight from a mapping of the file, by ``new`` (a hashlib-style
    constructor): what the hash alone costs the fill, per algorithm."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        view = memoryview(m)
        with ThreadPoolExecutor(threads) as pool:
            list(
                pool.map(
                    lambda o: new(view[o : o + CHUNK_SIZE]).digest(), range(0, size, CHUNK_SIZE)
                )
            )
        view.release()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--threads", default="1,4,8,16")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    size = int(args.gib * (1 << 30)) // CHUNK_SIZE * CHUNK_SIZE
    path = Path("/dev/shm/fill-bench-pages.bin")
    block = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for _ in range(size >> 20):
            f.write(block)
    digests: dict[str, list[str]] = {"sha256": [], "blake3": []}
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_SIZE):
            for algorithm, out in digests.items():
                h = new_hash(algorithm)
                h.update(chunk)
                out.append(h.hexdigest())
    res: dict = {"bytes": size, "cpus": os.cpu_count(), "runs": []}
    # the raw copy's source: the same file, mapped and populated (private: ctypes needs a
    # writable buffer, and nothing writes it)
    prot, flags = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_POPULATE
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, flags=flags, prot=prot) as src:
        pid, addr = _target(size, False)  # a first, untimed pass: the kernel's free lists
        _raw(src, pid, addr, 1)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        for threads in [int(t) for t in args.threads.split(",")]:
            hashes = [
                ("hash", None),
                ("hash-mapped-sha256", hashlib.sha256),
                ("hash-mapped-blake3", blake3),
            ]
            for kind, new in hashes:
                t0 = time.monotonic()
                if new is None:
                    hash_slices(slices(path, size, CHUNK_SIZE), FILE_DIGEST, threads)
                else:
                    _hash_mapped(path, size, threads, new)
                run = {
                    "kind": kind,
                    "threads": threads,
                    "gb_s": round(size / (time.monotonic() - t0) / 1e9, 2),
                }
                res["runs"].append(run)
                print(json.dumps(run), flush=True)
            for huge in (False, True):
                for kind in ("raw", "fill", "fill-sha256"):
                    pid, addr = _target(size, huge)
                    t0 = time.monotonic()
                    if kind == "raw":
                        _raw(src, pid, addr, threads)
                    else:  # the artifact's hash, and the one older artifacts have
                        algorithm = "sha256" if kind == "fill-sha256" else FILE_DIGEST
                        memfill.fill(
                            path,
                            CHUNK_SIZE,
                            digests[algorithm],
                            algorithm,
                            [MemoryRange(pid=1, vaddr=addr, length=size, offset=0)],
                            {1: pid},
                            threads,
                        )
                    dt = time.monotonic() - t0
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    run = {
                        "kind": kind,
                        "threads": threads,
                        "huge": huge,
                        "gb_s": round(size / dt / 1e9, 2),
                    }
                    res["runs"].append(run)
                    print(json.dumps(run), flush=True)
                    args.out.write_text(json.dumps(res, indent=2))
    path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
