"""Who asks: the API server's TokenReview of the bearer token, for the signer's audience. A
pod-bound service-account token names the pod's node in its extra fields (Kubernetes >= 1.30,
the chart's floor); the admission policy on agents' writes reads the same field."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from kubernetes_asyncio import client

from .policy import Caller

NODE_NAME = "authentication.kubernetes.io/node-name"
Authenticate = Callable[[str], Awaitable[Caller | None]]


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
