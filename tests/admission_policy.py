"""The chart's ValidatingAdmissionPolicy for annotations, installed into a real kube-apiserver
for one namespace (test support for the webhook's policy tests and the node flow)."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator

from api import annotations as ann
from devnode import chart, free_port, wait_until

ADMISSION = "/apis/admissionregistration.k8s.io/v1"


@contextlib.contextmanager
def installed_policy(
    control_plane, ns: str, values: dict | None = None, suffix: str = "", webhook: bool = True
) -> Iterator:
    """The chart's policy (its binding narrowed to ``ns``, so other tests sharing the API
    server are not affected), rendered with ``values``; with ``webhook``, also its webhook
    registration, pointed at a port where nothing listens (failurePolicy Ignore: the API
    server admits without it). Yields an admin client once the policy is enforced."""
    objs = chart.render(set_values=values)
    (vap,) = [
        o
        for o in objs
        if o["kind"] == "ValidatingAdmissionPolicy"
        and o["metadata"]["name"].endswith("-annotations")
    ]
    (binding,) = [
        o
        for o in objs
        if o["kind"] == "ValidatingAdmissionPolicyBinding"
        and o["metadata"]["name"].endswith("-annotations")
    ]
    vap["metadata"]["name"] += suffix
    binding["metadata"]["name"] += suffix
    binding["spec"]["policyName"] = vap["metadata"]["name"]
    binding["spec"]["matchResources"] = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}
    }
    created = [
        (f"{ADMISSION}/validatingadmissionpolicies", vap),
        (f"{ADMISSION}/validatingadmissionpolicybindings", binding),
    ]
    if webhook:
        (mwc,) = [o for o in objs if o["kind"] == "MutatingWebhookConfiguration"]
        mwc["metadata"]["name"] = f"policy-test-webhook{suffix}"
        mwc["webhooks"][0]["clientConfig"] = {
            "url": f"https://127.0.0.1:{free_port()}/mutate",
            "caBundle": base64.b64encode(control_plane.ca.read_bytes()).decode(),
        }
        created.append((f"{ADMISSION}/mutatingwebhookconfigurations", mwc))
    with control_plane.client() as c:
        c.post("/api/v1/namespaces", json={"metadata": {"name": ns}})
        for path, obj in created:
            r = c.post(path, json=obj)
            assert r.status_code == 201, r.text
        _wait_until_enforced(c, ns)
        try:
            yield c
        finally:
            for path, obj in created:
                c.delete(f"{path}/{obj['metadata']['name']}")


def _wait_until_enforced(c, ns: str) -> None:
    """The API server loads policies asynchronously: probe with a pod it must reject (an
    artifact annotation without nvidia.com/restore-from), without creating it."""
    forged = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "policy-probe", "annotations": {ann.ARTIFACT: "file:///etc"}},
        "spec": {"containers": [{"name": "main", "image": "registry.local/probe:1"}]},
    }

    def refused() -> bool:
        r = c.post(f"/api/v1/namespaces/{ns}/pods", params={"dryRun": "All"}, json=forged)
        return r.status_code == 403

    wait_until(refused, what="the ValidatingAdmissionPolicy", poll=0.5)
