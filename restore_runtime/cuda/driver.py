"""The only module that calls the CUDA driver (``cuda.bindings.driver`` from cuda-python).

It exposes the checkpoint API (lock, checkpoint, restore with GPU UUID remapping, unlock,
state) and the GPU inventory, nothing else. The CUDA checkpoint calls act on another process
by PID; the caller only needs ``cuInit(0)`` first, and works from the host PID namespace on a
process inside a container's PID namespace (measured on an H200; README, "Benchmarks").
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

from api.manifest import GpuInfo

from ..errors import CudaError

_DRIVER_VERSION_FILE = Path("/proc/driver/nvidia/version")


def driver_version() -> str | None:
    """The kernel driver's version (e.g. 580.159.04), or None with no NVIDIA driver."""
    try:
        text = _DRIVER_VERSION_FILE.read_text()
    except OSError:
        return None
    m = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9][0-9.]+)", text)
    return m.group(1) if m else None


_GPUS_DIR = Path("/proc/driver/nvidia/gpus")


def proc_gpus() -> list[GpuInfo]:
    """The GPUs as the kernel driver lists them (product and UUID), without initialising
    CUDA: cuInit takes ~0.2 s, which the restore path overlaps with CRIU instead of waiting
    for it before the compatibility gates. Empty when the driver does not expose them."""
    out = []
    for info in sorted(_GPUS_DIR.glob("*/information")):
        fields = {}
        for line in info.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
        if fields.get("GPU UUID", "").startswith("GPU-") and fields.get("Model"):
            out.append(GpuInfo(uuid=fields["GPU UUID"], product=fields["Model"], memoryMiB=0))
    return out


def proc_gpu_minors() -> dict[str, int]:
    """Each GPU's UUID -> the minor number of its /dev/nvidiaN, from the kernel driver."""
    out = {}
    for info in sorted(_GPUS_DIR.glob("*/information")):
        fields = dict(
            line.partition(":")[::2] for line in info.read_text(errors="replace").splitlines()
        )
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        if fields.get("GPU UUID") and fields.get("Device Minor", "").isdigit():
            out[fields["GPU UUID"]] = int(fields["Device Minor"])
    return out


def cuda_driver_version() -> int | None:
    """The CUDA version the driver supports (e.g. 13000); needs no cuInit."""
    try:
        from cuda.bindings import driver as drv

        err, v = drv.cuDriverGetVersion()
    except Exception:
        return None
    return int(v) if err == drv.CUresult.CUDA_SUCCESS else None


def format_uuid(raw: bytes) -> str:
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def parse_uuid(uuid: str) -> bytes:
    h = uuid.removeprefix("GPU-").replace("-", "")
    if len(h) != 32:
        raise CudaError(f"malformed GPU UUID {uuid!r}")
    return bytes.fromhex(h)


#: where a process in a container sees the host's root filesystem. The node agent's image
#: holds none of the driver's libraries (they belong to the host's driver, whatever its
#: version); the chart sets /proc/1/root, the host's init under hostPID.
HOST_ROOT_ENV = "SNAPSHOT_HOST_ROOT"
_DRIVER_LIB = "libcuda.so.1"
_MACHINE = platform.machine()  # x86_64, aarch64
#: how ldconfig -p names this machine's ABI: "libcuda.so.1 (libc6,x86-64) => /usr/lib/..."
_CACHE_ABI = {"x86_64": "x86-64", "aarch64": "AArch64"}.get(_MACHINE, _MACHINE)
#: where distributions and GPU images put the driver's libraries, when the cache names none
_DRIVER_DIRS = (f"usr/lib/{_MACHINE}-linux-gnu", "usr/lib64", "usr/local/nvidia/lib64", "usr/lib")


def host_libcuda(root: Path) -> Path | None:
    """The host's libcuda.so.1 seen under ``root``: as the host's dynamic loader finds it
    (its /etc/ld.so.cache), else in the usual directories. Links are followed inside
    ``root``, so an absolute link target is the host's, not this container's."""
    named = []
    cache = root / "etc/ld.so.cache"
    try:
        cached = cache.is_file()
    except OSError:  # unreadable there: the usual directories below
        cached = False
    if cached:
        try:
            out = subprocess.run(
                ["ldconfig", "-p", "-C", str(cache)], capture_output=True, text=True, check=False
            ).stdout
        except OSError:  # no ldconfig in this image: the usual directories below
            out = ""
        for line in out.splitlines():
            lib, _, path = line.strip().partition(" => ")
            if lib.split(" ", 1)[0] == _DRIVER_LIB and _CACHE_ABI in lib:
                named.append(path.strip())
    for host_path in [*named, *(f"/{d}/{_DRIVER_LIB}" for d in _DRIVER_DIRS)]:
        p = root / host_path.lstrip("/")
        for _ in range(8):  # libcuda.so.1 -> libcuda.so.580.159.04, maybe absolute
            if not p.is_symlink():
                break
            target = Path(os.readlink(p))
            p = root / str(target).lstrip("/") if target.is_absolute() else p.parent / target
        if p.is_file():
            return p
    return None


@functools.cache  # once a process: the library stays loaded
def _load_host_driver() -> None:
    """With $SNAPSHOT_HOST_ROOT, the host's libcuda.so.1 is loaded first, by its path: the
    bindings' own ``dlopen("libcuda.so.1")`` then finds it loaded (by its soname) instead of
    searching this container, which has none."""
    root = os.environ.get(HOST_ROOT_ENV)
    if root and (lib := host_libcuda(Path(root))) is not None:
        try:
            ctypes.CDLL(str(lib), mode=os.RTLD_GLOBAL)
        except OSError as e:
            msg = f"the host's CUDA driver {lib} does not load: {e}"
            raise CudaError(msg, call="dlopen") from e


