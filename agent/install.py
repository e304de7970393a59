"""Node installation, run by the agent DaemonSet's init container with the host's root
mounted: put the node bundle on the host and register runtime handler `snapshot` with
containerd.

    snapshot-agent install-node --host-root /host [--prefix /opt/snapshot]
        [--sign-key PRIVATE.pem | --verify-key PUBLIC.pem | --no-signing-required]
        [--store /var/lib/snapshot/artifacts]

- The shim runs on the host, started by containerd, so it cannot use the image's files: the
  node bundle (agent/bundle.py) copies the interpreter, the packages, CRIU and every library
  they load, the image's loader included, to PREFIX/<version>-<build> on the host. It runs
  there on any glibc (or none) and with any CRIU (or none) of the host's.
- Before anything is registered, the bundle is run inside the host's root (host_problem):
  a node it cannot run on fails here, not at every pod's sandbox.
- A wrapper goes to HOST/usr/local/bin/containerd-shim-snapshot-v2 (containerd looks for
  `containerd-shim-<name>-v2` on its PATH). It exports the node's restore settings
  (api/node.py): the artifact store restores may read, and the public key they must be
  signed with. Only the public key reaches the host: from --sign-key, it is derived here.
  Without a key, restores are refused unless --no-signing-required (the admin's opt-out).
- containerd's config gets the runtime table, appended once. An imported drop-in would
  replace containerd 1.7's whole CRI table (see docs/kubernetes.md), so the config file
  itself is edited, after a backup. containerd must be restarted to read it; containers
  survive that.

The text edits are pure functions (tested); install() only copies and writes."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from api import runtime
from api.handshake import atomic_write
from api.node import NodeConfig
from restore_runtime.artifact import signing
from restore_runtime.criu import runner as criu_runner
from restore_runtime.errors import SnapshotError
from restore_runtime.mounts import propagation_problem

from . import bundle, prereqs

log = logging.getLogger("snapshot.install")

SHIM_NAME = "containerd-shim-snapshot-v2"
#: the node's keys, in PREFIX/keys
VERIFY_KEY, OCI_AUTH = "verify.pem", "oci-auth.json"
#: the stagings of installs (one per node at a time: the agent's init container)
STAGING_PREFIX = ".staging-"
VERSION = metadata.version("gpu-snapshot")


def runtime_table(config_version: int, handler: str = runtime.HANDLER) -> str:
    return (
        f"\n# added by snapshot-agent install-node: runtime handler {handler!r} (RuntimeClass)\n"
        + runtime.runtime_table(config_version, handler)
    )


def registered(config: dict, handler: str = runtime.HANDLER) -> bool:
    node = config
    try:
        path = runtime.runtime_path(config.get("version", 1), handler)
    except runtime.UnsupportedConfig as e:
        raise SnapshotError(str(e)) from e
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def with_runtime(config_text: str, handler: str = runtime.HANDLER) -> str | None:
    """The config with runtime `handler` registered, or None when it already is."""
    try:
        config = tomllib.loads(config_text)
    except tomllib.TOMLDecodeError as e:
        raise SnapshotError(f"containerd config does not parse: {e}") from e
    version = config.get("version", 1)
    if version == 1:
        raise SnapshotError("containerd config version 1 is not supported: migrate it to v2")
    if registered(config, handler):
        return None
    new = config_text.rstrip("\n") + "\n" + runtime_table(version, handler)
    # parsed before it is written, by TOML's rules as containerd's loader applies them: a
    # table appended under runtimes written inline (`runtimes = { runc = {...} }`) loads in
    # no containerd, which would then not start
    try:
        appended = tomllib.loads(new)
    except tomllib.TOMLDecodeError as e:
        raise SnapshotError(
            f"containerd's config cannot take the {handler!r} runtime as a table of its own "
            f"({e}); are its runtimes an inline table? Write them as tables: nothing was "
            "changed"
        ) from e
    if not registered(appended, handler):  # pragma: no cover - a table path of ours is wrong
        raise SnapshotError(f"the {handler!r} runtime did not land in containerd's config")
    return new


def wrapper(prefix: Path, node: NodeConfig) -> str:
    """The shim as containerd finds it on its PATH: the node's settings, then the current
    bundle's launcher (which names its own version from there on)."""
    settings = node.to_env()
    for k, v in settings.items():  # written between double quotes into a shell script
        if any(c in v for c in '"$`\\\n'):
            raise SnapshotError(f'{k}={v!r}: a node setting may not hold ", $, `, \\ or a newline')
    env = "".join(f'export {k}="{v}"\n' for k, v in sorted(settings.items()))
    return (
        "#!/bin/sh\n"
        "# installed by snapshot-agent install-node (the snapshot agent)\n"
        f"{env}"
        f'exec "{prefix}/{bundle.CURRENT}/bin/shim" "$@"\n'
    )


