"""A host's fingerprint: what a restore's gates compare (architecture, kernel, CRIU, the GPU
driver and GPUs, the image). One type for the three places it is written: the manifest's
compat block (the host an artifact was made on, signed with it), a PodSnapshot's
``status.source`` (the same, for users and for the agents' pre-pulls, crd.SourceInfo), and
the host a restore runs on (``restore_runtime.compat.host_info``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class GpuInfo(_Model):
    """One GPU, as the manifest's compat block and PodSnapshot ``status.source`` record it."""

    uuid: str
    product: str
    #: 0 where the inventory (the driver's /proc files) does not tell
    memory_mib: int = Field(default=0, alias="memoryMiB")


class HostFingerprint(_Model):
    """What a host is, as far as restoring onto it goes (``restore_runtime.compat.check``
    compares two)."""

    arch: str
    kernel: str
    criu_version: str = Field(alias="criuVersion")
    driver_version: str | None = Field(default=None, alias="driverVersion")
    cuda_driver_version: int | None = Field(default=None, alias="cudaDriverVersion")
    gpus: list[GpuInfo] = Field(default_factory=list)
    image_digest: str | None = Field(default=None, alias="imageDigest")
