"""Mount propagation, which the node agent's HostToContainer mounts need (containerd refuses
them on a private mount with a bare CreateContainerError): read from the kernel's
mountinfo, checked by devnode's cluster and by the chart's installer, and never changed on
the host by the image build. Real bind mounts on this machine."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from devnode.cluster import Cluster
from restore_runtime.mounts import mount_of, propagation_problem

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root"),
]


@contextlib.contextmanager
def bind(path: Path, propagation: str):
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
    try:
        subprocess.run(["mount", f"--make-{propagation}", str(path)], check=True)
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_propagation_is_read_from_the_kernel(tmp_path):
    with bind(tmp_path / "m", "shared") as m:
        (m / "kubelet").mkdir()
        assert mount_of(m / "kubelet") == (str(m), "shared")
        assert propagation_problem(m / "kubelet") is None
        # a bind of a shared mount made a slave: it receives the master's mounts
        copy = tmp_path / "copy"
        copy.mkdir()
        subprocess.run(["mount", "--bind", str(m), str(copy)], check=True)
        try:
            subprocess.run(["mount", "--make-slave", str(copy)], check=True)
            assert mount_of(copy / "kubelet") == (str(copy), "slave")
            assert propagation_problem(copy / "kubelet") is None
        finally:
            subprocess.run(["umount", "-l", str(copy)], check=False)
        subprocess.run(["mount", "--make-private", str(m)], check=True)
        why = propagation_problem(m / "kubelet")
        assert why is not None and f"on mount {m}," in why and "private" in why


def test_devnode_refuses_a_kubelet_root_on_a_private_mount(tmp_path):
    with bind(tmp_path / "base", "private") as base:
        c = Cluster(api=None, node=None, kubelet_root=base / "kubelet", registry=None)  # type: ignore[arg-type]
        with pytest.raises(RuntimeError, match=f"is on mount {base}, whose propagation is private"):
            c.check_mounts()
        subprocess.run(["mount", "--make-shared", str(base)], check=True)
        c.check_mounts()  # shared again: no error


def test_the_installer_names_a_private_kubelet_root_and_installs_nothing(tmp_path):
    """What the chart's init container runs: it fails at once with the mount named, where the
    agent container would otherwise hang in CreateContainerError."""
    host = tmp_path / "host"
    host.mkdir()
    with bind(tmp_path / "kubelet", "private") as kubelet:
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "agent.cli",
                "install-node",
                f"--host-root={host}",
                "--prefix=/opt/snapshot",
                "--no-signing-required",
                f"--host-to-container={kubelet}",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
    assert p.returncode != 0
    assert f"{kubelet} is on mount {kubelet}, whose propagation is private" in p.stderr
    assert list(host.iterdir()) == []  # nothing installed


def test_the_image_build_leaves_the_hosts_mounts_alone(tmp_path):
    """mmdebstrap's root mode runs ``mount --make-rprivate /`` where it starts; this turned a
    running cluster's shared kubelet root private on the first run of a fresh machine. A real
    build takes minutes and the package mirror, so a stand-in mmdebstrap does just that
    one host-visible thing (and writes the root filesystem tar it is asked for); pip is a
    stand-in too. Everything else is the real tools/build-image.sh."""
    bins = tmp_path / "bin"
    bins.mkdir()
    (bins / "mmdebstrap").write_text(
        "#!/bin/bash\nmount --make-rprivate /\n"
        'for a; do [[ $a == *.tar ]] && : > "$a"; done\nexit 0\n'
    )
    (bins / "python").write_text(
        "#!/bin/bash\n[[ $1 == -m ]] || exit 0\n"
        'while (($#)); do [[ $1 == -d ]] && mkdir -p "$2"; shift; done\n'
    )
    for f in bins.iterdir():
        f.chmod(0o755)
    cache = tmp_path / "cache"
    env = {
        **os.environ,
        "PATH": f"{bins}:{os.environ['PATH']}",
        "SNAPSHOT_PYTHON": "python",
        "SNAPSHOT_IMAGE_CACHE": str(cache),
    }
    env.pop("SNAPSHOT_IMAGE_OWN_MOUNTS", None)
    with bind(tmp_path / "kubelet", "shared") as kubelet:
        p = subprocess.run(
            ["bash", str(ROOT / "tools/build-image.sh"), "cpu-demo"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode == 0, p.stderr
        assert mount_of(kubelet) == (str(kubelet), "shared")
    assert list(cache.glob("cpu-demo-base-*.tar")), "the stand-in build did not run"
