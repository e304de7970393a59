"""The signer signs only what the asking node's agent could have made: `snapshot-signer` as
its own process over real TLS, against a real kube-apiserver, with real service-account
tokens bound to an agent pod on node-a (TokenReview gives the signer that pod's node).

Cases: node-a's agent gets a signature for a PodSnapshot handed to node-a and being captured,
which verifies with the key the signer serves (also through the agent's client); refused: a
PodSnapshot handed to node-b (a node taken over asking for another's), one handed to node-a
whose source pod runs on node-b (what the controller's token could write), a manifest bound to
another PodSnapshot, a stale uid, a PodSnapshot already captured, a token of another service
account, a token not bound to a pod, a token made for the API server, no token; an oversized
request is refused before it is read."""

from __future__ import annotations

import base64
import hashlib

import pytest

from agent.signer_client import RemoteSigner, SignerError
from api.crd import PodSnapshot
from api.manifest import Compat, FileEntry, Manifest, Source
from api.signer import KEY_PATH, SIGN_PATH, SIGNER_AUDIENCE, SignRequest
from devnode import chart, wait_until
from devnode.webhook import signer_process
from restore_runtime.artifact import signing
from tests.controller.objects import bound_pod
from tests.helpers import hung_api_server

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(chart.missing() is not None, reason=chart.missing() or ""),
]
SYSTEM, NS = "signer-system", "signer-tenant"
AGENT, OTHER = "agent", "someone-else"
SNAPS = f"/apis/nvidia.com/v1alpha1/namespaces/{NS}/podsnapshots"
MERGE = {"Content-Type": "application/merge-patch+json"}
CHECKPOINTING = {
    "type": "Ready",
    "status": "False",
    "reason": "Checkpointing",
    "lastTransitionTime": "2026-12-05T00:00:00Z",
}
CAPTURED = {**CHECKPOINTING, "status": "True", "reason": "Captured"}


def manifest(namespace: str, name: str, uid: str) -> bytes:
    return Manifest(
        source=Source(
            pid=1, hostname="h", namespace=namespace, podSnapshot=name, podSnapshotUid=uid
        ),
        compat=Compat(arch="x86_64", kernel="6.1", criuVersion="4.2.1"),
        files=[FileEntry(path="criu/core-1.img", size=10, digest="0" * 64)],
    ).to_json()


@pytest.fixture(scope="module")
def cluster(control_plane, tmp_path_factory):
    """(admin client, {name: PodSnapshot uid}, tokens by kind, the signer, its key)."""
    tmp = tmp_path_factory.mktemp("signer")
    uids: dict[str, str] = {}
    with control_plane.client() as admin:
        for ns in (SYSTEM, NS):
            admin.post("/api/v1/namespaces", json={"metadata": {"name": ns}})
        for sa in (AGENT, OTHER):
            admin.post(
                f"/api/v1/namespaces/{SYSTEM}/serviceaccounts", json={"metadata": {"name": sa}}
            )
        pods = {
            sa: admin.post(
                f"/api/v1/namespaces/{SYSTEM}/pods", json=bound_pod(f"{sa}-a", "node-a", sa)
            ).json()
            for sa in (AGENT, OTHER)
        }
        # "stolen": handed to node-a (what the controller's token can write), but its
        # source pod runs on node-b
        cases = (
            ("mine", "node-a", CHECKPOINTING, "node-a"),
            ("theirs", "node-b", CHECKPOINTING, "node-b"),
            ("done", "node-a", CAPTURED, "node-a"),
            ("stolen", "node-a", CHECKPOINTING, "node-b"),
        )
        for name, node, ready, pod_node in cases:
            r = admin.post(f"/api/v1/namespaces/{NS}/pods", json=bound_pod(name, pod_node))
            assert r.status_code == 201, r.text
            spec = {"source": {"podRef": {"name": name}, "containers": ["main"]}}
            r = admin.post(
                SNAPS,
                json={
                    "apiVersion": "nvidia.com/v1alpha1",
                    "kind": "PodSnapshot",
                    "metadata": {"name": name},
                    "spec": spec,
                },
            )
            assert r.status_code == 201, r.text
            uids[name] = r.json()["metadata"]["uid"]
            r = admin.patch(
                f"{SNAPS}/{name}/status",
                headers=MERGE,
                json={"status": {"source": {"nodeName": node}, "conditions": [ready]}},
            )
            assert r.status_code == 200, r.text

        def token(sa: str, bound: bool = True, audience: str | None = SIGNER_AUDIENCE) -> str:
            spec: dict = {"expirationSeconds": 600}
            if audience:
                spec["audiences"] = [audience]
            if bound:
                p = pods[sa]["metadata"]
                spec["boundObjectRef"] = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": p["name"],
                    "uid": p["uid"],
                }
            r = admin.post(
                f"/api/v1/namespaces/{SYSTEM}/serviceaccounts/{sa}/token",
                json={
                    "apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenRequest",
                    "spec": spec,
                },
            )
            assert r.status_code == 201, r.text
            return r.json()["status"]["token"]

        tokens = {
            "agent": token(AGENT),
            "other": token(OTHER),
            "unbound": token(AGENT, False),
            "api-server": token(AGENT, audience=None),
            "fresh": token(AGENT),
        }
        key = tmp / "private.pem"
        signing.generate_keypair(key, tmp / "public.pem")
        with signer_process(tmp, control_plane.kubeconfig, key, f"{SYSTEM}:{AGENT}") as signer:
            yield admin, uids, tokens, signer, tmp
        for name in uids:
            admin.delete(f"{SNAPS}/{name}")
        for ns in (SYSTEM, NS):
            admin.delete(f"/api/v1/namespaces/{ns}")


