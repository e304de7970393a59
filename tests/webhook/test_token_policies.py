"""Isolation round 4, attacks 2 and 3: two tokens whose RBAC reaches further than their
jobs, held to them by the chart's admission policies, against a real API server with the
chart's own RBAC and policies.

- The webhook's token has ``get, patch`` on its own MutatingWebhookConfiguration, for the
  caBundle: it may change the caBundle and nothing else (not add a rule for Secrets, not drop
  the namespace selector or the match conditions, not relabel it).
- The webhook's token (and the signer's) may create Secrets in the release namespace (RBAC
  cannot name what is created): it may create only its own, not the signer's certificate or
  signing key first.
- The uninstall hook's token has ``list, patch`` on nodes, to remove the ready label: it may
  remove that label and nothing else (no taint, no other label, never set ready=true)."""

from __future__ import annotations

import base64
import copy

import pytest

from devnode import chart, wait_until
from tests.helpers import client_as

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(chart.missing() is not None, reason=chart.missing() or ""),
]
SYSTEM = "snapshot-system"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
JSON_PATCH = {"Content-Type": "application/json-patch+json"}
MERGE = {"Content-Type": "application/merge-patch+json"}
WEBHOOK, HOOK = "snap-snapshot-webhook", "snap-snapshot-unlabel-nodes"
CONFIG = f"{ADMISSION}/mutatingwebhookconfigurations/{WEBHOOK}"
READY = "snapshot.nvidia.com/ready"


@pytest.fixture(scope="module")
def clients(control_plane):
    """(admin, the webhook's client, the uninstall hook's client), with the chart's RBAC,
    policies and webhook configuration created in the API server."""
    objs = {(o["kind"], o["metadata"]["name"]): o for o in chart.render()}
    config = copy.deepcopy(objs[("MutatingWebhookConfiguration", WEBHOOK)])
    # never called by other tests' pods in this API server: an object selector nothing has
    config["webhooks"][0]["objectSelector"] = {"matchLabels": {"never": "matched"}}
    policies = ("snap-snapshot-webhook-writes", "snap-snapshot-unlabel-writes",
                "snap-snapshot-webhook-creates")  # fmt: skip
    created = [
        (f"{ADMISSION}/validatingadmissionpolicies", objs[("ValidatingAdmissionPolicy", p)])
        for p in policies
    ] + [
        (f"{ADMISSION}/validatingadmissionpolicybindings",
         objs[("ValidatingAdmissionPolicyBinding", p)])
        for p in policies
    ] + [
        (f"/apis/rbac.authorization.k8s.io/v1/namespaces/{SYSTEM}/{kind.lower()}s",
         objs[(kind, "snap-snapshot-webhook-keeps")]) for kind in ("Role", "RoleBinding")
    ] + [
        (f"{RBAC}/{kind.lower()}s", objs[(kind, name)])
        for name in (WEBHOOK, HOOK) for kind in ("ClusterRole", "ClusterRoleBinding")
    ] + [(f"{ADMISSION}/mutatingwebhookconfigurations", config)]  # fmt: skip
    with control_plane.client() as admin:
        admin.post("/api/v1/namespaces", json={"metadata": {"name": SYSTEM}})
        for account in (WEBHOOK, HOOK):
            admin.post(f"/api/v1/namespaces/{SYSTEM}/serviceaccounts",
                       json={"metadata": {"name": account}})  # fmt: skip
        for path, obj in created:
            r = admin.post(path, json=obj)
            assert r.status_code in (201, 409), r.text
        for node in ("node-x", "node-y"):
            admin.post("/api/v1/nodes", json={"metadata": {"name": node}})
        webhook, hook = (client_as(control_plane, admin, SYSTEM, a) for a in (WEBHOOK, HOOK))
        # the policies take a moment to be enforced after their creation
        wait_until(lambda: add_secrets_rule(webhook).status_code == 403,
                   what="the webhook-writes policy", poll=0.5)  # fmt: skip
        wait_until(lambda: taint(hook, "node-y").status_code == 403,
                   what="the unlabel-writes policy", poll=0.5)  # fmt: skip
        yield admin, webhook, hook
        webhook.close()
        hook.close()
        for path, obj in reversed(created):
            admin.delete(f"{path}/{obj['metadata']['name']}")
        for node in ("node-x", "node-y"):
            admin.delete(f"/api/v1/nodes/{node}")
        # the chart test dry-runs the same names in this API server
        for account in (WEBHOOK, HOOK):
            admin.delete(f"/api/v1/namespaces/{SYSTEM}/serviceaccounts/{account}")


