"""CDI devices (how the GPU Operator's toolkit names GPUs for containerd): a container that
asks for one through its ``cdi.k8s.io/`` annotation gets the spec's edits (a device node and
a bind mount) from containerd, and has them too when the shim restores it from an artifact,
and when a failed restore falls back to a cold start. A harmless CDI device stands in for a
GPU's: /dev/null under another name, and a file; CI has no GPU."""

from __future__ import annotations

import json
import uuid

import pytest

from api.handshake import RESTORE_REPORT
from devnode.containerd import admitted
from tests.helpers import ask
from tests.shim.test_cri_restore import PORT, start_pod
from tests.shim.test_cri_restore import pytestmark as cri_marks

pytestmark = cri_marks
DEVICE = "snapshot.test/device=one"
CHECK = ["sh", "-c", "test -c /dev/snapshot-test && cat /snapshot-cdi/marker"]


@pytest.fixture
def cdi(containerd, tmp_path):
    marker = tmp_path / "marker"
    marker.write_text("from-cdi\n")
    spec = {
        "cdiVersion": "0.6.0",
        "kind": "snapshot.test/device",
        "devices": [
            {
                "name": "one",
                "containerEdits": {
                    "deviceNodes": [{"path": "/dev/snapshot-test", "hostPath": "/dev/null"}],
                    "mounts": [
                        {
                            "hostPath": str(marker),
                            "containerPath": "/snapshot-cdi/marker",
                            "options": ["ro", "bind"],
                        }
                    ],
                },
            }
        ],
    }
    path = containerd.base / "cdi" / f"snapshot-test-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps(spec))
    yield
    path.unlink()


def start(cri, name: str, annotations=None, control=None):
    pod, ctr, r = start_pod(
        cri,
        name,
        annotations=annotations,
        control=control,
        container_annotations={"cdi.k8s.io/test": DEVICE},
    )
    assert r.returncode == 0, r.stderr
    return pod, ctr


def sees_the_device(cri, ctr: str) -> bool:
    r = cri[0].run("exec", ctr, *CHECK, check=False)
    return r.returncode == 0 and r.stdout.strip() == "from-cdi"


@pytest.mark.parametrize("tamper", [False, True], ids=["restored", "fell-back"])
def test_cdi_devices_are_there_after_a_restore_and_after_a_fallback(
    cri, containerd, cdi, tmp_path, tamper
):
    pod_a, ctr_a = start(cri, "cdi-src")
    assert sees_the_device(cri, ctr_a), "containerd applied the CDI spec to the source"
    for _ in range(2):
        ask(cri[0].pod_ip(pod_a), PORT, timeout=30)
    art = containerd.checkpoint(ctr_a, f"cdi-{uuid.uuid4().hex[:6]}")
    if tamper:
        (art.path / "criu" / "core-1.img").write_bytes(b"tampered")
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    pod_b, ctr_b = start(cri, "cdi-dst", annotations=admitted(art), control=ctl)
    report = json.loads((ctl / RESTORE_REPORT).read_text())
    assert report["outcome"] == ("fell-back" if tamper else "restored"), report
    count = ask(cri[0].pod_ip(pod_b), PORT, timeout=30)["count"]
    assert count == ("1" if tamper else "3")
    assert sees_the_device(cri, ctr_b)
