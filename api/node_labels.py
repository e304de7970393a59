"""The node labels a restore pod's placement reads: GPU feature discovery's (the webhook asks
for the source's GPU product, driver version and architecture), spelled as GFD spells
values. One place for the webhook and for whatever labels a node by hand (a test cluster
without GFD), so the two cannot drift."""

from __future__ import annotations

import re

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
DRIVER_VERSION_LABEL = "nvidia.com/cuda.driver-version.full"
ARCH_LABEL = "kubernetes.io/arch"


def label_value(text: str) -> str:
    """GPU feature discovery's spelling of a value: "NVIDIA H200" -> "NVIDIA-H200"."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", text.strip())[:63].strip("-_.")