def ask(signer, token: str | None, req: SignRequest):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with signer.client() as c:
        return c.post(SIGN_PATH, content=req.model_dump_json(), headers=headers)


def request(uids: dict[str, str], name: str, bound_to: tuple[str, str, str] | None = None):
    uid = uids[name]
    return SignRequest.of(NS, name, uid, manifest(*(bound_to or (NS, name, uid))))


def test_the_agent_of_the_node_gets_a_signature_that_verifies(cluster):
    _, uids, tokens, signer, _ = cluster
    req = request(uids, "mine")
    r = ask(signer, tokens["agent"], req)
    assert r.status_code == 200, r.text
    with signer.client() as c:
        pem = c.get(KEY_PATH).content
    public = signing.load_public_key(_write(cluster[4] / "served.pem", pem))
    signature = base64.b64decode(r.json()["signature"])
    assert signing.signature_valid(req.manifest_bytes(), signature, public)
    assert not signing.signature_valid(req.manifest_bytes() + b" ", signature, public)
    # the audit trail: a log line with the manifest's digest, the PodSnapshot and the node,
    # and the signature counted (isolation round 3: both were promised, neither tested)
    digest = hashlib.sha256(req.manifest_bytes()).hexdigest()
    line = f"signed manifest sha256:{digest} of PodSnapshot {NS}/mine (uid {uids['mine']})"
    wait_until(lambda: line in signer.log.read_text(), what="the signature's log line")
    assert f"{line} for node node-a" in signer.log.read_text()
    with signer.client() as c:
        metrics = c.get("/metrics").text
    signed = [
        ln
        for ln in metrics.splitlines()
        if ln.startswith('snapshot_signer_requests_total{result="signed"}')
    ]
    assert signed and float(signed[0].split()[-1]) >= 1, metrics


def test_the_agents_client_signs_through_it(cluster):
    _, uids, tokens, signer, tmp = cluster
    remote = RemoteSigner(signer.url, signer.ca, _write(tmp / "token", tokens["agent"].encode()))
    meta = {"name": "mine", "namespace": NS, "uid": uids["mine"]}
    spec = {"source": {"podRef": {"name": "mine"}}}
    snap = PodSnapshot.model_validate({"metadata": meta, "spec": spec})
    data = manifest(NS, "mine", uids["mine"])
    public = signing.load_public_key(_write(tmp / "fetched.pem", remote.public_key()))
    assert signing.signature_valid(data, remote.for_snapshot(snap)(data), public)
    with pytest.raises(SignerError, match=r"refused \(403\).*handed to node node-b"):
        remote.sign(NS, "theirs", uids["theirs"], manifest(NS, "theirs", uids["theirs"]))


