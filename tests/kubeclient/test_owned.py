"""kubeclient/owned.py against an API server that accepts connections and never answers (a
real listening socket that reads nothing): making the signing key or publishing the CA ends
at its one deadline, retries included, with a TimeoutError (the component's start then
fails with one line and its pod restarts) instead of holding the start forever."""

from __future__ import annotations

import time

import pytest

from kubeclient import api as kube
from kubeclient import owned
from tests.helpers import hung_api_server


@pytest.mark.parametrize("what", ["secret", "configmap"])
async def test_a_hung_api_server_ends_at_the_deadline(control_plane, tmp_path, what):
    with hung_api_server(control_plane.kubeconfig, tmp_path / "kubeconfig") as kubeconfig:
        async with await kube.api_client(str(kubeconfig)) as api:
            t0 = time.monotonic()
            with pytest.raises(TimeoutError):
                if what == "secret":
                    await owned.ensure_secret(api, "ns", "key", lambda: {"k": b"v"}, deadline_s=1.0)
                else:
                    await owned.publish_configmap(api, "ns", "ca", {"ca.crt": "x"}, deadline_s=1.0)
            assert time.monotonic() - t0 < 5
