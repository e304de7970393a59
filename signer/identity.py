"""Who asks: the API server's TokenReview of the bearer token, for the signer's audience. A
pod-bound service-account token names the pod's node in its extra fields (Kubernetes >= 1.30,
the chart's floor); the admission policy on agents' writes reads the same field.

Every TokenReview is a request to the API server that anyone who reaches the signer could
cause, so ``screened`` puts three things in front of it: a token that is not a JWT made for
the signer's audience and still unexpired (read, not trusted: the review decides) is refused
without one; a token's answer is kept for a few seconds; and few reviews run at once, each
within a deadline."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes_asyncio import client

from .policy import Caller

NODE_NAME = "authentication.kubernetes.io/node-name"
Authenticate = Callable[[str], Awaitable[Caller | None]]
#: how long one token's answer is reused; a deleted agent pod's token is refused this late
REVIEW_TTL_S = 10.0
CACHED_TOKENS = 1024
CONCURRENT_REVIEWS = 4
#: one review's deadline: a hung API server must not keep the few review slots forever
REVIEW_TIMEOUT_S = 5.0
MAX_TOKEN_BYTES = 16 * 1024


def token_review(api: client.ApiClient, audience: str) -> Authenticate:
    """``token -> Caller``, or None when the API server does not authenticate it for
    ``audience``; an unreachable API server raises (the agent retries its checkpoint)."""
    auth = client.AuthenticationV1Api(api)

    async def authenticate(token: str) -> Caller | None:
        review = await auth.create_token_review(
            client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token, audiences=[audience]))
        )
        st = review.status
        if st is None or not st.authenticated or audience not in (st.audiences or []):
            return None
        extra = (st.user.extra or {}) if st.user else {}
        node = next(iter(extra.get(NODE_NAME) or []), None)
        return Caller(username=st.user.username or "", node=node)

    return authenticate


def unreviewable(token: str, audience: str, now: float) -> str | None:
    """Why ``token`` is not worth a TokenReview (not a JWT, another audience, expired), or
    None. Its signature is not checked here: only the API server can."""
    if len(token) > MAX_TOKEN_BYTES:
        return "too long"
    claims = _claims(token)
    if claims is None:
        return "not a JWT"
    aud = claims.get("aud")
    if audience not in (aud if isinstance(aud, list) else [aud]):
        return "made for another audience"
    exp = claims.get("exp")
    if not isinstance(exp, int | float) or exp <= now:
        return "expired or without expiry"
    return None


def _claims(token: str) -> dict[str, Any] | None:
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, UnicodeDecodeError):
        return None
    return payload if isinstance(payload, dict) else None


def screened(
    authenticate: Authenticate, audience: str, reviewed: Callable[[], None] = lambda: None
) -> Authenticate:
    """``authenticate`` behind the screen, cache and bound above; ``reviewed`` is called for
    every TokenReview really asked for (the signer counts them)."""
    answers: OrderedDict[bytes, tuple[float, Caller | None]] = OrderedDict()
    reviews = asyncio.Semaphore(CONCURRENT_REVIEWS)

    def cached(key: bytes) -> tuple[float, Caller | None] | None:
        hit = answers.get(key)
        return hit if hit is not None and hit[0] > time.monotonic() else None

    async def check(token: str) -> Caller | None:
        if unreviewable(token, audience, time.time()) is not None:
            return None
        key = hashlib.sha256(token.encode()).digest()
        if hit := cached(key):
            return hit[1]
        async with reviews:
            if hit := cached(key):  # asked again while this one waited
                return hit[1]
            reviewed()
            async with asyncio.timeout(REVIEW_TIMEOUT_S):  # an error is not kept: asked again
                caller = await authenticate(token)
        answers[key] = (time.monotonic() + REVIEW_TTL_S, caller)
        answers.move_to_end(key)
        while len(answers) > CACHED_TOKENS:
            answers.popitem(last=False)
        return caller

    return check
