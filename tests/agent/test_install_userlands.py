"""install-node on hosts with other userlands, built here from Debian's archive with
mmdebstrap: before it registers the runtime, the installer runs the interpreter it copied
inside the host's root, with the host's loader and C library, as the shim will run. On a
Debian 11 root (glibc 2.31, as old as Ubuntu 22.04's 2.35 or RHEL 9's 2.34 for this) the
image's Python cannot start: the install fails with the loader's words, containerd's config
is left as it was and no wrapper is left, so the node is not labelled ready and no pod of
the RuntimeClass lands there (instead of every one of them failing at its sandbox). On a
Debian 13 root it installs. Nodes issue: the shim needs the host's glibc >= the image's
until the node bundle brings its own loader."""

from __future__ import annotations

import sys

import pytest

from agent import install as inst
from api.node import NodeConfig
from devnode import userlands
from restore_runtime.errors import SnapshotError
from tests.agent.test_install import V2

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.skipif(userlands.missing() is not None, reason=userlands.missing() or ""),
]


def host(tmp_path, suite: str, include: tuple[str, ...] = ()):
    try:
        root = userlands.unpack(suite, tmp_path / suite, include)
    except RuntimeError as e:  # Debian's archive out of reach on a first run: nothing built
        pytest.skip(f"cannot build the {suite} root: {e}")
    config = root / "etc/containerd/config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(V2)
    packages = tmp_path / "site"
    packages.mkdir(exist_ok=True)
    return root, config, packages


def test_an_older_glibc_than_the_images_is_refused_before_registering(tmp_path):
    root, config, packages = host(tmp_path, "bullseye")
    with pytest.raises(SnapshotError, match=r"does not run on this host \(.*GLIBC_2\.\d+"):
        inst.install(root, packages=packages, node=NodeConfig(signing_required=False))
    assert config.read_text() == V2, "not registered"
    assert not (root / "usr/local/bin" / inst.SHIM_NAME).exists()


def test_a_host_without_a_library_the_interpreter_needs_is_refused(tmp_path):
    """Debian 13's essential set has no libffi: the copied interpreter's ctypes cannot load,
    which the shim needs; refused with the missing library named."""
    root, config, packages = host(tmp_path, "trixie")
    with pytest.raises(SnapshotError, match=r"libffi\.so\.8"):
        inst.install(root, packages=packages, node=NodeConfig(signing_required=False))
    assert config.read_text() == V2


def test_a_host_as_new_as_the_image_installs(tmp_path):
    root, config, packages = host(tmp_path, "trixie", ("libffi8", "libssl3t64"))
    res = inst.install(root, packages=packages, node=NodeConfig(signing_required=False))
    assert res.config_changed and "runtime handler 'snapshot'" in config.read_text()
    python = f"python{sys.version_info.major}.{sys.version_info.minor}"
    assert inst.host_problem(root, inst.Path("/opt/snapshot"), python) is None
