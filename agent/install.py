"""Node installation, run by the agent DaemonSet's init container with the host's root
mounted: put the shim on the host and register runtime handler `snapshot` with containerd.

    snapshot-agent install-node --host-root /host [--prefix /opt/snapshot]
        [--sign-key PRIVATE.pem | --verify-key PUBLIC.pem | --no-signing-required]
        [--store /var/lib/snapshot/artifacts]

- The shim runs on the host, started by containerd, so it cannot use the image's files: the
  Python installation this runs from (interpreter, standard library, shared library) and
  the virtualenv's packages are copied to PREFIX on the host.
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

import dataclasses
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from dataclasses import dataclass
from pathlib import Path

from api import runtime
from api.node import NodeConfig
from restore_runtime.artifact import signing
from restore_runtime.errors import SnapshotError
from restore_runtime.mounts import propagation_problem

log = logging.getLogger("snapshot.install")

SHIM_NAME = "containerd-shim-snapshot-v2"
# what the shim never imports: tests, GUI, the base installation's own packages. Compiled
# bytecode (__pycache__) is copied with the sources, whose times copy2 keeps, so it stays
# valid: without it every shim start compiles what it imports (the engine alone took 0.45 s
# on a GPU node), or, where the host's prefix is read-only, every one of them does.
STDLIB_SKIP = shutil.ignore_patterns("test", "tests", "idlelib", "tkinter", "turtledemo",
                                     "ensurepip", "site-packages")  # fmt: skip


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
    return config_text.rstrip("\n") + "\n" + runtime_table(version, handler)


def shim_command(prefix: Path, python: str) -> list[str]:
    """The copied interpreter running the shim. The packages directory is added as a site
    directory, not through PYTHONPATH, so that its .pth files (namespace and editable
    installs) count."""
    boot = (f"import runpy, site; site.addsitedir({str(prefix / 'site-packages')!r}); "
            "runpy.run_module('shim', run_name='__main__', alter_sys=True)")  # fmt: skip
    return [f"{prefix}/python/bin/{python}", "-c", boot]


def wrapper(prefix: Path, python: str, node: NodeConfig) -> str:
    settings = node.to_env()
    for k, v in settings.items():  # written between double quotes into a shell script
        if any(c in v for c in '"$`\\\n'):
            raise SnapshotError(f'{k}={v!r}: a node setting may not hold ", $, `, \\ or a newline')
    env = "".join(f'export {k}="{v}"\n' for k, v in sorted(settings.items()))
    exe, flag, boot = shim_command(prefix, python)
    return (
        "#!/bin/sh\n"
        "# installed by snapshot-agent install-node (the snapshot agent)\n"
        f'export PYTHONHOME="{prefix}/python"\n'
        f'export LD_LIBRARY_PATH="{prefix}/python/lib${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"\n'
        f"{env}"
        f'exec "{exe}" {flag} "{boot}" "$@"\n'
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
    node = node or NodeConfig()
    host_prefix = host_root / prefix.relative_to("/")
    python = f"python{sys.version_info.major}.{sys.version_info.minor}"
    staging = host_prefix.with_name(host_prefix.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    _stage_python(staging, python, packages or Path(sysconfig.get_paths()["purelib"]))
    # the settings as the shim reads them: its copies of the key and the credentials
    node = _stage_keys(staging, prefix, node, verify_key, sign_key)
    _swap_in(staging, host_prefix)
    shim = _write_wrapper(host_root / bin_dir.relative_to("/") / SHIM_NAME,
                          wrapper(prefix, python, node))  # fmt: skip
    if check_host and (problem := host_problem(host_root, prefix, python)):
        shim.unlink()  # containerd finds no shim: pods of the class fail fast, not hang
        raise SnapshotError(f"the shim's Python does not run on this host ({problem}); the "
                            "runtime is not registered")  # fmt: skip
    host_config = host_root / config.relative_to("/")
    changed = _register_runtime(host_config)
    if changed:
        log.info("registered runtime 'snapshot' in %s; restart containerd to load it", config)
    advise_huge_pages()
    return InstallResult(shim=shim, config=host_config, config_changed=changed)


def host_problem(host_root: Path, prefix: Path, python: str) -> str | None:
    """Why the installed interpreter cannot start on the host, or None: it runs inside the
    host's root (chroot), with the host's dynamic loader and C library, as the shim will, and
    loads the C modules the shim's start needs. An image's Python on an older host (Debian
    13's on Ubuntu 22.04's glibc 2.35) fails here, with the loader's words, instead of every
    pod of the RuntimeClass failing at its sandbox's creation."""
    home = prefix / "python"
    env = {"PYTHONHOME": str(home), "LD_LIBRARY_PATH": str(home / "lib"),
           "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}  # fmt: skip
    cmd = [str(home / "bin" / python), "-c", "import asyncio, ctypes, hashlib, json, ssl, zlib"]
    if host_root.resolve() != Path("/"):
        cmd = ["chroot", str(host_root), *cmd]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    if p.returncode == 0:
        return None
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit status {p.returncode}"


def _stage_python(staging: Path, python: str, site: Path) -> None:
    """The interpreter and its standard library, then this environment's packages."""
    base = Path(sys.base_prefix)
    for part in (f"bin/{python}", f"lib/{python}", "lib"):
        src = base / part
        dst = staging / "python" / part
        if part == "lib":  # only the shared libpython, if the build has one
            for so in src.glob("libpython3*.so*"):
                dst.mkdir(parents=True, exist_ok=True)
                shutil.copy2(so, dst / so.name)
        elif src.is_dir():
            shutil.copytree(src, dst, symlinks=True, ignore=STDLIB_SKIP)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    shutil.copytree(site, staging / "site-packages", symlinks=False)


def _stage_keys(staging: Path, prefix: Path, node: NodeConfig, verify_key: Path | None,
                sign_key: Path | None) -> NodeConfig:  # fmt: skip
    """The public key and the registry credentials, copied into the tree (root only);
    returns the settings naming those copies."""
    key = None
    if verify_key is not None or sign_key is not None:
        (staging / "keys").mkdir()
        dest = staging / "keys" / "verify.pem"
        if sign_key is not None:
            dest.write_bytes(signing.public_pem(signing.load_private_key(sign_key)))
        else:
            shutil.copy2(verify_key, dest)
        key = prefix / "keys" / "verify.pem"
    elif node.signing_required:
        log.warning("no verify key: restores on this node are refused until one is installed "
                    "(or signing is turned off with --no-signing-required)")  # fmt: skip
    auth = None
    if node.oci_auth_file is not None:
        (staging / "keys").mkdir(exist_ok=True)
        dest = staging / "keys" / "oci-auth.json"
        dest.write_bytes(node.oci_auth_file.read_bytes())
        dest.chmod(0o600)
        auth = prefix / "keys" / "oci-auth.json"
    return dataclasses.replace(node, verify_key_path=key, oci_auth_file=auth)


def _swap_in(staging: Path, host_prefix: Path) -> None:
    """The new tree in place whole: a shim starting meanwhile sees the old or the new one."""
    old = host_prefix.with_name(host_prefix.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if host_prefix.exists():
        host_prefix.rename(old)
    staging.rename(host_prefix)
    shutil.rmtree(old, ignore_errors=True)


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
    tmp.replace(host_config)
    return True


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
        log.info("transparent huge pages are %r on this node: GPU restores copy memory about "
                 "1.5x faster with 'always' (see docs/gpu-nodes.md)", mode)  # fmt: skip
    return mode
