"""A restore from an OCI registry through containerd's CRI plugin and our shim, on a node
whose cache is empty: pod A is checkpointed and its artifact pushed to Debian's
docker-registry on loopback, the node's copy removed; pod B, admitted with the oci:// URI,
comes up restored with A's state, the shim having pulled the artifact into the node's
content-addressed cache (phase ``pull`` in the report). A second pod is a cache hit."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from api.annotations import ARTIFACT
from api.handshake import RESTORE_REPORT
from devnode import oci_registry
from devnode.containerd import admitted
from restore_runtime.artifact import oci
from restore_runtime.artifact.cache import CACHE_DIR
from tests.helpers import ask
from tests.shim.test_cri_restore import PORT, checkpoint_pod_a, start_pod
from tests.shim.test_cri_restore import pytestmark as cri_marks

pytestmark = [
    *cri_marks,
    pytest.mark.skipif(oci_registry.missing() is not None, reason=oci_registry.missing() or ""),
]


def _pushed(art, registry: str) -> oci.OciRef:
    ref = oci.OciRef.parse(f"oci://{registry}/snapshots/cri:{art.path.name}")
    access = oci.RegistryAccess(plain_http=frozenset({"127.0.0.1"}))
    return oci.push(art.path, ref, access, {oci.MANIFEST_DIGEST_KEY: art.digest})


def test_restore_from_a_registry_into_an_empty_cache(cri, containerd, tmp_path):
    c, _ = cri
    art, _, before = checkpoint_pod_a(cri, containerd)
    with oci_registry.docker_registry(tmp_path / "registry") as reg:
        pushed = _pushed(art, reg.address)
        shutil.rmtree(art.path)  # the node holds no copy: the cache is empty
        cache = containerd.store / CACHE_DIR
        assert not cache.exists() or not any(cache.iterdir())
        annotations = {**admitted(art), ARTIFACT: pushed.uri}
        reports = []
        for name in ("dst", "dst-warm"):
            ctl = tmp_path / f"ctl-{name}"
            ctl.mkdir()
            pod, _, r = start_pod(cri, name, annotations=annotations, control=ctl)
            assert r.returncode == 0, r.stderr
            after = ask(c.pod_ip(pod), PORT, timeout=30)
            assert after["count"] == "4", "B continues A's in-memory state"
            assert after["digest"] == before["digest"]
            reports.append(json.loads((ctl / RESTORE_REPORT).read_text()))
    assert [r["outcome"] for r in reports] == ["restored", "restored"]
    assert "pull" in reports[0]["timings"], "the first restore pulled"
    assert "pull" not in reports[1]["timings"], "the second found it in the cache"
    assert (cache / art.digest.removeprefix("sha256:") / "manifest.json").is_file()


def test_a_registry_down_at_the_pull_falls_back_to_a_cold_start_in_bounded_time(
    cri, containerd, tmp_path
):
    """Faults round 2: a registry killed mid-pull held StartContainer for 120 s (oras' own
    retries ignored the pull deadline), past the kubelet's call: no report, no cold start.
    With the registry down once the artifact was pushed, the shim's pull now gives up within
    its retry window (20 s), inside the node's pull timeout (90 s): the container
    cold-starts, the report says why, and nothing stays in the node cache."""
    c, _ = cri
    art, _, _ = checkpoint_pod_a(cri, containerd)
    with oci_registry.docker_registry(tmp_path / "registry") as reg:
        pushed = _pushed(art, reg.address)
    shutil.rmtree(art.path)  # the node holds no copy, and the registry is gone
    cache = containerd.store / CACHE_DIR
    cached_before = set(cache.iterdir()) if cache.exists() else set()
    ctl = tmp_path / "ctl-down"
    ctl.mkdir()
    t0 = time.monotonic()
    pod, _, r = start_pod(
        cri, "down", annotations={**admitted(art), ARTIFACT: pushed.uri}, control=ctl
    )
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert took < 60, f"the start took {took:.0f}s"
    report = json.loads((ctl / RESTORE_REPORT).read_text())
    assert report["outcome"] == "fell-back", report
    assert reg.address in json.dumps(report), report
    assert ask(c.pod_ip(pod), PORT, timeout=30)["count"] == "1", "a cold start"
    left = (set(cache.iterdir()) if cache.exists() else set()) - cached_before
    assert left == set(), "nothing half-pulled stays in the node cache"