class CudaDriver:
    """A handle on the CUDA driver. Constructing it fails with a clear CudaError when
    cuda-python, the driver or a GPU is missing."""

    def __init__(self) -> None:
        _load_host_driver()
        try:
            from cuda.bindings import driver as drv
        except ImportError as e:
            raise CudaError(
                "cuda-python is not installed: install the 'gpu' extra "
                "(pip install 'gpu-snapshot[gpu]')",
                call="import",
            ) from e
        self._drv = drv
        try:
            (err,) = drv.cuInit(0)
        except Exception as e:  # the bindings raise when libcuda.so itself is missing
            raise CudaError(f"no CUDA driver on this host: {e}", call="cuInit") from e
        self._check("cuInit", err, hint="is an NVIDIA GPU and driver present?")
        if not hasattr(drv, "cuCheckpointProcessLock"):
            raise CudaError("this cuda-python has no checkpoint API (needs driver >= 570)")

    # -- plumbing ---------------------------------------------------------------------------
    def _check(self, call: str, err: Any, pid: int | None = None, hint: str = "") -> None:
        if err == self._drv.CUresult.CUDA_SUCCESS:
            return
        _, name = self._drv.cuGetErrorName(err)
        _, text = self._drv.cuGetErrorString(err)
        who = f" for PID {pid}" if pid is not None else ""
        msg = f"{call}{who} failed: {_s(name)} ({_s(text)})"
        raise CudaError(f"{msg}; {hint}" if hint else msg, call=call, code=int(err))

    # -- inventory --------------------------------------------------------------------------
    def cuda_version(self) -> int:
        err, v = self._drv.cuDriverGetVersion()
        self._check("cuDriverGetVersion", err)
        return int(v)

    def gpus(self) -> list[GpuInfo]:
        drv = self._drv
        err, n = drv.cuDeviceGetCount()
        self._check("cuDeviceGetCount", err)
        out = []
        for i in range(n):
            err, dev = drv.cuDeviceGet(i)
            self._check("cuDeviceGet", err)
            err, name = drv.cuDeviceGetName(256, dev)
            self._check("cuDeviceGetName", err)
            err, uuid = drv.cuDeviceGetUuid(dev)
            self._check("cuDeviceGetUuid", err)
            err, mem = drv.cuDeviceTotalMem(dev)
            self._check("cuDeviceTotalMem", err)
            out.append(
                GpuInfo(
                    uuid=format_uuid(bytes(uuid.bytes)),
                    product=_s(name).split("\x00", 1)[0],
                    memoryMiB=int(mem) // (1024 * 1024),
                )
            )
        return out

    # -- checkpoint API ---------------------------------------------------------------------
    def state(self, pid: int) -> str:
        err, st = self._drv.cuCheckpointProcessGetState(pid)
        self._check("cuCheckpointProcessGetState", err, pid)
        return st.name.removeprefix("CU_PROCESS_STATE_").lower()

    def is_cuda_process(self, pid: int) -> bool:
        """True when the driver holds CUDA state for ``pid``. Holding /dev/nvidia* open is not
        enough: helper processes (torch.compile's workers, say) inherit those descriptors
        without ever creating a context, and the driver answers NOT_INITIALIZED for them."""
        err, _ = self._drv.cuCheckpointProcessGetState(pid)
        if err == self._drv.CUresult.CUDA_ERROR_NOT_INITIALIZED:
            return False
        self._check("cuCheckpointProcessGetState", err, pid)
        return True

    def lock(self, pid: int, timeout_ms: int = 0) -> None:
        args = None
        if timeout_ms:
            args = self._drv.CUcheckpointLockArgs()
            args.timeoutMs = timeout_ms
        (err,) = self._drv.cuCheckpointProcessLock(pid, args)
        self._check("cuCheckpointProcessLock", err, pid)

    def checkpoint(self, pid: int) -> None:
        (err,) = self._drv.cuCheckpointProcessCheckpoint(pid, None)
        self._check("cuCheckpointProcessCheckpoint", err, pid)

    def restore(self, pid: int, gpu_pairs: list[tuple[str, str]] | None = None) -> None:
        """Restore GPU state; ``gpu_pairs`` maps source GPU UUIDs to this host's UUIDs.
        Identity pairs are dropped: the driver needs pairs only to remap."""
        pairs = [(a, b) for a, b in (gpu_pairs or []) if a != b]
        args = None
        if pairs:
            drv = self._drv
            args = drv.CUcheckpointRestoreArgs()
            structs = []
            for old, new in pairs:
                p = drv.CUcheckpointGpuPair()
                p.oldUuid = _cuuuid(drv, parse_uuid(old))
                p.newUuid = _cuuuid(drv, parse_uuid(new))
                structs.append(p)
            args.gpuPairs = structs
            args.gpuPairsCount = len(structs)
        (err,) = self._drv.cuCheckpointProcessRestore(pid, args)
        self._check("cuCheckpointProcessRestore", err, pid)

    def unlock(self, pid: int) -> None:
        (err,) = self._drv.cuCheckpointProcessUnlock(pid, None)
        self._check("cuCheckpointProcessUnlock", err, pid)


def _cuuuid(drv: Any, raw: bytes) -> Any:
    u = drv.CUuuid()
    u.bytes = raw
    return u


def _s(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes | bytearray) else str(v)
