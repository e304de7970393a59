"""Compatibility gates on synthetic manifests and hosts (pure functions).

Cases: identical host passes; each field (arch, kernel series, CRIU version, image digest,
driver, CUDA version, GPU count, GPU product) yields one structured reason; every reason is
reported at once; CPU-only artifacts ignore GPU fields; GPU UUID pairing prefers the same
UUID, then the same product.
"""

from __future__ import annotations

import pytest

from api.host import HostFingerprint
from api.manifest import Compat, GpuInfo
from restore_runtime.compat import check, gpu_pairs

H200 = "NVIDIA H200"


def gpu(n: int, product: str = H200) -> GpuInfo:
    return GpuInfo(uuid=f"GPU-{n:08x}-0000-0000-0000-000000000000", product=product, memoryMiB=1)


def compat(**kw) -> Compat:
    base = dict(
        arch="x86_64",
        kernel="6.18.44-fc",
        criuVersion="4.2.1",
        driverVersion="580.159.04",
        cudaDriverVersion=13000,
        gpus=[gpu(1)],
    )
    return Compat(**{**base, **kw})


def host(**kw) -> HostFingerprint:
    base = dict(
        arch="x86_64",
        kernel="6.18.50-other",
        criu_version="4.2.1",
        driver_version="580.159.04",
        cuda_driver_version=13000,
        gpus=[gpu(2)],
    )
    return HostFingerprint(**{**base, **kw})


def fields(c: Compat, h: HostFingerprint) -> list[str]:
    return [r.field for r in check(c, h)]


def test_compatible_host_passes():
    assert check(compat(), host()) == []


@pytest.mark.parametrize(
    ("h", "field", "expected", "found"),
    [
        (host(arch="aarch64"), "arch", "x86_64", "aarch64"),
        (host(kernel="6.1.0-28-amd64"), "kernel", "6.18.x", "6.1.0-28-amd64"),
        (host(criu_version="4.1.1"), "criuVersion", ">= 4.2.1", "4.1.1"),
        (host(driver_version="570.1"), "driverVersion", "580.159.04", "570.1"),
        (host(driver_version=None), "driverVersion", "580.159.04", "None"),
        (host(cuda_driver_version=12080), "cudaDriverVersion", "13000", "12080"),
        (host(gpus=[]), "gpus.count", ">= 1", "0"),
        (host(gpus=[gpu(3, "NVIDIA A100")]), "gpus[0].product", H200, "['NVIDIA A100']"),
    ],
)
def test_each_gate_reports_field_expected_found(h, field, expected, found):
    (reason,) = check(compat(), h)
    assert (reason.field, reason.expected, reason.found) == (field, expected, found)
    assert field in str(reason)


def test_newer_criu_on_host_is_fine():
    assert check(compat(), host(criu_version="4.3")) == []


def test_image_digest_gate_only_when_both_known():
    c = compat(imageDigest="sha256:aaa")
    assert fields(c, host(image_digest="sha256:bbb")) == ["imageDigest"]
    assert check(c, host(image_digest=None)) == []
    assert check(c, host(image_digest="sha256:aaa")) == []


def test_all_reasons_at_once():
    h = host(arch="aarch64", kernel="5.10", driver_version="1", gpus=[])
    assert fields(compat(), h) == ["arch", "kernel", "driverVersion", "gpus.count"]


def test_cpu_only_artifact_ignores_gpu_fields():
    c = compat(gpus=[], driverVersion=None, cudaDriverVersion=None)
    assert check(c, host(gpus=[], driver_version=None, cuda_driver_version=None)) == []


def test_gpu_pairs_prefer_same_uuid_then_product():
    c = compat(gpus=[gpu(1), gpu(2)])
    h = host(gpus=[gpu(2), gpu(7), gpu(8, "NVIDIA A100")])
    assert gpu_pairs(c, h) == [(gpu(1).uuid, gpu(7).uuid), (gpu(2).uuid, gpu(2).uuid)]
    assert check(c, h) == []


def test_two_gpus_of_which_one_product_is_missing():
    c = compat(gpus=[gpu(1), gpu(2, "NVIDIA B200")])
    assert fields(c, host(gpus=[gpu(5), gpu(6)])) == ["gpus[1].product"]


def test_gpu_pairing_only_onto_the_containers_gpus():
    """Finding 10 of isolation round 2: a restore mapped its GPUs onto any GPU of the host,
    not only the ones allocated to the container (a pure function: CI has no GPU)."""
    from restore_runtime.compat import allocated_gpus

    gpus = [GpuInfo(uuid=f"GPU-{i}", product="H200") for i in range(4)]
    minors = {f"GPU-{i}": i for i in range(4)}

    def spec(env=None, devices=()):
        return {
            "process": {"env": [f"{k}={v}" for k, v in (env or {}).items()]},
            "linux": {"devices": [{"path": d} for d in devices]},
        }

    assert allocated_gpus(spec({"NVIDIA_VISIBLE_DEVICES": "GPU-2"}), gpus, minors) == [gpus[2]]
    assert allocated_gpus(spec({"NVIDIA_VISIBLE_DEVICES": "1,3"}), gpus, minors) == [
        gpus[1],
        gpus[3],
    ]
    assert allocated_gpus(spec({"NVIDIA_VISIBLE_DEVICES": "all"}), gpus, minors) == gpus
    assert allocated_gpus(spec({"NVIDIA_VISIBLE_DEVICES": "void"}), gpus, minors) == []
    assert allocated_gpus(spec(devices=["/dev/nvidia3", "/dev/nvidiactl"]), gpus, minors) == [
        gpus[3]
    ]
    assert allocated_gpus(spec(), gpus, minors) == [], "a container without GPUs gets none"
    assert allocated_gpus(None, gpus, minors) == gpus, "snapshotctl: no container"
    # the source's GPU is on the host, but not the container's: not taken, and the gate says so
    source = Compat(arch="x86_64", kernel="6.1.0", criuVersion="4.2", gpus=[gpus[0]])
    host = HostFingerprint(
        arch="x86_64",
        kernel="6.1.0",
        criu_version="4.2",
        gpus=allocated_gpus(spec(devices=["/dev/nvidia3"]), gpus, minors),
    )
    assert gpu_pairs(source, host) == [("GPU-0", "GPU-3")]
