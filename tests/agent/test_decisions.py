"""The node agent's pure decisions: which PodSnapshots are its work, the statuses it writes, and
the pod condition that reports a restore."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent import decisions as d
from api.annotations import ARTIFACT, RESTORED_CONDITION, RestoreOutcome
from api.crd import ArtifactRef, SourceInfo
from api.crd import PodSnapshotReasons as R
from api.host import HostFingerprint
from api.manifest import Compat, FileEntry, GpuInfo, Manifest, Source
from api.report import RestoreReport
from restore_runtime.artifact import oci
from restore_runtime.artifact.oci import OciRef
from tests.controller.objects import pod, snapshot

PENDING = [("Ready", "False", R.CHECKPOINT_PENDING)]


@pytest.mark.parametrize(
    "snap, node, work",
    [
        (snapshot(PENDING, node="node-a"), "node-a", True),
        (snapshot(PENDING, node="node-b"), "node-a", False),
        (snapshot(PENDING), "node-a", False),
        (snapshot(PENDING, node="node-a", deleting=True), "node-a", False),
        (snapshot([("Ready", "False", R.CHECKPOINTING)], node="node-a"), "node-a", False),
        (snapshot([("Ready", "True", R.CAPTURED)], node="node-a"), "node-a", False),
        (snapshot([*PENDING, ("Failed", "True", "X")], node="node-a"), "node-a", False),
    ],
)
def test_to_checkpoint(snap, node, work):
    assert d.to_checkpoint(snap, node) is work


def test_interrupted_and_to_delete():
    busy = snapshot([("Ready", "False", R.CHECKPOINTING)], node="node-a")
    assert d.interrupted(busy, "node-a") and not d.interrupted(busy, "node-b")
    assert d.to_delete(snapshot(node="node-a", deleting=True), "node-a")
    assert not d.to_delete(snapshot(node="node-a"), "node-a")


def test_paths():
    snap = snapshot()
    assert d.artifact_dir(Path("/store"), snap) == Path("/store/ns/snap-01234567")
    assert d.control_dir(Path("/var/lib/kubelet"), "u-1") == Path(
        "/var/lib/kubelet/pods/u-1/volumes/kubernetes.io~empty-dir/snapshot-control"
    )


def test_oci_tag_and_annotations():
    snap = snapshot()
    tag = d.oci_tag(snap)
    assert tag == "ns.snap-01234567" and OciRef.parse(f"oci://r/x:{tag}").tag == tag
    long = snapshot()
    long.metadata.name = "n" * 253
    assert len(d.oci_tag(long)) <= 128 and OciRef.parse(f"oci://r/x:{d.oci_tag(long)}")
    a = d.oci_annotations(snap, "sha256:" + "a" * 64)
    assert a[oci.MANIFEST_DIGEST_KEY] == "sha256:" + "a" * 64
    assert a[oci.KEP2008_NAMESPACE] == "ns" and a[oci.KEP2008_CONTAINER] == snap.container


HOST = HostFingerprint(
    arch="x86_64",
    kernel="6.18.4",
    criu_version="4.2.1",
    driver_version="580.1",
    cuda_driver_version=13000,
    gpus=[GpuInfo(uuid="GPU-b", product="NVIDIA H200")],
)
OCI_URI = "oci://reg:5000/snaps:ns.snap@sha256:" + "b" * 64


def captured_snap(node="node-a", uri=OCI_URI, ready=True, arch="x86_64", product="NVIDIA H200"):
    snap = snapshot([("Ready", "True" if ready else "False", R.CAPTURED)], node=node)
    snap.status.artifact = ArtifactRef(uri=uri, manifest_digest="sha256:" + "a" * 64)
    snap.status.source = SourceInfo(
        node_name=node,
        arch=arch,
        kernel_version="6.18.1",
        criu_version="4.2.0",
        driver_version="580.1",
        cuda_driver_version="13000",
        gpus=[GpuInfo(uuid="GPU-a", product=product)],
    )
    return snap


@pytest.mark.parametrize(
    "snap, pulls",
    [
        (captured_snap(), True),
        (captured_snap(node="node-b"), False),  # made here: this node has it
        (captured_snap(ready=False), False),
        (captured_snap(uri="file:///store/ns/snap"), False),  # nothing to pull
        (captured_snap(arch="aarch64"), False),  # this node could not restore it
        (captured_snap(product="NVIDIA B200"), False),
    ],
)
def test_pre_pull_only_what_this_node_could_restore(snap, pulls):
    assert d.to_pre_pull(snap, "node-b", HOST) == (OCI_URI if pulls else None)


def test_container_id_and_image_digest():
    p = pod()
    assert d.container_id(p, "main") == "abc123"
    assert d.container_id(pod(running=False), "main") is None
    assert d.container_id(p, "other") is None
    assert d.image_digest(p, "main") == "sha256:" + "e" * 64


def test_captured_status_carries_the_manifest():
    m = Manifest(
        source=Source(pid=1, hostname="h"),
        compat=Compat(
            arch="x86_64",
            kernel="6.1",
            criuVersion="4.2.1",
            driverVersion="570.1",
            cudaDriverVersion=12080,
            gpus=[{"uuid": "GPU-1", "product": "NVIDIA H200", "memoryMiB": 143771}],
        ),
        files=[FileEntry(path="criu/pages-1.img", size=3_000_000_000, digest="0" * 64)],
    )
    snap = snapshot([("Ready", "False", R.CHECKPOINTING)], node="node-a")
    st = d.captured(snap, m, "file:///store/x", "sha256:" + "1" * 64, 9.81)
    ready = next(c for c in st.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("True", R.CAPTURED)
    assert st.artifact.size_bytes == 3_000_000_000 and st.checkpoint_seconds == 9.81
    assert st.source.node_name == "node-a" and st.source.cuda_driver_version == "12080"
    assert st.source.gpus[0].product == "NVIDIA H200" and st.source.gpus[0].memory_mib == 143771
    api = st.to_api()
    assert api["artifact"]["manifestDigest"].startswith("sha256:")
    assert api["source"]["gpus"][0]["memoryMiB"] == 143771


def test_the_status_keeps_the_manifests_fingerprint_under_the_crds_names():
    """One host fingerprint (api/host.py) for the manifest, the status and the gates: what
    the status records reads back as the manifest's, and its wire names stay the CRD's."""
    src = SourceInfo.of("node-a", HOST)
    assert src.fingerprint() == HOST
    api = src.to_api()
    assert api["kernelVersion"] == "6.18.4" and api["cudaDriverVersion"] == "13000"
    assert SourceInfo(node_name="node-a").fingerprint() is None  # not captured yet
    garbled = src.model_copy(update={"cuda_driver_version": "13.0"})
    assert garbled.fingerprint().cuda_driver_version is None  # a mismatch, not a crash


def test_failed_status():
    st = d.failed(snapshot(PENDING, node="node-a"), R.CHECKPOINT_FAILED, "disk full")
    conds = {c.type: (c.status, c.reason, c.message) for c in st.conditions}
    assert conds["Failed"] == ("True", R.CHECKPOINT_FAILED, "disk full")
    assert conds["Ready"][0] == "False"


@pytest.mark.parametrize(
    "outcome, status, reason",
    [
        (RestoreOutcome.RESTORED, "True", "RestoreSucceeded"),
        (RestoreOutcome.FELL_BACK, "False", "FellBackToColdStart"),
        (RestoreOutcome.FAILED, "False", "RestoreFailed"),
    ],
)
def test_restored_condition(outcome, status, reason):
    report = RestoreReport(
        outcome=outcome,
        artifact="/a",
        reason="digest mismatch" if outcome != RestoreOutcome.RESTORED else None,
        failedPhase="verify" if outcome != RestoreOutcome.RESTORED else None,
        timings={"criu": 1.234, "cuda": 0.5},
    )
    c = d.restored_condition(report)
    assert (c.status, c.reason) == (status, reason)
    assert "criu 1.23s" in c.message and "cuda 0.50s" in c.message
    if outcome != RestoreOutcome.RESTORED:
        assert c.message.startswith("digest mismatch; phase verify")
    assert c.to_api("now")["type"] == RESTORED_CONDITION


def test_the_restored_condition_names_the_fills_bytes_and_speed():
    timings = {"fill": 1.5, "cuda": 2.0}
    report = RestoreReport(
        outcome=RestoreOutcome.RESTORED, artifact="/a", timings=timings, fillBytes=15_000_000_000
    )
    assert d.restored_condition(report).message.endswith("filled 15.00 GB at 10.0 GB/s")
    assert RestoreReport(outcome=RestoreOutcome.RESTORED, artifact="/a").fill_text is None


def test_needs_restore_report():
    p = pod()
    assert not d.needs_restore_report(p, "node-a")  # not a restore pod
    p["metadata"]["annotations"] = {ARTIFACT: "file:///a"}
    assert d.needs_restore_report(p, "node-a")
    assert not d.needs_restore_report(p, "node-b")
    p["status"]["conditions"].append({"type": RESTORED_CONDITION, "status": "True"})
    assert not d.needs_restore_report(p, "node-a")


@pytest.mark.parametrize(
    ("source", "snap", "why"),
    [
        (None, snapshot(), "source pod src no longer exists"),
        (pod(running=False), snapshot(), "container 'main' of src is not running"),
        (pod(node="node-b"), snapshot(), "runs on node 'node-b', not on 'node-a'"),
        (pod(), snapshot(uid="uid-other"), "has uid uid-1, not uid-other (recreated?)"),
    ],
)
def test_checkpoint_target_or_why_not(source, snap, why):
    """Decided before anything is done: the container to checkpoint, or the PodSnapshot's
    failure message (a pod of another node, another pod under the name, no container)."""
    assert why in d.checkpoint_target(source, snap, "node-a")


def test_the_checkpoint_target():
    t = d.checkpoint_target(pod(), snapshot(uid="uid-1"), "node-a")
    assert t == d.CheckpointTarget("abc123", "uid-1", "sha256:" + "e" * 64)


CRI = {
    "io.kubernetes.cri.container-type": "container",
    "io.kubernetes.cri.sandbox-namespace": "team-a",
    "io.kubernetes.cri.sandbox-name": "src",
    "io.kubernetes.cri.sandbox-uid": "uid-1",
    "io.kubernetes.cri.container-name": "main",
}


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        (None, None, None),
        ("io.kubernetes.cri.sandbox-uid", "uid-2", "sandbox-uid 'uid-2' (want 'uid-1')"),
        ("io.kubernetes.cri.sandbox-namespace", "team-b", "sandbox-namespace 'team-b'"),
        ("io.kubernetes.cri.sandbox-name", "victim", "sandbox-name 'victim' (want 'src')"),
        ("io.kubernetes.cri.container-name", "sidecar", "container-name 'sidecar'"),
        ("io.kubernetes.cri.container-type", "sandbox", "container-type 'sandbox'"),
    ],
)
def test_container_problem_checks_every_cri_label(key, value, why):
    """Isolation round 3, a test that checked less: the node flow only trips on a wrong
    sandbox name, so the uid, namespace and container-name checks could go unnoticed.
    Each label of the runtime's container must be the named pod's own."""
    labels = dict(CRI) if key is None else {**CRI, key: value}
    the_pod = {
        "metadata": {"namespace": "team-a", "name": "src", "uid": "uid-1"},
        "status": {"containerStatuses": [{"name": "main"}]},
    }
    got = d.container_problem(labels, the_pod, "main")
    assert got is None if why is None else why in (got or ""), got