@pytest.mark.parametrize(
    ("token", "name", "bound_to", "status", "why"),
    [
        ("agent", "theirs", None, 403, "handed to node node-b, not to node-a"),
        ("agent", "mine", ("other-ns", "mine", "u"), 403, "the manifest is bound to other-ns"),
        ("agent", "done", None, 403, "not being checkpointed"),
        ("agent", "stolen", None, 403, "its source pod stolen runs on node node-b, not on node-a"),
        ("other", "mine", None, 403, f"is not the node agent (system:serviceaccount:{SYSTEM}"),
        ("unbound", "mine", None, 403, "not bound to a pod on a node"),
        ("api-server", "mine", None, 401, "not valid for the signer"),
        (None, "mine", None, 401, "a bearer token is required"),
    ],
)
def test_refused(cluster, token, name, bound_to, status, why):
    _, uids, tokens, signer, _ = cluster
    r = ask(signer, tokens.get(token or ""), request(uids, name, bound_to))
    assert r.status_code == status, r.text
    assert why in r.json()["error"]


def test_a_stale_uid_is_refused(cluster):
    _, _, tokens, signer, _ = cluster
    stale = "00000000-0000-0000-0000-000000000000"
    r = ask(signer, tokens["agent"], SignRequest.of(NS, "mine", stale, manifest(NS, "mine", stale)))
    assert r.status_code == 403 and f"not {stale}" in r.json()["error"]


def test_an_oversized_request_is_refused_unread(cluster):
    _, _, tokens, signer, _ = cluster
    with signer.client() as c:
        r = c.post(
            SIGN_PATH,
            content=b"x" * (8 * 1024 * 1024),
            headers={"Authorization": f"Bearer {tokens['agent']}"},
        )
    assert r.status_code == 413


def reviews(signer) -> float:
    with signer.client() as c:
        metrics = c.get("/metrics").text
    name = "snapshot_signer_token_reviews_total"
    return float(next(ln for ln in metrics.splitlines() if ln.startswith(name)).split()[-1])


def test_token_reviews_are_screened_and_reused(cluster):
    """Isolation round 3: every request with a bearer token cost the API server a
    TokenReview. Garbage, and a real token made for another audience, are now refused without
    one; one token asked with three times is reviewed once."""
    _, uids, tokens, signer, _ = cluster
    before = reviews(signer)
    for token in ("garbage", "a.b.c", "x" * 20000, tokens["api-server"]):
        r = ask(signer, token, request(uids, "mine"))
        assert r.status_code == 401 and "not valid for the signer" in r.json()["error"]
    assert reviews(signer) == before
    for _ in range(3):
        r = ask(signer, tokens["fresh"], request(uids, "theirs"))
        assert r.status_code == 403 and "handed to node node-b" in r.json()["error"]
    assert reviews(signer) == before + 1


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def test_a_hung_api_server_gives_a_503_within_the_review_deadline(control_plane, tmp_path):
    """The signer's TokenReview against an API server that accepts and never answers (a
    real listening socket that reads nothing): the request is answered 503, retryable, at
    the review's deadline; the few review slots are not held forever."""
    import base64 as b64
    import json
    import time

    from signer.identity import REVIEW_TIMEOUT_S

    claims = {"aud": [SIGNER_AUDIENCE], "exp": int(time.time()) + 600}
    payload = b64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    token = f"eyJhbGciOiJSUzI1NiJ9.{payload}.c2ln"  # shaped right: it reaches the review
    key = tmp_path / "private.pem"
    signing.generate_keypair(key, tmp_path / "public.pem")
    hung = hung_api_server(control_plane.kubeconfig, tmp_path / "kubeconfig")
    agents = f"{SYSTEM}:{AGENT}"
    with hung as kubeconfig, signer_process(tmp_path, kubeconfig, key, agents) as signer:
        t0 = time.monotonic()
        r = ask(signer, token, SignRequest.of(NS, "x", "u", manifest(NS, "x", "u")))
        elapsed = time.monotonic() - t0
    assert r.status_code == 503 and "cannot review the token" in r.json()["error"], r.text
    assert elapsed < REVIEW_TIMEOUT_S + 5
