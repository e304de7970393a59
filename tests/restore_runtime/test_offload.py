"""Weights asleep in pageable host memory (restore_runtime.offload): the piecewise copy's
order, its pinning threads and clean-up, and the host copy's memory.

CI has no GPU, so most tests here drive the copy through a stand-in driver that copies with
``memmove`` and records each call; it stands for the CUDA driver, which cannot run here. The
last test uses the real driver and runs only on a machine with an NVIDIA GPU (the stand-in
engine's pageable sleep, bench/gpu/sleep.py, is the GPU proof)."""

from __future__ import annotations

import ctypes
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from restore_runtime import offload
from restore_runtime.errors import CudaError
from tests.conftest import requires_gpu


class MemmoveDriver:
    """A stand-in for the CUDA driver (no GPU in CI): copies are memmoves, at once or, with
    ``copy_s``, each taking that long on a stream thread of their own as the driver's
    asynchronous copies do (so a piece let go of before its copy ran, or too many pieces
    locked while copies lag, shows); every call is recorded with its thread, registrations
    take ``pin_s`` each, and the copy numbered ``fail_copy``, the registration numbered
    ``fail_register`` or (``fail_bind``) making the context current on a pinning thread
    fails."""

    def __init__(
        self,
        fail_copy: int = 0,
        fail_register: int = 0,
        pin_s: float = 0.0,
        fail_bind=False,
        copy_s: float = 0.0,
    ) -> None:
        self.calls: list[tuple] = []  # (call, address or event, thread)
        self.registered: dict[int, int] = {}
        self.most_registered = self.most_registering = self.registering = 0
        self.fail_copy, self.fail_register, self.pin_s = fail_copy, fail_register, pin_s
        self.copies = self.registrations = self.last_copied = 0
        self.streams: set[int] = set()
        self.bound: set[int] = set()
        self.lock = threading.Lock()
        self.fail_bind = fail_bind
        self.copy_s = copy_s
        self.on_stream = ThreadPoolExecutor(1, "stand-in-stream") if copy_s else None
        self.queued: dict[int, Future] = {}  # a piece's address -> its copy on the stream

    def _log(self, *call: object) -> None:
        self.calls.append((*call, threading.get_ident()))

    def bind(self) -> None:
        if self.fail_bind:
            raise CudaError("cuCtxSetCurrent failed: CUresult 201")
        self.bound.add(threading.get_ident())

    def register(self, host: int, n: int) -> None:
        with self.lock:
            assert threading.get_ident() in self.bound, "registered without the context"
            self.registrations += 1
            if self.registrations == self.fail_register:
                raise CudaError("cuMemHostRegister_v2 failed: CUresult 2")
            self.registering += 1
            self.most_registering = max(self.most_registering, self.registering)
        time.sleep(self.pin_s)
        with self.lock:
            self.registering -= 1
            assert host not in self.registered
            self.registered[host] = n
            self.most_registered = max(self.most_registered, len(self.registered))
            self._log("register", host)

    def unregister(self, host: int) -> None:
        with self.lock:
            del self.registered[host]
            self._log("unregister", host)

    def stream(self) -> int:
        self.streams.add(7)
        return 7

    def destroy_stream(self, stream: int) -> None:
        self.streams.remove(stream)

    def copy(self, to_device: bool, dev: int, host: int, n: int, stream: int) -> None:
        with self.lock:
            assert self.registered.get(host) == n, "a copy from memory that is not page-locked"
            self.copies += 1
            if self.copies == self.fail_copy:
                raise CudaError("cuMemcpyHtoDAsync_v2 failed: CUresult 700")
            self._log("copy", host)
            self.last_copied = host
            if self.on_stream is None:
                self._memmove(to_device, dev, host, n)
            else:
                self.queued[host] = self.on_stream.submit(self._late, to_device, dev, host, n)

    def _late(self, to_device: bool, dev: int, host: int, n: int) -> None:
        time.sleep(self.copy_s)
        with self.lock:
            assert self.registered.get(host) == n, "let go of before its copy ran"
            self._memmove(to_device, dev, host, n)

    @staticmethod
    def _memmove(to_device: bool, dev: int, host: int, n: int) -> None:
        src, dst = (host, dev) if to_device else (dev, host)
        ctypes.memmove(dst, src, n)

    def record(self, stream: int) -> int:
        return self.last_copied  # the event stands for the last copy's piece

    def wait(self, event: int) -> None:
        copy = self.queued.pop(event, None)
        if copy is not None:
            copy.result()
        with self.lock:
            self._log("wait", event)

    def order_of(self, host: int) -> list[str]:
        return [c[0] for c in self.calls if c[1] == host]


def device_buffer(n: int) -> ctypes.Array:
    return (ctypes.c_char * n).from_buffer_copy(os.urandom(n))


