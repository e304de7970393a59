"""Compatibility gates: can this host restore that artifact?

``check`` is a pure function over two host fingerprints (api/host.py): the manifest's compat
block (where the artifact was made) and this host's (``host_info``); it returns every reason
(field, expected, found) rather than stopping at the first. The restore path and the node
agent (which pre-pulls only what its node could restore) both use it.
"""

from __future__ import annotations

import os
import platform
import re

from api.host import GpuInfo, HostFingerprint

from .criu.runner import criu_version, version_tuple
from .cuda.driver import CudaDriver, cuda_driver_version, driver_version, proc_gpus
from .errors import CompatReason


def kernel_series(release: str) -> tuple[int, ...]:
    return version_tuple(release)[:2]


def host_info(
    cuda: CudaDriver | None = None,
    image_digest: str | None = None,
    with_gpus: bool = False,
    criu: str | None = None,
) -> HostFingerprint:
    """Describe this host. GPUs and driver come from the ``cuda`` handle when given, else (with
    ``with_gpus``) from the kernel driver's /proc files, without initialising CUDA. ``criu``:
    CRIU's version when the caller knows it (``criu --version`` took 0.09 s on a GPU node)."""
    info = HostFingerprint(
        arch=platform.machine(),
        kernel=os.uname().release,
        criu_version=criu or criu_version(),
        image_digest=image_digest,
    )
    if cuda is not None:
        info.driver_version = driver_version()
        info.cuda_driver_version = cuda.cuda_version()
        info.gpus = cuda.gpus()
    elif with_gpus:
        info.driver_version = driver_version()
        info.cuda_driver_version = cuda_driver_version()
        info.gpus = proc_gpus()
    return info


_NVIDIA_DEV = re.compile(r"/dev/nvidia(\d+)")


def allocated_gpus(spec: dict | None, gpus: list[GpuInfo], minors: dict[str, int]) -> list[GpuInfo]:
    """The host GPUs a container was given, the only ones a restore may map its GPUs
    onto: ``NVIDIA_VISIBLE_DEVICES`` in its OCI spec (UUIDs or indices, ``all``), else the
    ``/dev/nvidiaN`` device nodes the spec lists (``minors``: UUID -> N); every GPU without a
    spec (snapshotctl restores no container)."""
    if spec is None:
        return list(gpus)
    env = dict(e.partition("=")[::2] for e in (spec.get("process") or {}).get("env") or [])
    if "NVIDIA_VISIBLE_DEVICES" in env:
        wanted = [w.strip() for w in env["NVIDIA_VISIBLE_DEVICES"].split(",") if w.strip()]
        if wanted == ["all"]:
            return list(gpus)
        return [g for i, g in enumerate(gpus) if g.uuid in wanted or str(i) in wanted]
    nodes = {
        int(m[1])
        for d in (spec.get("linux") or {}).get("devices") or []
        if (m := _NVIDIA_DEV.fullmatch(d.get("path", "")))
    }
    return [g for g in gpus if minors.get(g.uuid) in nodes]


def gpu_assignment(wanted: list[GpuInfo], have: list[GpuInfo]) -> list[GpuInfo | None]:
    """For each source GPU, the host GPU that takes its place: the same UUID if present,
    otherwise an unused GPU of the same product; None where there is none. Same-UUID matches
    are taken first so a product match never steals a GPU that another source GPU owns."""
    out: list[GpuInfo | None] = [next((h for h in have if h.uuid == g.uuid), None) for g in wanted]
    free = [h for h in have if h not in out]
    for i, g in enumerate(wanted):
        if out[i] is None and (match := next((h for h in free if h.product == g.product), None)):
            free.remove(match)
            out[i] = match
    return out


def gpu_pairs(compat: HostFingerprint, host: HostFingerprint) -> list[tuple[str, str]]:
    return [
        (g.uuid, h.uuid)
        for g, h in zip(compat.gpus, gpu_assignment(compat.gpus, host.gpus), strict=True)
        if h is not None
    ]


def check(compat: HostFingerprint, host: HostFingerprint) -> list[CompatReason]:
    reasons: list[CompatReason] = []

    def need(fieldname: str, expected: object, found: object) -> None:
        reasons.append(CompatReason(fieldname, str(expected), str(found)))

    if compat.arch != host.arch:
        need("arch", compat.arch, host.arch)
    if kernel_series(compat.kernel) != kernel_series(host.kernel):
        # CRIU images carry kernel-specific state (vDSO layout, socket options); restore is
        # only supported within one kernel series.
        need("kernel", f"{'.'.join(map(str, kernel_series(compat.kernel)))}.x", host.kernel)
    if version_tuple(host.criu_version)[:2] < version_tuple(compat.criu_version)[:2]:
        need("criuVersion", f">= {compat.criu_version}", host.criu_version)
    if compat.image_digest and host.image_digest and compat.image_digest != host.image_digest:
        need("imageDigest", compat.image_digest, host.image_digest)
    if not compat.gpus:
        return reasons
    # The CUDA checkpoint format is private to the driver: restore needs the same one.
    if compat.driver_version != host.driver_version:
        need("driverVersion", compat.driver_version, host.driver_version)
    if compat.cuda_driver_version != host.cuda_driver_version:
        need("cudaDriverVersion", compat.cuda_driver_version, host.cuda_driver_version)
    if len(host.gpus) < len(compat.gpus):
        need("gpus.count", f">= {len(compat.gpus)}", len(host.gpus))
    else:
        for i, (g, h) in enumerate(
            zip(compat.gpus, gpu_assignment(compat.gpus, host.gpus), strict=True)
        ):
            if h is None:
                need(f"gpus[{i}].product", g.product, sorted({x.product for x in host.gpus}))
    return reasons
