"""``containerd-shim-snapshot-v2 -info``: the runtime info containerd 2.x asks every shim
for (a RuntimeInfo protobuf on stdout, options on stdin), with runc's features, in the form
containerd's own runc shim gives them. Without it the ``snapshot`` handler reports no
features (recursive read-only mounts, user namespaces) to the kubelet, and pods asking for
them cannot use it. containerd 2.1 still asks only runc-type runtimes; 2.2 and later ask
every shim."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from shim.info import FEATURES_URL
from shim.proto import introspection_pb2 as pb

pytestmark = pytest.mark.skipif(shutil.which("runc") is None, reason="runc not installed")


def test_info_reports_runcs_features():
    p = subprocess.run(
        [sys.executable, "-m", "shim", "-info"], input=b"", capture_output=True, timeout=30
    )
    assert p.returncode == 0, p.stderr
    info = pb.RuntimeInfo()
    info.ParseFromString(p.stdout)
    assert info.name == "io.containerd.snapshot.v2" and info.version.version
    assert info.features.type_url == FEATURES_URL
    features = json.loads(info.features.value)
    runc = json.loads(subprocess.run(["runc", "features"], capture_output=True).stdout)
    assert features == runc
