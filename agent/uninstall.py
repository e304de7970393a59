"""``snapshot-agent uninstall-node``: what ``install-node`` put on a host, taken off again,
so that a node is as it was before the chart (docs/operations.md, "Uninstall"): the runtime
table it appended to containerd's config, the shim's wrapper, and the shim's tree with the
node's keys. The artifact store is data, and stays unless asked for.

Only what install-node wrote is removed: a table that was edited since, or a wrapper that is
not ours, is left in place with an error that says so."""

from __future__ import annotations

import logging
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path

from api import runtime
from restore_runtime.errors import SnapshotError

from .install import SHIM_NAME, runtime_table

log = logging.getLogger("snapshot.install")
WRAPPER_MARK = "# installed by snapshot-agent install-node"


@dataclass
class UninstallResult:
    removed: list[Path]
    config_changed: bool


def without_runtime(config_text: str, handler: str = runtime.HANDLER) -> str | None:
    """The config without the table install-node appended, or None when it has none."""
    try:
        version = tomllib.loads(config_text).get("version", 1)
    except tomllib.TOMLDecodeError as e:
        raise SnapshotError(f"containerd config does not parse: {e}") from e
    ours = runtime_table(version, handler)
    if ours in config_text:
        return config_text.replace(ours, "", 1).rstrip("\n") + "\n"
    if f"runtime handler {handler!r}" in config_text:
        raise SnapshotError(
            f"the {handler!r} runtime table was edited since install-node added "
            "it: remove it by hand (the config before it is kept beside it "
            "as .pre-snapshot)"
        )
    return None


def uninstall(
    host_root: Path,
    prefix: Path = Path("/opt/snapshot"),
    config: Path = Path("/etc/containerd/config.toml"),
    bin_dir: Path = Path("/usr/local/bin"),
    store: Path | None = None,
) -> UninstallResult:
    """``store``: the artifact store too (every artifact on this node)."""
    removed: list[Path] = []
    host_config = host_root / config.relative_to("/")
    changed = False
    if host_config.exists() and (new := without_runtime(host_config.read_text())) is not None:
        tmp = host_config.with_name(host_config.name + ".new")
        tmp.write_text(new)
        tmp.replace(host_config)
        changed = True
        log.info("removed runtime %r from %s", runtime.HANDLER, config)
    shim = host_root / bin_dir.relative_to("/") / SHIM_NAME
    if shim.exists():
        if WRAPPER_MARK not in shim.read_text(errors="replace"):
            raise SnapshotError(
                f"{bin_dir / SHIM_NAME} was not written by install-node: left in place"
            )
        shim.unlink()
        removed.append(bin_dir / SHIM_NAME)
    host_prefix = host_root / prefix.relative_to("/")
    trees = [
        (host_prefix, prefix),
        (host_prefix.with_name(host_prefix.name + ".new"), None),
        (host_prefix.with_name(host_prefix.name + ".old"), None),
    ]
    if store is not None:
        trees.append((host_root / store.relative_to("/"), store))
    for tree, shown in trees:
        if tree.exists():
            shutil.rmtree(tree)
            if shown is not None:
                removed.append(shown)
    return UninstallResult(removed=removed, config_changed=changed)