def add_secrets_rule(client):
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
            "resources": ["secrets"], "scope": "*"}  # fmt: skip
    add = [{"op": "add", "path": "/webhooks/0/rules/-", "value": rule}]
    return client.patch(CONFIG, headers=JSON_PATCH, json=add)


def taint(client, node: str):
    taints = [{"key": "evil", "value": "1", "effect": "NoExecute"}]
    return client.patch(f"/api/v1/nodes/{node}", headers=MERGE, json={"spec": {"taints": taints}})


def label(client, node: str, labels: dict):
    return client.patch(f"/api/v1/nodes/{node}", headers=MERGE,
                        json={"metadata": {"labels": labels}})  # fmt: skip


def test_the_webhook_may_write_its_ca_bundle(clients):
    _, webhook, _ = clients
    ca = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nnew\n").decode()
    r = webhook.patch(CONFIG, headers=JSON_PATCH, json=[
        {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": ca}])  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["webhooks"][0]["clientConfig"]["caBundle"] == ca


@pytest.mark.parametrize(
    "patch",
    [
        "secrets rule",
        [{"op": "remove", "path": "/webhooks/0/namespaceSelector"}],
        [{"op": "remove", "path": "/webhooks/0/matchConditions"}],
        [{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Fail"}],
        [{"op": "replace", "path": "/webhooks/0/clientConfig/service/name", "value": "other"}],
        [{"op": "add", "path": "/metadata/labels/extra", "value": "x"}],
    ],
    ids=[
        "secrets-rule",
        "namespace-selector",
        "match-conditions",
        "failure-policy",
        "service",
        "label",
    ],
)
def test_the_webhook_may_change_nothing_else(clients, patch):
    _, webhook, _ = clients
    r = add_secrets_rule(webhook) if patch == "secrets rule" else webhook.patch(
        CONFIG, headers=JSON_PATCH, json=patch)  # fmt: skip
    assert r.status_code == 403, r.text
    assert "only the caBundle" in r.text


def test_the_webhook_may_not_delete_its_configuration(clients):
    admin, webhook, _ = clients
    r = webhook.delete(CONFIG)
    assert r.status_code == 403, r.text
    assert admin.get(CONFIG).status_code == 200


def test_the_uninstall_hook_may_remove_the_ready_label(clients):
    admin, _, hook = clients
    assert label(admin, "node-x", {READY: "true", "keep": "me"}).status_code == 200
    r = label(hook, "node-x", {READY: None})
    assert r.status_code == 200, r.text
    labels = admin.get("/api/v1/nodes/node-x").json()["metadata"]["labels"]
    assert READY not in labels and labels["keep"] == "me"


@pytest.mark.parametrize(
    "change",
    ["taint", {READY: "true"}, {"nvidia.com/gpu.present": "false"}, {"keep": None}],
    ids=["taint", "ready-true", "gpu-present", "other-label-removed"],
)
def test_the_uninstall_hook_may_change_nothing_else_of_a_node(clients, change):
    admin, _, hook = clients
    assert label(admin, "node-y", {"keep": "me"}).status_code == 200
    r = taint(hook, "node-y") if change == "taint" else label(hook, "node-y", change)
    assert r.status_code == 403, r.text
    assert "may only remove the label" in r.text


def test_the_webhook_may_create_only_its_own_secret(clients):
    admin, webhook, _ = clients
    secrets = f"/api/v1/namespaces/{SYSTEM}/secrets"
    for name in ("snap-snapshot-signer-tls", "snap-snapshot-signing"):
        r = webhook.post(secrets, json={"metadata": {"name": name}, "data": {}})
        assert r.status_code == 403, r.text
        assert "may create only its own secrets" in r.text
    r = webhook.post(secrets, json={"metadata": {"name": "snap-snapshot-webhook-tls"}})
    assert r.status_code == 201, r.text
    admin.delete(f"{secrets}/snap-snapshot-webhook-tls")
