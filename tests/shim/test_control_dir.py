"""Where the shim writes as root (the restore report, restore-complete): only into the pod's
own emptyDir mounted at $SNAPSHOT_CONTROL_DIR (finding 12 of isolation round 2: it wrote and
unlinked in whatever mount the tenant put there, read-only ones and other pods' volumes
included). The spec is the OCI runtime spec containerd's CRI hands the shim."""

from __future__ import annotations

from pathlib import Path

from api import annotations as ann
from api.handshake import pod_empty_dir
from shim.process.restore import control_dir

KUBELET = Path("/var/lib/kubelet")


def spec(source: str, uid: str | None = "pod-a", options=("rbind", "rw"), env=()) -> dict:
    a = {ann.SANDBOX_UID: uid} if uid else {}
    return {
        "annotations": a,
        "process": {"env": list(env)},
        "mounts": [
            {"destination": "/snapshot-control", "source": source, "options": list(options)}
        ],
    }


def test_the_pods_own_empty_dir_is_used():
    own = pod_empty_dir(KUBELET, "pod-a", "snapshot-control")
    assert control_dir(spec(str(own))) == own
    other_name = pod_empty_dir(KUBELET, "pod-a", "scratch")  # any emptyDir of its own
    assert control_dir(spec(str(other_name))) == other_name


def test_another_pods_volume_a_host_path_or_a_read_only_mount_is_not():
    assert control_dir(spec(str(pod_empty_dir(KUBELET, "pod-b", "snapshot-control")))) is None
    assert control_dir(spec("/etc")) is None
    assert control_dir(spec(str(KUBELET / "pods/pod-a/volumes/kubernetes.io~secret/k"))) is None
    own = pod_empty_dir(KUBELET, "pod-a", "snapshot-control")
    assert control_dir(spec(str(own), options=("rbind", "ro"))) is None
    # the variable moves the directory, never the rule
    moved = spec("/etc", env=["SNAPSHOT_CONTROL_DIR=/elsewhere"])
    moved["mounts"][0]["destination"] = "/elsewhere"
    assert control_dir(moved) is None


def test_a_container_no_pod_made_keeps_its_mount():
    """``ctr run`` by an admin (the GPU harness): no CRI sandbox, no tenant."""
    assert control_dir(spec("/tmp/ctl", uid=None)) == Path("/tmp/ctl")
