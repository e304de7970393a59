"""Weights asleep in pageable host memory: the fast path through a checkpoint and restore.
Standard library only (the CUDA driver through ``ctypes``), like ``restore_runtime.workload``:
import it from any inference server.

An engine that sleeps before its checkpoint (vLLM's level 1, say) moves its weights to host
memory. Kept in *pinned* memory (``pin_memory=True``, ``cudaHostAlloc``), they restore slowly:
pinned memory is a shared mapping, slower to fill, and the driver restores the whole pinned
allocation itself. Kept in ordinary private memory, they are filled with the rest of the
process at memory speed, the driver has nothing of theirs to restore, and the wake copies them
back with each piece page-locked only around its copy, the pinning on threads of its own
(measured on an H100, the pinning then on the copying thread: 6.65 B in 2.14-2.25 s against
5.75-5.83 s pinned; docs/gpu-nodes.md)::

    from restore_runtime.offload import HostCopy

    copy = HostCopy(nbytes)        # pageable host memory, huge pages advised
    copy.from_device(dev_ptr)      # at sleep; then the engine frees or unmaps the GPU memory
    ...                            # checkpoint; a restored replica goes on from here
    copy.to_device(dev_ptr)        # at wake, once GPU memory is mapped there again
    copy.close()

The calling thread must have the engine's CUDA context current. The GPU memory's addresses
must survive the sleep (the driver's virtual-memory API: unmap and map again at the same
range, as vLLM's CuMemAllocator does), or the engine passes the new address at wake.
"""

from __future__ import annotations

import ctypes
import mmap
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from typing import Protocol

from .errors import CudaError

#: bytes page-locked at a time, one piece per registration
PIECE = 512 << 20
#: threads that page-lock pieces ahead of the copies: with one, on the copying thread, the
#: pinning bounded the wake (18.5 GB/s on an H100, against 55 GB/s for the copies themselves)
PINNERS = 2
_ALIGN = 2 << 20  # whole huge pages
_MAP_FAILED = ctypes.c_void_p(-1).value
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]  # fmt: skip
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


class Driver(Protocol):
    """The driver calls a piecewise copy makes (``CudaDriver`` below)."""

    def bind(self) -> None: ...
    def register(self, host: int, n: int) -> None: ...
    def unregister(self, host: int) -> None: ...
    def stream(self) -> int: ...
    def destroy_stream(self, stream: int) -> None: ...
    def copy(self, to_device: bool, dev: int, host: int, n: int, stream: int) -> None: ...
    def record(self, stream: int) -> int: ...
    def wait(self, event: int) -> None: ...


class CudaDriver:
    """``libcuda.so.1``, the one the engine loaded (found by its soname)."""

    def __init__(self, lib: ctypes.CDLL | None = None) -> None:
        self.lib = lib or ctypes.CDLL("libcuda.so.1")
        self.ctx = ctypes.c_void_p()
        self.call("cuCtxGetCurrent", ctypes.byref(self.ctx))
        if not self.ctx.value:
            raise CudaError("no CUDA context is current on this thread: call from the engine's")

    def call(self, name: str, *args: object) -> None:
        """Driver function ``name``; an error result raises CudaError."""
        rc = getattr(self.lib, name)(*args)
        if rc != 0:
            raise CudaError(f"{name} failed: CUresult {rc}")

    def bind(self) -> None:
        """The engine's context made current on this thread (a pinning thread's)."""
        self.call("cuCtxSetCurrent", self.ctx)

    def register(self, host: int, n: int) -> None:
        self.call("cuMemHostRegister_v2", ctypes.c_void_p(host), ctypes.c_size_t(n), 0)

    def unregister(self, host: int) -> None:
        self.call("cuMemHostUnregister", ctypes.c_void_p(host))

    def stream(self) -> int:
        s = ctypes.c_void_p()
        self.call("cuStreamCreate", ctypes.byref(s), 1)  # CU_STREAM_NON_BLOCKING
        return s.value or 0

    def destroy_stream(self, stream: int) -> None:
        self.call("cuStreamDestroy_v2", ctypes.c_void_p(stream))

    def copy(self, to_device: bool, dev: int, host: int, n: int, stream: int) -> None:
        d, h, size, s = (
            ctypes.c_uint64(dev),
            ctypes.c_void_p(host),
            ctypes.c_size_t(n),
            ctypes.c_void_p(stream),
        )
        if to_device:
            self.call("cuMemcpyHtoDAsync_v2", d, h, size, s)
        else:
            self.call("cuMemcpyDtoHAsync_v2", h, d, size, s)

    def record(self, stream: int) -> int:
        e = ctypes.c_void_p()
        self.call("cuEventCreate", ctypes.byref(e), 2)  # CU_EVENT_DISABLE_TIMING
        self.call("cuEventRecord", e, ctypes.c_void_p(stream))
        return e.value or 0

    def wait(self, event: int) -> None:
        self.call("cuEventSynchronize", ctypes.c_void_p(event))
        self.call("cuEventDestroy_v2", ctypes.c_void_p(event))


