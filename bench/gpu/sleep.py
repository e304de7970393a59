"""The stand-in's weights in one device range of the driver's virtual-memory API, as vLLM's
CuMemAllocator keeps them, and the ways an engine can sleep with them.

The range's addresses are reserved once, before ``torch.compile``, so the CUDA graphs keep
pointing at them: sleep copies the weights out and unmaps the GPU memory behind the range,
wake maps new memory at the same addresses and copies them back. Three modes:

- ``gpu``: the weights stay mapped on the GPU (the CUDA checkpoint carries them);
- ``pinned``: vLLM's level 1: copied to pinned host memory (``pin_memory=True``, a shared
  mapping the driver registers), copied back at wake from it;
- ``pageable``: copied to ordinary private memory (huge pages advised), each 512 MiB piece
  registered with the driver only around its copy, on pinning threads ahead of the copies
  (``restore_runtime.offload``, the library an engine would use; ``pageable-N``: N pinning
  threads, else the library's default); the restore then fills that memory like any other,
  and the CUDA phase has no weights to restore.

Driver calls go through ``ctypes`` to the ``libcuda.so.1`` torch has loaded; torch's
context is current on the calling thread.
"""

from __future__ import annotations

import ctypes
import os
import time

import sleep_mode  # bench/gpu, beside this file
import torch

from restore_runtime.offload import PINNERS, CudaDriver, HostCopy


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _Prop(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [
        ("type", ctypes.c_int),
        ("handle_types", ctypes.c_int),
        ("location", _Location),
        ("win32", ctypes.c_void_p),
        ("compression", ctypes.c_ubyte),
        ("rdma", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class _Access(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


_PINNED, _DEVICE, _READ_WRITE = 1, 1, 3


def _driver() -> ctypes.CDLL:
    torch.zeros(1, device="cuda")  # the primary context, current on this thread
    try:  # the one torch loaded, found by its soname
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        where = os.environ.get("TRITON_LIBCUDA_PATH", "")
        return ctypes.CDLL(os.path.join(where, "libcuda.so.1"))


class _CudaArray:
    """A device pointer torch can wrap without copying."""

    def __init__(self, ptr: int, n: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (n,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
        }


class DeviceRange:
    """``nbytes`` (rounded up to the driver's granularity) of device memory at addresses that
    outlive the memory behind them."""

    def __init__(self, nbytes: int) -> None:
        self.cu = CudaDriver(_driver())
        dev = torch.cuda.current_device()
        self.prop = _Prop(type=_PINNED, location=_Location(_DEVICE, dev))
        self.access = _Access(location=_Location(_DEVICE, dev), flags=_READ_WRITE)
        gran = ctypes.c_size_t()
        self.cu.call(
            "cuMemGetAllocationGranularity", ctypes.byref(gran), ctypes.byref(self.prop), 0
        )
        self.size = -(-nbytes // gran.value) * gran.value
        ptr = ctypes.c_uint64()
        self.cu.call("cuMemAddressReserve", ctypes.byref(ptr), ctypes.c_size_t(self.size),
                ctypes.c_size_t(0), ctypes.c_uint64(0), ctypes.c_uint64(0))  # fmt: skip
        self.ptr = ptr.value
        self.handle: int | None = None
        self.map()
        # the whole range, so host copies are whole pages (cuMemHostRegister's unit)
        self.tensor = torch.as_tensor(_CudaArray(self.ptr, self.size), device="cuda")

    def map(self) -> None:
        handle = ctypes.c_uint64()
        size = ctypes.c_size_t(self.size)
        self.cu.call("cuMemCreate", ctypes.byref(handle), size, ctypes.byref(self.prop),
                ctypes.c_uint64(0))  # fmt: skip
        self.cu.call("cuMemMap", ctypes.c_uint64(self.ptr), size, ctypes.c_size_t(0), handle,
                ctypes.c_uint64(0))  # fmt: skip
        self.cu.call("cuMemSetAccess", ctypes.c_uint64(self.ptr), size, ctypes.byref(self.access),
                ctypes.c_size_t(1))  # fmt: skip
        self.handle = handle.value

    def unmap(self) -> None:
        torch.cuda.synchronize()
        self.cu.call("cuMemUnmap", ctypes.c_uint64(self.ptr), ctypes.c_size_t(self.size))
        self.cu.call("cuMemRelease", ctypes.c_uint64(self.handle))
        self.handle = None


def place(model: torch.nn.Module) -> DeviceRange:
    """Every parameter of ``model`` (on the CPU) moved into one device range, in order."""
    params = list(model.parameters())
    sizes = [-(-p.numel() * p.element_size() // 256) * 256 for p in params]
    rng = DeviceRange(sum(sizes))
    at = 0
    for p, n in zip(params, sizes, strict=True):
        view = rng.tensor[at : at + p.numel() * p.element_size()].view(p.dtype).view(p.shape)
        view.copy_(p.data)
        p.data = view
        at += n
    torch.cuda.synchronize()
    return rng


class Sleeper:
    """The weights' range and where they go while the engine sleeps."""

    def __init__(self, text: str, rng: DeviceRange) -> None:
        self.mode, pinners = sleep_mode.parse(text)
        self.pinners = pinners or PINNERS
        self.rng = rng
        self.host: torch.Tensor | None = None
        self.pageable: HostCopy | None = None

    def sleep(self) -> float:
        t0 = time.monotonic()
        n = self.rng.tensor.numel()
        if self.mode == "pinned":  # as vLLM's CuMemAllocator.sleep(offload_tags=weights)
            self.host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
            self.host.copy_(self.rng.tensor)
        elif self.mode == "pageable":  # the library's fast path, as an engine would take it
            self.pageable = HostCopy(n, self.rng.cu, self.pinners)
            self.pageable.from_device(self.rng.ptr)
        if self.mode != "gpu":
            self.rng.unmap()
        return time.monotonic() - t0

    def wake(self) -> float:
        t0 = time.monotonic()
        if self.mode == "pinned":
            self.rng.map()
            self.rng.tensor.copy_(self.host)
        elif self.mode == "pageable" and self.pageable is not None:
            self.rng.map()
            self.pageable.to_device(self.rng.ptr)
            self.pageable.close()
            self.pageable = None
        torch.cuda.synchronize()
        self.host = None  # vLLM drops its CPU copy at wake too
        return time.monotonic() - t0
