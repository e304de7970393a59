from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from devnode.containerd import CONTAINERD2, Containerd
from devnode.cri import TOOLS_BIN
from restore_runtime.criu.runner import version_tuple


def _criu_problem() -> str | None:
    if os.geteuid() != 0:
        return "needs root (CRIU checkpoints other processes)"
    criu = shutil.which("criu")
    if not criu:
        return "criu is not installed (make setup installs CRIU >= 4.2)"
    out = subprocess.run([criu, "--version"], capture_output=True, text=True).stdout
    v = version_tuple(out.split("Version:")[-1]) if "Version:" in out else (0,)
    if v[:2] < (4, 2):
        return f"needs CRIU >= 4.2, found {out.strip()!r}"
    return None


CRIU_PROBLEM = _criu_problem()
#: markers per real component a test needs (``pytest -m "not cluster and not containerd"``);
#: each skips, saying why, where its component is missing (pytest_collection_modifyitems)
requires_criu = pytest.mark.criu
HAS_GPU = Path("/dev/nvidiactl").exists() and Path("/proc/driver/nvidia/version").exists()
requires_gpu = pytest.mark.gpu


@pytest.fixture
def netns():
    """A network namespace of the test's own, its loopback up (what runs inside reaches
    nothing else); removed afterwards."""
    name = f"snaptest-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
    yield name
    subprocess.run(["ip", "netns", "del", name], capture_output=True)


@pytest.fixture
def cleanup_pids():
    """PIDs registered here are SIGKILLed after the test, pass or fail."""
    from tests.helpers import kill

    pids: list[int] = []
    yield pids
    for p in pids:
        kill(p)


#: fixtures that start a real component, and the marker a test using one gets
_FIXTURE_MARKERS = {"control_plane": "apiserver", "containerd": "containerd"}


def pytest_collection_modifyitems(config, items):
    """Mark each test with the components its fixtures start, and skip, saying why, a test
    whose component is missing on this machine."""
    missing = {
        "criu": CRIU_PROBLEM,
        "containerd": CONTAINERD_PROBLEM,
        "gpu": None if HAS_GPU else "no NVIDIA GPU/driver on this machine",
    }
    for item in items:
        for fixture, marker in _FIXTURE_MARKERS.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)
        for marker, problem in missing.items():
            if problem and item.get_closest_marker(marker):
                item.add_marker(pytest.mark.skip(reason=problem))


def pytest_configure(config):
    # CI installs every dependency; there a missing one is a broken setup, not a skip.
    if not os.environ.get("SNAPSHOT_STRICT_DEPS"):
        return
    from devnode import apiserver, chart, cluster, docker, kind_node, project_image, userlands

    for what, problem in (
        ("CRIU", CRIU_PROBLEM),
        ("containerd (1.7, runc, the shim)", CONTAINERD_PROBLEM),
        ("host userland", userlands.missing()),
        ("kind (Docker)", docker.missing()),
        ("kind (node image)", kind_node.missing()),
        ("control-plane", apiserver.missing()),
        ("chart", chart.missing()),
        ("cluster", cluster.missing()),
        ("containerd 2.x", _containerd2_problem()),
        ("image", project_image.missing()),
    ):
        if problem:
            raise pytest.UsageError(
                f"SNAPSHOT_STRICT_DEPS is set but {what} tests cannot run: {problem}"
            )


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory):
    """etcd + kube-apiserver on loopback with the chart's CRDs installed (envtest's setup)."""
    from devnode import apiserver

    why = apiserver.missing()
    if why:  # under SNAPSHOT_STRICT_DEPS, pytest_configure has already refused to run
        pytest.skip(why)
    with apiserver.control_plane(tmp_path_factory.mktemp("kube")) as cp:
        cp.install_crds()
        yield cp


@pytest.fixture
def ns(control_plane):
    """A fresh namespace in the control plane, for one test."""
    name = f"ns-{uuid.uuid4().hex[:6]}"
    with control_plane.client() as c:
        assert c.post("/api/v1/namespaces", json={"metadata": {"name": name}}).status_code == 201
    return name


VENV_BIN = str(Path(__file__).resolve().parents[1] / ".venv" / "bin")


def _containerd_problem() -> str | None:
    if os.geteuid() != 0:
        return "needs root (runs containerd and runc)"
    for tool in ("containerd", "ctr", "runc"):
        if not shutil.which(tool):
            return f"{tool} is not installed (make setup)"
    if not Path(VENV_BIN, "containerd-shim-snapshot-v2").exists():
        return "the shim is not installed in .venv (make venv)"
    return None


CONTAINERD_PROBLEM = _containerd_problem()
requires_containerd = pytest.mark.containerd


def _containerd2_problem() -> str | None:
    if not (CONTAINERD2 / "usr/bin/containerd").exists():
        return f"containerd 2.x is not in {CONTAINERD2} (make tools: tools/install-containerd2.sh)"
    return None


CONTAINERD2_PROBLEM = _containerd2_problem()

#: a test of a node driven through the CRI (crictl against a private containerd, the shim)
CRI_NODE = [
    requires_containerd,
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.skipif(
        not (TOOLS_BIN / "crictl").exists(), reason=f"crictl not built (make tools: {TOOLS_BIN})"
    ),
]


def cluster_marks() -> list[pytest.MarkDecorator]:
    """A test of the one-node cluster (kubelet, control plane, the chart) on containerd 2."""
    from devnode import cluster

    return [
        requires_containerd,
        pytest.mark.cluster,
        pytest.mark.root,
        pytest.mark.slow,
        pytest.mark.skipif(cluster.missing() is not None, reason=cluster.missing() or ""),
        pytest.mark.skipif(CONTAINERD2_PROBLEM is not None, reason=CONTAINERD2_PROBLEM or ""),
    ]


@pytest.fixture(scope="session", params=[1, 2], ids=["containerd1.7", "containerd2"])
def containerd(request, tmp_path_factory):
    """A private containerd with our shim on its PATH, for the whole session: the system's
    1.7 and 2.x (Kubernetes after 1.35 supports only 2.x), each with its own bridge."""
    if CONTAINERD_PROBLEM:
        pytest.skip(CONTAINERD_PROBLEM)
    if request.param == 2 and CONTAINERD2_PROBLEM:
        pytest.skip(CONTAINERD2_PROBLEM)
    base = Path(f"/tmp/snapshot-cd-{uuid.uuid4().hex[:6]}")  # short: unix socket paths
    net = {1: {}, 2: {"bridge": "snapbr2", "subnet": "10.233.2.0/24"}}[request.param]
    c = Containerd(base, bin_dirs=[VENV_BIN], major=request.param, **net)
    c.start()
    yield c
    c.stop()
