"""The signer's HTTP layer: FastAPI routes around policy.refusal. A refusal is a 4xx with its
reason (logged with who asked); a signature is logged with the manifest's digest, the
PodSnapshot and the node, so the log is an audit trail of everything the key signed."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from pydantic import ValidationError

from api.crd import PodSnapshot
from api.manifest import Manifest
from api.signer import (
    KEY_PATH,
    MAX_MANIFEST_BYTES,
    SIGN_PATH,
    SIGNER_AUDIENCE,
    SignRequest,
    SignResponse,
)
from kubeclient.metrics_server import zeroed
from restore_runtime.artifact import signing

from . import policy
from .identity import Authenticate, screened

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

log = logging.getLogger("snapshot.signer")
GetSnapshot = Callable[[str, str], Awaitable[PodSnapshot | None]]
GetPod = Callable[[str, str], Awaitable[dict[str, Any] | None]]
#: the JSON around a base64 manifest of the largest size allowed
MAX_BODY = MAX_MANIFEST_BYTES * 4 // 3 + 64 * 1024


def create_app(
    key: Ed25519PrivateKey,
    authenticate: Authenticate,
    get_snapshot: GetSnapshot,
    get_pod: GetPod,
    agent_user: str,
    audience: str = SIGNER_AUDIENCE,
    retired: bytes = b"",
) -> FastAPI:
    """``agent_user``: the node agents' service account (system:serviceaccount:NS:NAME), the
    only caller served. ``authenticate`` is asked through ``identity.screened``. ``retired``:
    public keys (PEM) served after the key's own, for what they signed before a rotation."""
    app = FastAPI(title="snapshot-signer", docs_url=None, redoc_url=None, openapi_url=None)
    registry = CollectorRegistry()
    results = ("signed", "refused", "unauthenticated", "malformed", "unavailable")
    answers = zeroed(
        Counter(
            "snapshot_signer_requests",
            f"Signature requests, by result ({', '.join(results)})",
            ["result"],
            registry=registry,
        ),
        *results,
    )
    reviews = Counter(
        "snapshot_signer_token_reviews",
        "TokenReviews asked of the API server "
        "(tokens not made for the signer, and repeats, are answered without one)",
        registry=registry,
    )
    authenticate = screened(authenticate, audience, reviews.inc)
    public_pem = signing.public_pem(key) + retired

    def answer(result: str, status: int, message: str) -> JSONResponse:
        answers.labels(result).inc()
        return JSONResponse({"error": message}, status_code=status)

    @app.get("/healthz", response_class=PlainTextResponse)
    async def healthz() -> str:
        return "ok"

    @app.get(KEY_PATH)
    async def public_key() -> Response:
        return Response(public_pem, media_type="application/x-pem-file")

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.post(SIGN_PATH)
    async def sign(request: Request) -> Response:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return answer("unauthenticated", 401, "a bearer token is required")
        length = request.headers.get("content-length", "")
        if not length.isdigit():
            return answer("malformed", 411, "a Content-Length is required")
        if int(length) > MAX_BODY:
            return answer("malformed", 413, f"the request is over {MAX_BODY} bytes")
        try:
            caller = await authenticate(token)
        except Exception as e:  # the API server: the agent fails this checkpoint, retryable
            log.warning("TokenReview failed: %s", e)
            return answer("unavailable", 503, f"cannot review the token: {type(e).__name__}")
        if caller is None:
            return answer("unauthenticated", 401, "the token is not valid for the signer")
        try:
            req = SignRequest.model_validate_json(await request.body())
            raw = req.manifest_bytes()
            manifest = Manifest.from_json(raw)
        except (ValidationError, ValueError) as e:
            return answer("malformed", 400, f"malformed request: {str(e)[:500]}")
        try:
            snap = await get_snapshot(req.namespace, req.name)
            pod = None
            if snap is not None:
                pod = await get_pod(req.namespace, snap.spec.source.pod_ref.name)
        except Exception as e:
            log.warning(
                "reading PodSnapshot %s/%s or its pod failed: %s", req.namespace, req.name, e
            )
            return answer("unavailable", 503, f"cannot read the PodSnapshot: {type(e).__name__}")
        if why := policy.refusal(caller, agent_user, req, snap, manifest, pod):
            log.warning("refused %s (node %s): %s", caller.username, caller.node, why)
            return answer("refused", 403, why)
        signature = key.sign(raw)
        answers.labels("signed").inc()
        log.info(
            "signed manifest sha256:%s of PodSnapshot %s/%s (uid %s) for node %s",
            hashlib.sha256(raw).hexdigest(),
            req.namespace,
            req.name,
            req.uid,
            caller.node,
        )
        return JSONResponse(SignResponse.of(signature).model_dump())

    return app
