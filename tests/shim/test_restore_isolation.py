"""Tenant isolation at the shim, attacked through the CRI as a pod author would: every case
is a pod under handler ``snapshot`` whose annotations a tenant forged (as when the webhook is
down or bypassed). Each must cold-start under ``fallback`` (the counter starts at 1) with a
reason in the report, never restore the artifact.

Cases: an artifact of another namespace (signed by the node's key: signed-but-other-namespace);
an artifact outside the node's store (a tenant-writable copy), and a non-existent one there,
with the same reason (no existence oracle); a symlink inside the store to a copy outside; an
unsigned artifact rebuilt by the tenant; no admitted digest; capabilities raised in the CRIU
images of an artifact that is otherwise valid and signed (the privilege check alone stops it).
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest

from api.annotations import ARTIFACT, MANIFEST_DIGEST
from api.handshake import RESTORE_REPORT
from api.manifest import SIGNATURE_NAME, Manifest
from devnode.containerd import admitted
from restore_runtime.artifact import pack, signing
from tests.helpers import ask
from tests.shim.test_cri_restore import PORT, checkpoint_pod_a, start_pod
from tests.shim.test_cri_restore import pytestmark as cri_marks

pytestmark = cri_marks

ALL_CAPS = [0xFFFFFFFF, 0x1FF]  # every capability, as the attack set them


@pytest.fixture
def cri_pod(cri, tmp_path):
    """Start a restore pod with forged annotations; return its restore report and whether
    it answered as a cold start."""
    c, _ = cri

    def run(annotations: dict, user: int | None = None) -> dict:
        ctl = tmp_path / f"ctl-{uuid.uuid4().hex[:6]}"
        ctl.mkdir()
        pod, _, r = start_pod(cri, "forged", annotations=annotations, control=ctl, user=user)
        assert r.returncode == 0, r.stderr
        report = json.loads((ctl / RESTORE_REPORT).read_text())
        assert report["outcome"] == "fell-back", report
        assert ask(c.pod_ip(pod), PORT, timeout=30)["count"] == "1", "a cold start"
        return report

    return run


def copy_to(art: Path, dest: Path) -> Path:
    shutil.copytree(art, dest, symlinks=True)
    return dest


def repack(art: Path, key) -> str:
    """Rebuild the manifest's file list over the artifact's current files (as an attacker
    who changed them would), signed with ``key`` or unsigned; return the new digest."""
    m = Manifest.from_json((art / "manifest.json").read_bytes())
    m = m.model_copy(update={"files": pack.describe_files(art, m.chunk_size)})
    (art / SIGNATURE_NAME).unlink(missing_ok=True)
    return pack.write_manifest(art, m, key.sign if key else None)


def test_artifact_of_another_namespace(cri, containerd, cri_pod):
    art, _, _ = checkpoint_pod_a(cri, containerd, namespace="tenant-a")
    report = cri_pod(admitted(art))
    assert "not checkpointed in namespace 'default'" in report["reason"]


def test_artifact_outside_the_store_and_no_existence_oracle(cri, containerd, cri_pod, tmp_path):
    art, _, _ = checkpoint_pod_a(cri, containerd)
    copy = copy_to(art.path, tmp_path / "tenant-writable" / "copy")
    found = cri_pod({ARTIFACT: str(copy), MANIFEST_DIGEST: art.digest})
    missing = cri_pod({ARTIFACT: str(tmp_path / "no-such-dir"), MANIFEST_DIGEST: art.digest})
    assert "not in this node's artifact store" in found["reason"]
    assert found["reason"] == missing["reason"]


def test_symlink_in_the_store_to_outside(cri, containerd, cri_pod, tmp_path):
    art, _, _ = checkpoint_pod_a(cri, containerd)
    copy = copy_to(art.path, tmp_path / "outside")
    link = containerd.store / "default" / f"link-{uuid.uuid4().hex[:6]}"
    link.symlink_to(copy)
    report = cri_pod({ARTIFACT: str(link), MANIFEST_DIGEST: art.digest})
    assert "not in this node's artifact store" in report["reason"]


def test_unsigned_artifact(cri, containerd, cri_pod):
    art, _, _ = checkpoint_pod_a(cri, containerd)
    forged = copy_to(art.path, containerd.store / "default" / f"unsigned-{uuid.uuid4().hex[:6]}")
    digest = repack(forged, None)
    report = cri_pod({ARTIFACT: str(forged), MANIFEST_DIGEST: digest})
    assert "manifest.sig" in report["reason"] and "missing" in report["reason"]


def test_no_admitted_digest(cri, containerd, cri_pod):
    art, _, _ = checkpoint_pod_a(cri, containerd)
    report = cri_pod({ARTIFACT: str(art.path)})
    assert "no admitted manifest digest" in report["reason"]


def test_capabilities_raised_in_the_images(cri, containerd, cri_pod):
    from pycriu import images

    art, _, _ = checkpoint_pod_a(cri, containerd)
    forged = copy_to(art.path, containerd.store / "default" / f"caps-{uuid.uuid4().hex[:6]}")
    cores = sorted((forged / "criu").glob("core-*.img"))
    assert cores
    for core in cores:
        with open(core, "rb") as f:
            img = images.load(f)
        for e in img["entries"]:
            creds = e["thread_core"]["creds"]
            for s in ("cap_inh", "cap_prm", "cap_eff", "cap_bnd"):
                creds[s] = list(ALL_CAPS)
        with open(core, "wb") as f:
            images.dump(img, f)
    # signed with the node's own key: only the privilege check can stop it
    digest = repack(forged, signing.load_private_key(containerd.sign_key))
    report = cri_pod({ARTIFACT: str(forged), MANIFEST_DIGEST: digest})
    assert "exceed the container's bounding set" in report["reason"]
    assert "CAP_SYS_ADMIN" in report["reason"] and "CAP_SYS_MODULE" in report["reason"]


def test_a_root_checkpoint_into_a_non_root_pod(cri, containerd, cri_pod):
    """Attack 5 of isolation round 2: a signed checkpoint of a root container, restored into
    a pod that runs as uid 1000, came back as uid 0 with containerd's 14 capabilities (the
    spec lists CAP_SETUID/SETGID for every uid, which counted as a grant). A cold start of
    that pod runs as 1000 with none, and so must the fallback."""
    art, _, _ = checkpoint_pod_a(cri, containerd)
    report = cri_pod(admitted(art), user=1000)
    assert "uids [0, 0, 0, 0], the container runs as 1000" in report["reason"], report
