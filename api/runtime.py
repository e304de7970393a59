"""How containerd knows our shim (the architecture's "RuntimeClass"): RuntimeClass
``snapshot`` -> runtime handler ``snapshot`` -> runtime type ``io.containerd.snapshot.v2``,
whose pod annotations reach the shim through the OCI spec. One renderer of that table, used
by the node installer and by devnode's containerd."""

from __future__ import annotations

HANDLER = "snapshot"
RUNTIME_TYPE = "io.containerd.snapshot.v2"
POD_ANNOTATIONS = ("nvidia.com/*", "snapshot.nvidia.com/*")
#: of the kubelet's container annotations, the restart count (a restart starts cold)
CONTAINER_ANNOTATIONS = ("io.kubernetes.container.restartCount",)
#: containerd's CRI runtime plugin, by config version (1.7 writes version 2, 2.x version 3)
CRI_PLUGINS = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}


class UnsupportedConfig(ValueError):
    pass


def runtime_path(config_version: int, handler: str = HANDLER) -> list[str]:
    """The keys of the runtime's table in a containerd config of that version."""
    if config_version not in CRI_PLUGINS:
        raise UnsupportedConfig(f"containerd config version {config_version} is not supported")
    return ["plugins", CRI_PLUGINS[config_version], "containerd", "runtimes", handler]


def runtime_table(config_version: int, handler: str = HANDLER) -> str:
    """The TOML table that registers the shim under ``handler``."""
    plugins, plugin, *rest = runtime_path(config_version, handler)
    table = ".".join([plugins, f'"{plugin}"', *rest])  # the plugin name has dots: quoted
    pod = ", ".join(f'"{a}"' for a in POD_ANNOTATIONS)
    container = ", ".join(f'"{a}"' for a in CONTAINER_ANNOTATIONS)
    return (
        f'[{table}]\n  runtime_type = "{RUNTIME_TYPE}"\n  pod_annotations = [{pod}]\n'
        f"  container_annotations = [{container}]\n"
    )
