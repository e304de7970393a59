"""Weights asleep in pageable host memory (restore_runtime.offload): the piecewise copy's
order and clean-up, and the host copy's memory.

CI has no GPU, so most tests here drive the copy through a stand-in driver that copies with
``memmove`` and records each call; it stands for the CUDA driver, which cannot run here. The
last test uses the real driver and runs only on a machine with an NVIDIA GPU (the stand-in
engine's pageable sleep, bench/gpu/sleep.py, is the GPU proof)."""

from __future__ import annotations

import ctypes
import os

import pytest

from restore_runtime import offload
from restore_runtime.errors import CudaError
from tests.conftest import requires_gpu


class MemmoveDriver:
    """A stand-in for the CUDA driver (no GPU in CI): copies happen at once, with memmove;
    every call is recorded, and the copy numbered ``fail_at`` fails."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.calls: list[tuple] = []
        self.registered: dict[int, int] = {}
        self.most_registered = 0
        self.fail_at, self.copies = fail_at, 0
        self.streams: set[int] = set()

    def register(self, host: int, n: int) -> None:
        assert host not in self.registered
        self.registered[host] = n
        self.most_registered = max(self.most_registered, len(self.registered))
        self.calls.append(("register", host, n))

    def unregister(self, host: int) -> None:
        del self.registered[host]
        self.calls.append(("unregister", host))

    def stream(self) -> int:
        self.streams.add(7)
        return 7

    def destroy_stream(self, stream: int) -> None:
        self.streams.remove(stream)

    def copy(self, to_device: bool, dev: int, host: int, n: int, stream: int) -> None:
        assert self.registered.get(host) == n, "a copy from memory that is not page-locked"
        self.copies += 1
        if self.copies == self.fail_at:
            raise CudaError("cuMemcpyHtoDAsync_v2 failed: CUresult 700")
        src, dst = (host, dev) if to_device else (dev, host)
        ctypes.memmove(dst, src, n)
        self.calls.append(("copy", host, n))

    def record(self, stream: int) -> int:
        return len(self.calls)

    def wait(self, event: int) -> None:
        self.calls.append(("wait", event))


def device_buffer(n: int) -> ctypes.Array:
    return (ctypes.c_char * n).from_buffer_copy(os.urandom(n))


def test_a_round_trip_keeps_every_byte_and_pins_at_most_two_pieces():
    n = 5 * 4096 + 123  # pieces of 4 KiB, the last one short
    dev = device_buffer(n)
    before = bytes(dev)
    driver = MemmoveDriver()
    with offload.HostCopy(n, driver) as host:
        assert host.size % (2 << 20) == 0 and host.size >= n
        offload.copy_in_pieces(driver, host.ptr, ctypes.addressof(dev), n, False, piece=4096)
        ctypes.memset(dev, 0, n)
        offload.copy_in_pieces(driver, host.ptr, ctypes.addressof(dev), n, True, piece=4096)
    assert bytes(dev) == before
    assert driver.registered == {} and driver.streams == set()
    # the pinning overlaps the copies: piece k+1 is registered before piece k is let go
    assert driver.most_registered == 2
    kinds = [c[0] for c in driver.calls[:6]]
    assert kinds == ["register", "copy", "register", "copy", "wait", "unregister"]
    copied = [c[2] for c in driver.calls if c[0] == "copy"]
    assert copied == [4096] * 5 + [123] + [4096] * 5 + [123]


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


def test_a_failed_copy_lets_go_of_every_page_locked_piece():
    n = 6 * 4096
    dev = device_buffer(n)
    driver = MemmoveDriver(fail_at=3)
    with offload.HostCopy(n, driver) as host, pytest.raises(CudaError, match="CUresult 700"):
        offload.copy_in_pieces(driver, host.ptr, ctypes.addressof(dev), n, True, piece=4096)
    assert driver.registered == {}, "pieces left page-locked after the error"
    assert driver.streams == set()


def test_without_a_current_context_the_error_says_so():
    class NoContext:
        def cuCtxGetCurrent(self, out):
            return 0  # success, and no context: the pointer stays NULL

    with pytest.raises(CudaError, match="no CUDA context is current"):
        offload.CudaDriver(NoContext())


def test_a_size_of_nothing_is_refused():
    with pytest.raises(ValueError, match="positive"):
        offload.HostCopy(0)


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
