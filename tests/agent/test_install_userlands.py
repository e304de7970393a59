"""The node bundle on hosts with other userlands, built here from Debian's archive with
mmdebstrap. Debian 11 (glibc 2.31) stands for Ubuntu 22.04 (2.35), RHEL 9 and AL2023 (2.34):
older than the image's C library, without CRIU, without the interpreter's libraries. The
bundle brings its own loader, libraries and CRIU, so install-node registers the runtime
there, and the shim's code then runs inside that root without mapping one file from it.

Cases: Debian 11 installs, and its shim, its imports and its CRIU run from the bundle alone
(every mapped file is the bundle's); Debian 13's bare essential set (no libffi, no OpenSSL)
installs too; a host where the bundle cannot run (no executable loader: a prefix on a
noexec mount) is refused before anything is registered, with the reason."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from agent import bundle
from agent import install as inst
from api.node import NodeConfig
from devnode import userlands
from devnode.node_site import SHIM_IMPORTS
from devnode.node_site import site_packages as shim_packages
from restore_runtime.errors import SnapshotError
from tests.agent.test_install import V2

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.skipif(userlands.missing() is not None, reason=userlands.missing() or ""),
]
CHROOT = shutil.which("chroot") or "chroot"
PYTHON = f"python{sys.version_info.major}.{sys.version_info.minor}"


def host(tmp_path, suite: str, include: tuple[str, ...] = ()):
    try:
        root = userlands.unpack(suite, tmp_path / suite, include)
    except RuntimeError as e:  # Debian's archive out of reach on a first run: nothing built
        if os.environ.get("SNAPSHOT_STRICT_DEPS"):  # CI: the docs say these hosts are checked
            pytest.fail(f"SNAPSHOT_STRICT_DEPS is set but the {suite} root was not built: {e}")
        pytest.skip(f"cannot build the {suite} root: {e}")
    config = root / "etc/containerd/config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(V2)
    return root, config


def test_debian_11_runs_the_shim_from_the_bundle_alone(tmp_path):
    root, config = host(tmp_path, "bullseye")
    assert not (root / "usr/sbin/criu").exists() and not list(root.glob("usr/lib/*/libffi.so.8"))
    res = inst.install(
        root, packages=shim_packages(tmp_path / "site"), node=NodeConfig(signing_required=False)
    )
    assert res.config_changed and "runtime handler 'snapshot'" in config.read_text()

    def chroot(*cmd: str) -> subprocess.CompletedProcess:
        # a mount namespace of its own, so that /proc can be mounted in the root and go
        # with the command
        return subprocess.run(
            ["unshare", "--mount", "--propagation", "private", CHROOT, str(root), *cmd],
            capture_output=True,
            text=True,
            timeout=120,
            env={"PATH": "/usr/bin:/bin"},
        )

    shim = chroot("/opt/snapshot/current/bin/shim", "-v")
    assert shim.returncode == 0 and "snapshot-shim" in shim.stdout, shim.stderr
    criu = chroot("/opt/snapshot/current/sbin/criu", "--version")
    assert criu.returncode == 0 and "Version: 4." in criu.stdout, criu.stderr

    # every file the shim's code maps, the loader's and the C library's included
    vdir = res.bundle
    probe = (
        "import ctypes, json\n"
        "assert ctypes.CDLL(None).mount(b'proc', b'/proc', b'proc', 0, None) == 0\n"
        f"import {', '.join(SHIM_IMPORTS)}\n"
        "maps = {f.strip() for ln in open('/proc/self/maps') for f in ln.split(None, 5)[5:]}\n"
        "print(json.dumps(sorted(m for m in maps if m.startswith('/'))))"
    )
    loader = bundle.loader_name(root / vdir.relative_to("/"))
    cmd = bundle.python_command(vdir, PYTHON, loader)
    boot = f"import site; site.addsitedir({str(vdir / 'site-packages')!r})\n"
    env = [f"{k}={v}" for k, v in bundle.python_env(vdir).items()]  # as the launcher sets it
    p = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "env",
            *env,
            CHROOT,
            str(root),
            *cmd,
            "-c",
            boot + probe,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    mapped = json.loads(p.stdout)
    assert any(m.endswith("/libc.so.6") for m in mapped), mapped
    foreign = [m for m in mapped if not m.startswith(f"{vdir}/")]
    assert not foreign, f"mapped from the host's root: {foreign}"


def test_a_bare_debian_13_installs(tmp_path):
    """Debian 13's essential set has no libffi and no OpenSSL, which the interpreter's
    ctypes and ssl load: the bundle brings them."""
    root, config = host(tmp_path, "trixie")
    site = tmp_path / "site"
    site.mkdir()
    res = inst.install(root, packages=site, node=NodeConfig(signing_required=False))
    assert res.config_changed and "runtime handler 'snapshot'" in config.read_text()
    assert inst.host_problem(root, res.bundle, PYTHON) is None


def test_a_host_the_bundle_cannot_run_on_is_refused_before_registering(tmp_path):
    root, config = host(tmp_path, "trixie")
    prefix = root / "opt/snapshot"
    prefix.mkdir(parents=True)
    site = tmp_path / "site"
    site.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "noexec", "tmpfs", str(prefix)], check=True)
    try:
        with pytest.raises(SnapshotError, match=r"does not run on this host \(.*[Pp]ermission"):
            inst.install(root, packages=site, node=NodeConfig(signing_required=False))
        assert config.read_text() == V2, "not registered"
        assert not (root / "usr/local/bin" / inst.SHIM_NAME).exists()
        assert not list(prefix.iterdir()), "the bundle that failed is gone"
    finally:
        subprocess.run(["umount", str(prefix)], check=True)
