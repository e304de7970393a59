"""The node's default paths, written once (pathlib alone: the shim's ``start``, which runs for
every container, imports this and must stay fast)."""

from __future__ import annotations

from pathlib import Path

#: where artifacts live on a node (the chart's agent.artifactStore)
DEFAULT_STORE_ROOT = Path("/var/lib/snapshot/artifacts")
#: containerd's state directory: the shims' sockets, bundles and our shim's own state
CONTAINERD_STATE = Path("/run/containerd")
#: containerd's runc shims keep their state under this, one directory per namespace
RUNC_ROOT_BASE = CONTAINERD_STATE / "runc"
#: where the CRI's (the kubelet's) containers are
DEFAULT_RUNC_ROOT = RUNC_ROOT_BASE / "k8s.io"