def check_host_mounts(paths: list[Path], mountinfo: str = "/proc/1/mountinfo") -> None:
    """Refuse to install when the agent's container could not start: containerd fails a
    HostToContainer mount of a path on a private mount with a bare CreateContainerError,
    after the init container has already succeeded. ``mountinfo``: the host's, as seen
    with ``hostPID``."""
    if not paths:
        return
    if not os.access(mountinfo, os.R_OK):
        log.warning("cannot read %s (no hostPID?): mount propagation not checked", mountinfo)
        return
    problems = [why for p in paths if (why := propagation_problem(p, mountinfo))]
    if problems:
        raise SnapshotError("; ".join(problems))


@dataclass
class InstallResult:
    shim: Path
    config: Path
    config_changed: bool
    bundle: Path  # the version's directory, as the host sees it


def install(
    host_root: Path,
    prefix: Path = Path("/opt/snapshot"),
    config: Path = Path("/etc/containerd/config.toml"),
    verify_key: Path | None = None,
    packages: Path | None = None,
    sign_key: Path | None = None,
    bin_dir: Path = Path("/usr/local/bin"),
    node: NodeConfig | None = None,
    check_host: bool = True,
) -> InstallResult:
    """packages: the site-packages to copy (default: this environment's). The public key
    comes from ``verify_key``, or is derived from the private ``sign_key``. ``bin_dir``: a
    directory on containerd's PATH (where /usr is read-only, /opt/bin, say). ``node``: the
    shim's settings, as the admin chose them; its key and registry credentials are copied
    onto the node (readable by root only) and the settings name those copies.
    ``check_host``: run the installed interpreter as the host would before registering it
    (``host_problem``); off only where the host root is not a whole system (tests)."""
    if why := prereqs.foreign_runtime(host_root):
        raise SnapshotError(why)
    node = node or NodeConfig()
    host_prefix = host_root / prefix.relative_to("/")
    python = f"python{sys.version_info.major}.{sys.version_info.minor}"
    name = _install_bundle(
        host_prefix, prefix, python, packages or Path(sysconfig.get_paths()["purelib"])
    )
    vdir = prefix / name
    if check_host and (found := host_checks(host_root, vdir, python)):
        if bundle.current(host_prefix) != name:
            shutil.rmtree(host_prefix / name, ignore_errors=True)
        raise SnapshotError(f"{'; '.join(found)}: the runtime is not registered")
    # the settings as the shim reads them: its copies of the key and the credentials
    node = _install_keys(host_prefix, prefix, node, verify_key, sign_key)
    bundle.switch_current(host_prefix, name)
    shim = _write_wrapper(host_root / bin_dir.relative_to("/") / SHIM_NAME, wrapper(prefix, node))
    if gone := bundle.prune(host_prefix, keep=name):
        log.info("removed unused bundles: %s", ", ".join(gone))
    host_config = host_root / config.relative_to("/")
    changed = _register_runtime(host_config)
    if changed:
        log.info("registered runtime 'snapshot' in %s; restart containerd to load it", config)
    advise_huge_pages()
    return InstallResult(shim=shim, config=host_config, config_changed=changed, bundle=vdir)


def _install_bundle(host_prefix: Path, prefix: Path, python: str, site: Path) -> str:
    """The bundle from this image under host_prefix; its directory's name. The same image
    installed again reuses its directory, which running shims may be using."""
    host_prefix.mkdir(parents=True, exist_ok=True)
    # what a killed install left: on a disk sized for one upgrade, it would fail every retry
    for dead in host_prefix.glob(f"{STAGING_PREFIX}*"):
        shutil.rmtree(dead, ignore_errors=True)
    staging = host_prefix / f"{STAGING_PREFIX}{os.getpid()}"
    try:
        bundle.stage(staging, python, site, Path(criu_runner.criu_binary()))
        name = f"{VERSION}-{bundle.build_id(staging)}"
        if (host_prefix / name / "bin" / "shim").exists():
            return name
        bundle.launchers(staging, prefix / name, python)
        shutil.rmtree(host_prefix / name, ignore_errors=True)  # a half-made one
        staging.rename(host_prefix / name)
        log.info("node bundle %s installed in %s", name, prefix)
        return name
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def host_checks(host_root: Path, vdir: Path, python: str) -> list[str]:
    """What keeps this host from running restores (empty: nothing): the bundle first, then
    the prerequisites its CRIU and runc need (agent/prereqs.py)."""
    if problem := host_problem(host_root, vdir, python):
        return [f"the node bundle does not run on this host ({problem})"]
    return prereqs.problems(host_root, vdir)