@pytest.mark.parametrize("copy_s", [0.0, 0.01], ids=["instant", "lagging"])
@pytest.mark.parametrize("pinners", [1, 2, 3])
def test_a_round_trip_keeps_every_byte_and_pins_within_the_bound(pinners, copy_s):
    n = 9 * 4096 + 123  # pieces of 4 KiB, the last one short
    dev = device_buffer(n)
    before = bytes(dev)
    driver = MemmoveDriver(copy_s=copy_s)
    main = threading.get_ident()
    with offload.HostCopy(n, driver) as host:
        assert host.size % (2 << 20) == 0 and host.size >= n
        for to_device in (False, True):
            first = len(driver.calls)
            offload.copy_in_pieces(
                driver, host.ptr, ctypes.addressof(dev), n, to_device, 4096, pinners
            )
            # each call pins on threads of its own, at most ``pinners`` of them (idents are
            # counted per call: a new pool's threads need not reuse the last one's idents)
            pinning = {c[2] for c in driver.calls[first:] if c[0] in ("register", "unregister")}
            assert main not in pinning and len(pinning) <= pinners
            if not to_device:
                ctypes.memset(dev, 0, n)
        pieces = [host.ptr + at for at in range(0, n, 4096)]
    assert bytes(dev) == before
    assert driver.registered == {} and driver.streams == set()
    # with copies that lag, the pieces wait on them: the bound is what stops them piling up
    assert driver.most_registered <= 2 * pinners + 1
    for piece in pieces:  # each piece, both ways: locked, copied, waited for, let go of
        assert driver.order_of(piece) == ["register", "copy", "wait", "unregister"] * 2
    # the copies are queued in order, on the calling thread; the pinning is elsewhere
    copies = [c for c in driver.calls if c[0] == "copy"]
    assert [c[1] for c in copies] == pieces * 2
    assert {c[2] for c in copies} == {main}


def test_pieces_are_page_locked_on_several_threads_at_once():
    n = 12 * 4096
    dev = device_buffer(n)
    driver = MemmoveDriver(pin_s=0.02)
    with offload.HostCopy(n, driver) as host:
        offload.copy_in_pieces(driver, host.ptr, ctypes.addressof(dev), n, True, 4096, 3)
    assert driver.most_registering >= 2, "the registrations ran one at a time"
    assert driver.registered == {}


def test_the_host_copy_methods_cover_the_whole_range():
    n = 3 << 20
    dev = device_buffer(n)
    before = bytes(dev)
    driver = MemmoveDriver()
    with offload.HostCopy(n, driver) as host:
        host.from_device(ctypes.addressof(dev))
        ctypes.memset(dev, 0, n)
        host.to_device(ctypes.addressof(dev))
    assert bytes(dev) == before
    with pytest.raises(ValueError, match="closed"):
        host.to_device(ctypes.addressof(dev))


@pytest.mark.parametrize(
    ("fail", "match"),
    [
        ({"fail_copy": 3}, "CUresult 700"),
        ({"fail_register": 4}, "CUresult 2"),
        ({"fail_bind": True}, "cuCtxSetCurrent failed"),
    ],
    ids=["copy", "registration", "context"],
)
def test_a_failed_call_lets_go_of_every_page_locked_piece(fail, match):
    n = 10 * 4096
    dev = device_buffer(n)
    driver = MemmoveDriver(pin_s=0.005, **fail)
    before = threading.active_count()
    with offload.HostCopy(n, driver) as host, pytest.raises(CudaError, match=match):
        offload.copy_in_pieces(driver, host.ptr, ctypes.addressof(dev), n, True, 4096, 2)
    assert driver.registered == {}, "pieces left page-locked after the error"
    assert driver.streams == set()
    assert threading.active_count() == before, "pinning threads left behind"


def test_without_a_current_context_the_error_says_so():
    class NoContext:
        def cuCtxGetCurrent(self, out):
            return 0  # success, and no context: the pointer stays NULL

    with pytest.raises(CudaError, match="no CUDA context is current"):
        offload.CudaDriver(NoContext())


def test_sizes_of_nothing_are_refused():
    with pytest.raises(ValueError, match="positive"):
        offload.HostCopy(0)
    with pytest.raises(ValueError, match="pinners"):
        offload.copy_in_pieces(MemmoveDriver(), 0, 0, 4096, True, pinners=0)


@requires_gpu
def test_a_round_trip_through_the_gpu():
    lib = ctypes.CDLL("libcuda.so.1")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    assert lib.cuInit(0) == 0 and lib.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert lib.cuCtxSetCurrent(ctx) == 0
    n = (64 << 20) + 4096
    ptr = ctypes.c_uint64()
    assert lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(n)) == 0
    try:
        data = os.urandom(n)
        assert lib.cuMemcpyHtoD_v2(ptr, data, ctypes.c_size_t(n)) == 0
        with offload.HostCopy(n) as host:
            host.from_device(ptr.value)
            assert lib.cuMemsetD8_v2(ptr, 0, ctypes.c_size_t(n)) == 0
            host.to_device(ptr.value)
        back = ctypes.create_string_buffer(n)
        assert lib.cuMemcpyDtoH_v2(back, ptr, ctypes.c_size_t(n)) == 0
        assert back.raw == data
    finally:
        lib.cuMemFree_v2(ptr)
        lib.cuDevicePrimaryCtxRelease_v2(dev)
