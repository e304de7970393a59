"""The configuration files of devnode's containerd: config version 2 for containerd 1.7
(CRI plugin ``io.containerd.grpc.v1.cri``), version 3 for containerd 2.x (its CRI settings
split into ``io.containerd.cri.v1.images`` and ``io.containerd.cri.v1.runtime``), with the
``snapshot`` runtime registered as the node installer registers it, and the CNI bridge."""

from __future__ import annotations

from pathlib import Path

from api.runtime import runtime_table

PAUSE_IMAGE = "localhost/snapshot/pause:1"
CNI_BIN = "/usr/lib/cni"

SNAPSHOT_RUNTIME = runtime_table(2)


def cri_section(base: Path, with_snapshot: bool) -> str:
    return f"""[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # These VMs lack CAP_SYS_RESOURCE: a negative oom_score_adj cannot be written.
  restrict_oom_score_adj = true
  # CDI devices, as GPU Operator nodes name GPUs (on by default in containerd 2.x)
  enable_cdi = true
  cdi_spec_dirs = ["{base}/cdi"]
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
{SNAPSHOT_RUNTIME if with_snapshot else ""}  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{base}/cni"
  [plugins."io.containerd.grpc.v1.cri".registry]
    # every registry host maps to a local server (certs.d/_default): pulls never leave
    config_path = "{base}/certs.d"
"""


def runtime_dropin(base: Path) -> str:
    """The drop-in that registers runtime handler ``snapshot`` (RuntimeClass snapshot); the
    pod annotations it lists reach the shim through the OCI spec. containerd 1.7 replaces a
    plugin's whole table with an imported one, so the drop-in repeats the node's CRI
    settings (the Helm chart's agent renders it from the node's own config)."""
    return "version = 2\n" + cri_section(base, with_snapshot=True)


def config_toml(base: Path) -> str:
    return f"""version = 2
root = "{base}/root"
state = "{base}/state"
imports = ["{base}/conf.d/*.toml"]
[grpc]
  address = "{base}/containerd.sock"
[ttrpc]
  address = "{base}/containerd.sock.ttrpc"
{cri_section(base, with_snapshot=False)}"""


def config_v3(base: Path, with_snapshot: bool = True, cdi_dirs: tuple[str, ...] = ()) -> str:
    """containerd 2.x: one file (its imports merge, but one file is what a node has);
    without the snapshot runtime when the node installer is to register it. ``cdi_dirs``:
    where else CDI specs are read (the NVIDIA device plugin writes to /var/run/cdi)."""
    specs = ", ".join(f'"{d}"' for d in (f"{base}/cdi", *cdi_dirs))
    return f"""version = 3
root = "{base}/root"
state = "{base}/state"
[grpc]
  address = "{base}/containerd.sock"
[ttrpc]
  address = "{base}/containerd.sock.ttrpc"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE_IMAGE}"
  [plugins."io.containerd.cri.v1.images".registry]
    # every registry host maps to a local server (certs.d/_default): pulls never leave
    config_path = "{base}/certs.d"
[plugins."io.containerd.cri.v1.runtime"]
  # These VMs lack CAP_SYS_RESOURCE: a negative oom_score_adj cannot be written.
  restrict_oom_score_adj = true
  enable_cdi = true
  cdi_spec_dirs = [{specs}]
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
{runtime_table(3) if with_snapshot else ""}  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{CNI_BIN}"]
    conf_dir = "{base}/cni"
"""


def cni_conflist(bridge: str, subnet: str) -> str:
    return f"""{{
  "cniVersion": "1.0.0",
  "name": "{bridge}",
  "plugins": [
    {{"type": "bridge", "bridge": "{bridge}", "isGateway": true, "ipMasq": false,
      "ipam": {{"type": "host-local", "ranges": [[{{"subnet": "{subnet}"}}]],
               "routes": [{{"dst": "0.0.0.0/0"}}], "dataDir": "/run/{bridge}-ipam"}}}},
    {{"type": "portmap", "capabilities": {{"portMappings": true}}}}
  ]
}}
"""
