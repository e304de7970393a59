"""The CUDA layer without a GPU (CI never has one), and with one where present.

Without a GPU the driver fails with a clear error, and a CPU-only tree never touches it.
UUID formatting is pure. The GPU test runs only on a machine with an NVIDIA driver
(bench/gpu/proof.py is the full GPU proof, run on the device machine)."""

from __future__ import annotations

import os

import pytest

from restore_runtime import procs
from restore_runtime.cuda import driver
from restore_runtime.errors import CudaError
from tests.conftest import HAS_GPU, requires_gpu


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
def test_no_gpu_gives_a_clear_error():
    with pytest.raises(CudaError) as e:
        driver.CudaDriver()
    msg = str(e.value)
    assert "CUDA driver" in msg or "cuda-python" in msg or "GPU" in msg
    assert driver.driver_version() is None


def test_uuid_round_trip():
    raw = bytes(range(16))
    u = driver.format_uuid(raw)
    assert u == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert driver.parse_uuid(u) == raw
    with pytest.raises(CudaError):
        driver.parse_uuid("GPU-1234")


def test_cpu_only_process_is_not_a_cuda_candidate():
    assert procs.cuda_pids(os.getpid()) == []
    assert not procs.maps_nvidia_device(os.getpid())


def test_nvidia_device_holders_are_candidates(tmp_path):
    """Stand-in: no NVIDIA device exists in CI, so a regular file named like one under /dev
    plays the device node; detection only looks at the open descriptor's path."""
    fake = "/dev/nvidia-snapshot-test"
    with open(fake, "w") as f:
        try:
            assert procs.uses_nvidia_device(os.getpid())
            assert os.getpid() in procs.cuda_pids(os.getpid())
        finally:
            os.unlink(fake)
    del f


@requires_gpu
def test_gpu_inventory():
    d = driver.CudaDriver()
    gpus = d.gpus()
    assert gpus and all(g.uuid.startswith("GPU-") for g in gpus)
    assert d.cuda_version() >= 12080
    assert driver.driver_version()