def host_problem(host_root: Path, vdir: Path, python: str) -> str | None:
    """Why the bundle in ``vdir`` cannot run on the host, or None. Its interpreter starts
    inside the host's root (chroot), through the bundle's loader as the shim will, and loads
    the C modules the shim's start needs; its CRIU prints its version. What is missing, in
    the loader's words, fails the install instead of every pod of the RuntimeClass failing at
    its sandbox's creation."""
    loader = bundle.loader_name(host_root / vdir.relative_to("/"))
    env = {**bundle.python_env(vdir), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    checks = [
        [
            *bundle.python_command(vdir, python, loader),
            "-c",
            "import asyncio, ctypes, hashlib, json, ssl, zlib",
        ],
        [*bundle.run_command(vdir, vdir / "libexec" / "criu", loader), "--version"],
    ]
    for cmd in checks:
        if host_root.resolve() != Path("/"):
            cmd = ["chroot", str(host_root), *cmd]
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as e:
            return str(e)
        if p.returncode != 0:
            lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
            return lines[-1] if lines else f"exit status {p.returncode}"
    return None


def _install_keys(
    host_prefix: Path,
    prefix: Path,
    node: NodeConfig,
    verify_key: Path | None,
    sign_key: Path | None,
) -> NodeConfig:
    """The public keys and the registry credentials, in PREFIX/keys (root only); returns the
    settings naming them. Each file is replaced by one rename, so a restore reading a key
    during a reinstall, or an install killed at any point, finds the old file or the new one,
    never none; a file no longer wanted goes last. The keys are checked to load first."""
    keys = host_prefix / "keys"
    for leftover in (".keys.new", ".keys.old"):  # the directory swap of earlier versions
        shutil.rmtree(host_prefix / leftover, ignore_errors=True)
    keys.mkdir(mode=0o700, parents=True, exist_ok=True)
    keys.chmod(0o700)
    wanted: dict[str, bytes] = {}
    if sign_key is not None:
        wanted[VERIFY_KEY] = signing.public_pem(signing.load_private_key(sign_key))
    elif verify_key is not None:
        wanted[VERIFY_KEY] = verify_key.read_bytes()
        signing.public_keys_from_pem(wanted[VERIFY_KEY], str(verify_key))
    elif node.signing_required:
        log.warning(
            "no verify key: restores on this node are refused until one is installed "
            "(or signing is turned off with --no-signing-required)"
        )
    if node.oci_auth_file is not None:
        wanted[OCI_AUTH] = node.oci_auth_file.read_bytes()
    for name, data in wanted.items():
        atomic_write(keys / name, data, mode=0o600)
    for name in {VERIFY_KEY, OCI_AUTH} - set(wanted):
        with contextlib.suppress(FileNotFoundError):
            (keys / name).unlink()
    key = prefix / "keys" / VERIFY_KEY if VERIFY_KEY in wanted else None
    auth = prefix / "keys" / OCI_AUTH if OCI_AUTH in wanted else None
    return dataclasses.replace(node, verify_key_path=key, oci_auth_file=auth)


def _write_wrapper(shim: Path, text: str) -> Path:
    shim.parent.mkdir(parents=True, exist_ok=True)
    tmp = shim.with_name(shim.name + ".new")
    tmp.write_text(text)
    tmp.chmod(0o755)
    tmp.replace(shim)
    return shim


def _register_runtime(host_config: Path) -> bool:
    """Runtime "snapshot" in containerd's config (the old one kept beside it); whether the
    config changed."""
    text = host_config.read_text() if host_config.exists() else "version = 2\n"
    new = with_runtime(text)
    if new is None:
        return False
    if host_config.exists():
        shutil.copy2(host_config, host_config.with_name(host_config.name + ".pre-snapshot"))
    host_config.parent.mkdir(parents=True, exist_ok=True)
    tmp = host_config.with_name(host_config.name + ".new")
    tmp.write_text(new)
    # before the config is replaced: an install killed after it still restarts containerd
    restart_marker(host_config).touch()
    tmp.replace(host_config)
    return True


def restart_marker(host_config: Path) -> Path:
    """Beside containerd's config while containerd has not loaded what the installer wrote:
    the next run restarts it though the config no longer changes (a failed restart, or an
    install killed after writing it)."""
    return host_config.with_name(host_config.name + ".snapshot-restart-pending")


#: the kernel's transparent huge pages mode (one per kernel: a container reads the host's)
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def advise_huge_pages(knob: Path = THP_ENABLED) -> str | None:
    """Say so when transparent huge pages are not ``always``: CRIU copies a restored
    process's memory one 4 KiB page fault at a time otherwise (it applies madvise() only
    afterwards), 1.5 s instead of 2.3 s for a 1.3 B GPU worker. The mode is the admin's
    choice for the whole node (docs/gpu-nodes.md); this only tells. Returns the mode."""
    try:
        mode = knob.read_text().split("[", 1)[1].split("]", 1)[0]
    except (OSError, IndexError):
        return None
    if mode != "always":
        log.info(
            "transparent huge pages are %r on this node: GPU restores copy memory about "
            "1.5x faster with 'always' (see docs/gpu-nodes.md)",
            mode,
        )
    return mode
