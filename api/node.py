"""The node's restore settings: where artifacts may come from and which key must have signed
them. The installer writes them into the shim's wrapper as environment variables; the shim
reads them back once, as it starts. One model, so the two cannot disagree on a name."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .paths import CONTAINERD_STATE, DEFAULT_STORE_ROOT, RUNC_ROOT_BASE

VERIFY_KEY_ENV = "SNAPSHOT_VERIFY_KEY"
SIGNING_REQUIRED_ENV = "SNAPSHOT_SIGNING_REQUIRED"
STORE_ROOT_ENV = "SNAPSHOT_STORE_ROOT"
OCI_PLAIN_HTTP_ENV = "SNAPSHOT_OCI_PLAIN_HTTP"
OCI_AUTH_FILE_ENV = "SNAPSHOT_OCI_AUTH_FILE"
OCI_CACHE_MAX_BYTES_ENV = "SNAPSHOT_OCI_CACHE_MAX_BYTES"
OCI_PULL_TIMEOUT_ENV = "SNAPSHOT_OCI_PULL_TIMEOUT"
FILL_THREADS_ENV = "SNAPSHOT_FILL_THREADS"
FILL_LEDGER_ENV = "SNAPSHOT_FILL_LEDGER"
#: how much a node's cache of pulled artifacts may hold (the chart's storage.oci.cacheMaxGB)
DEFAULT_CACHE_MAX_BYTES = 200 * 1024**3
STATE_DIR_ENV = "SNAPSHOT_SHIM_STATE_DIR"
RUNC_ROOT_ENV = "SNAPSHOT_RUNC_ROOT"
RUNTIME_BINARY_ENV = "SNAPSHOT_RUNTIME_BINARY"


class NodeSettingError(ValueError):
    """A node setting (an environment variable of the shim's wrapper) that does not parse:
    names the variable and what it should be."""

    def __init__(self, name: str, value: str, wanted: str) -> None:
        super().__init__(f"node setting {name}={value!r}: {wanted}")
        self.name = name


def _number(env: Mapping[str, str], name: str, kind: type[int] | type[float], default):
    value = env.get(name) or ""
    if not value:
        return default
    try:
        number = kind(value)
    except ValueError:
        wanted = "not an integer" if kind is int else "not a number"
        raise NodeSettingError(name, value, wanted) from None
    if number < 0:
        raise NodeSettingError(name, value, "negative")
    return number


_ON, _OFF = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def switch(value: str) -> bool:
    """A node setting that is on or off (the environment's and the agent's flags alike): a
    value that is neither is refused, never guessed (``flase`` turned nothing off)."""
    v = value.strip().lower()
    if v not in _ON + _OFF:
        raise ValueError(f"{value!r} is not true or false")
    return v in _ON


def _switch(env: Mapping[str, str], name: str, default: bool) -> bool:
    value = env.get(name) or ""
    if not value:
        return default
    try:
        return switch(value)
    except ValueError:
        raise NodeSettingError(name, value, "not true or false") from None


@dataclass(frozen=True)
class NodeConfig:
    """What the node's admin decided (the installer writes it into the shim's wrapper as
    environment variables): where artifacts may come from, and the key they must be signed
    with. Secure by default: signatures are required unless turned off explicitly."""

    store_root: Path = DEFAULT_STORE_ROOT
    verify_key_path: Path | None = None
    signing_required: bool = True
    #: OCI artifacts: registries reached over plain HTTP, a docker config.json with
    #: credentials, and how much the node's cache of pulled artifacts may hold
    oci_plain_http: tuple[str, ...] = ()
    oci_auth_file: Path | None = None
    oci_cache_max_bytes: int = DEFAULT_CACHE_MAX_BYTES
    #: a pull that takes longer fails the restore (a cold start under fallback): it must end
    #: well inside the kubelet's runtime request timeout (2 minutes by default)
    oci_pull_timeout_s: float = 90.0
    #: threads that fill a restore's memory file into the tree; None: min(CPUs, 16)
    fill_threads: int | None = None
    #: a memory-file chunk verified once on this node (local stores only) is not hashed by
    #: later or concurrent restores of the same file version (restore_runtime/fill_ledger.py)
    fill_ledger: bool = True
    #: containerd's state directory (the shim keeps its sockets and state under it) and the
    #: root of runc's state, one directory per containerd namespace below it
    state_dir: Path = CONTAINERD_STATE
    runc_root: Path = RUNC_ROOT_BASE
    #: the OCI runtime the shim runs for create, start, exec and restore: runc, or a
    #: runc-compatible wrapper such as the NVIDIA container toolkit's
    #: ``nvidia-container-runtime`` (what containerd's runc shim calls ``BinaryName``)
    runtime_binary: str = "runc"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> NodeConfig:
        env = os.environ if env is None else env
        key = env.get(VERIFY_KEY_ENV)
        auth = env.get(OCI_AUTH_FILE_ENV)
        fill = _number(env, FILL_THREADS_ENV, int, 0)
        return cls(
            store_root=Path(env.get(STORE_ROOT_ENV) or DEFAULT_STORE_ROOT),
            verify_key_path=Path(key) if key else None,
            signing_required=_switch(env, SIGNING_REQUIRED_ENV, True),
            oci_plain_http=tuple(h for h in env.get(OCI_PLAIN_HTTP_ENV, "").split(",") if h),
            oci_auth_file=Path(auth) if auth else None,
            oci_cache_max_bytes=_number(env, OCI_CACHE_MAX_BYTES_ENV, int, cls.oci_cache_max_bytes),
            oci_pull_timeout_s=_number(env, OCI_PULL_TIMEOUT_ENV, float, cls.oci_pull_timeout_s),
            fill_threads=fill if fill > 0 else None,
            fill_ledger=_switch(env, FILL_LEDGER_ENV, True),
            state_dir=Path(env.get(STATE_DIR_ENV) or CONTAINERD_STATE),
            runc_root=Path(env.get(RUNC_ROOT_ENV) or RUNC_ROOT_BASE),
            runtime_binary=env.get(RUNTIME_BINARY_ENV) or "runc",
        )

    def to_env(self) -> dict[str, str]:
        """The environment that ``from_env`` reads back (the installer's wrapper sets it)."""
        env = {
            STORE_ROOT_ENV: str(self.store_root),
            SIGNING_REQUIRED_ENV: "true" if self.signing_required else "false",
        }
        if self.verify_key_path is not None:
            env[VERIFY_KEY_ENV] = str(self.verify_key_path)
        if self.oci_plain_http:
            env[OCI_PLAIN_HTTP_ENV] = ",".join(self.oci_plain_http)
        if self.oci_auth_file is not None:
            env[OCI_AUTH_FILE_ENV] = str(self.oci_auth_file)
        env[OCI_CACHE_MAX_BYTES_ENV] = str(self.oci_cache_max_bytes)
        env[OCI_PULL_TIMEOUT_ENV] = str(self.oci_pull_timeout_s)
        if self.fill_threads:
            env[FILL_THREADS_ENV] = str(self.fill_threads)
        if not self.fill_ledger:
            env[FILL_LEDGER_ENV] = "false"
        if self.state_dir != CONTAINERD_STATE:
            env[STATE_DIR_ENV] = str(self.state_dir)
        if self.runc_root != RUNC_ROOT_BASE:
            env[RUNC_ROOT_ENV] = str(self.runc_root)
        if self.runtime_binary != "runc":
            env[RUNTIME_BINARY_ENV] = self.runtime_binary
        return env

    @property
    def fill_ledger_dir(self) -> Path | None:
        """Where restores record the memory-file chunks they verified; None: off. Not a name
        a containerd namespace can take beside the shim's per-namespace directories."""
        return self.state_dir / "snapshot-shim" / ".fill-ledger" if self.fill_ledger else None
