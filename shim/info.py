"""``containerd-shim-snapshot-v2 -info``: what containerd 2.x asks every runtime's shim for
(options on stdin, a ``containerd.types.RuntimeInfo`` protobuf on stdout), to learn the
runtime handler's features: recursive read-only mounts, user namespaces, and so on. The shim
creates and starts containers with runc, so runc's features (``runc features``) are its own;
without this answer containerd 2.x assumes none, and pods on the ``snapshot`` handler lose
those Kubernetes features (CRI conformance skips their tests)."""

from __future__ import annotations

import logging
import subprocess

from .proto import introspection_pb2 as pb

log = logging.getLogger(__name__)

NAME = "io.containerd.snapshot.v2"
#: the URL containerd's runc shim gives the runtime-spec features document (JSON)
FEATURES_URL = "types.containerd.io/opencontainers/runtime-spec/1/features/Features"


def runtime_info(version: str, runc: str = "runc") -> bytes:
    info = pb.RuntimeInfo(name=NAME, version=pb.RuntimeVersion(version=version))
    try:
        p = subprocess.run([runc, "features"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        p = None
        log.warning("runc features: %s", e)
    if p is not None and p.returncode == 0:
        info.features.type_url = FEATURES_URL
        info.features.value = p.stdout
    return info.SerializeToString()