def copy_in_pieces(driver: Driver, host: int, dev: int, n: int, to_device: bool,
                   piece: int = PIECE, pinners: int = PINNERS) -> None:  # fmt: skip
    """Copy ``n`` bytes between pageable ``host`` memory and ``dev``, each piece page-locked
    only around its copy. The copies are queued on this thread, in order; the pieces are
    registered on ``pinners`` threads, up to ``pinners`` pieces ahead of the copy, and let go
    of there once their copy ended, so at most ``2 * pinners + 1`` pieces are page-locked at
    once. On an error every piece still registered is unregistered (after its copy ended)
    before the error goes on."""
    if pinners < 1:
        raise ValueError(f"pinners must be at least 1, not {pinners}")
    spans = [(host + at, dev + at, min(piece, n - at)) for at in range(0, n, piece)]
    stream = driver.stream()
    pins = _Pinners(driver, pinners)
    locking: deque[tuple[Future, int]] = deque()  # (registration, address), in piece order
    letting_go: deque[Future] = deque()  # pieces whose copy is queued, oldest first
    unqueued: int | None = None  # the address of a piece registered, its copy not queued
    try:
        for k, (h, d, size) in enumerate(spans):
            for ahead in spans[k + len(locking) : k + pinners + 1]:
                locking.append((pins.register(ahead[0], ahead[2]), ahead[0]))
            registration, address = locking.popleft()
            registration.result()  # a failed one registered nothing
            unqueued = address
            driver.copy(to_device, d, h, size, stream)
            letting_go.append(pins.let_go(driver.record(stream), h))
            unqueued = None
            while len(letting_go) > pinners:
                letting_go.popleft().result()
        while letting_go:
            letting_go.popleft().result()
    finally:
        _clean_up(driver, locking, letting_go, unqueued)
        pins.close()
        driver.destroy_stream(stream)


class _Pinners:
    """Threads that page-lock pieces and let go of them, the engine's context current on
    each: made current at a thread's first call, not by the pool's initializer, whose error
    would reach the caller only as "the pool is broken"."""

    def __init__(self, driver: Driver, n: int) -> None:
        self.driver, self.pool = driver, ThreadPoolExecutor(n, "offload-pin")
        self.bound: set[int] = set()

    def register(self, address: int, size: int) -> Future:
        return self.pool.submit(self._bound, self.driver.register, address, size)

    def let_go(self, event: int, address: int) -> Future:
        return self.pool.submit(self._bound, _let_go, self.driver, event, address)

    def _bound(self, call: Callable[..., None], *args: object) -> None:
        if threading.get_ident() not in self.bound:
            self.driver.bind()
            self.bound.add(threading.get_ident())
        call(*args)

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def _let_go(driver: Driver, event: int, address: int) -> None:
    try:
        driver.wait(event)
    finally:
        driver.unregister(address)


def _clean_up(driver: Driver, locking: deque[tuple[Future, int]], letting_go: deque[Future],
              unqueued: int | None) -> None:  # fmt: skip
    """After an error: each piece copied is let go of by its own task; each registered and
    not copied is unregistered here (one whose registration had not started never will)."""
    for task in letting_go:
        with suppress(Exception):
            task.result()
    pinned = [unqueued] if unqueued is not None else []
    for registration, address in locking:
        if registration.cancel():
            continue
        with suppress(Exception):
            registration.result()
            pinned.append(address)
    for address in pinned:
        with suppress(CudaError):
            driver.unregister(address)


class HostCopy:
    """``nbytes`` of private, pageable host memory (huge pages advised), to hold a device
    range while the engine sleeps. Not pinned: a restore fills it at memory speed."""

    def __init__(self, nbytes: int, driver: Driver | None = None, pinners: int = PINNERS) -> None:
        if nbytes <= 0:
            raise ValueError(f"nbytes must be positive, not {nbytes}")
        self.nbytes, self.pinners = nbytes, pinners
        self.size = -(-nbytes // _ALIGN) * _ALIGN
        self._driver = driver
        ptr = _libc.mmap(None, self.size, mmap.PROT_READ | mmap.PROT_WRITE,
                        mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)  # fmt: skip
        if ptr in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"mmap of {self.size} bytes failed")
        self.ptr: int | None = ptr
        _libc.madvise(ptr, self.size, mmap.MADV_HUGEPAGE)  # advice: refused is harmless

    def _pieces(self, dev_ptr: int, to_device: bool) -> None:
        if self.ptr is None:
            raise ValueError("the host copy is closed")
        if self._driver is None:
            self._driver = CudaDriver()
        copy_in_pieces(
            self._driver, self.ptr, dev_ptr, self.nbytes, to_device, pinners=self.pinners
        )

    def from_device(self, dev_ptr: int) -> None:
        self._pieces(dev_ptr, to_device=False)

    def to_device(self, dev_ptr: int) -> None:
        self._pieces(dev_ptr, to_device=True)

    def close(self) -> None:
        if self.ptr is not None:
            _libc.munmap(self.ptr, self.size)
            self.ptr = None

    def __enter__(self) -> HostCopy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
