"""What the signer refuses before asking the API server for a TokenReview: pure, from the
token's unverified claims (the review still decides for every token that passes)."""

from __future__ import annotations

import base64
import json

import pytest

from signer.identity import unreviewable

AUD, NOW = "snapshot-signer", 1_800_000_000


def jwt(claims: dict | str) -> str:
    body = claims if isinstance(claims, str) else json.dumps(claims)
    enc = base64.urlsafe_b64encode(body.encode()).decode().rstrip("=")
    return f"eyJhbGciOiJSUzI1NiJ9.{enc}.c2ln"


def test_a_token_for_the_signer_is_reviewed():
    assert unreviewable(jwt({"aud": [AUD], "exp": NOW + 60}), AUD, NOW) is None
    assert unreviewable(jwt({"aud": AUD, "exp": NOW + 60}), AUD, NOW) is None


@pytest.mark.parametrize(
    ("token", "why"),
    [
        ("garbage", "not a JWT"),
        ("a.b.c", "not a JWT"),
        (jwt("[1, 2]"), "not a JWT"),
        (jwt({"aud": ["https://kubernetes.default.svc"], "exp": NOW + 60}), "another audience"),
        (jwt({"exp": NOW + 60}), "another audience"),
        (jwt({"aud": [AUD], "exp": NOW - 1}), "expired"),
        (jwt({"aud": [AUD], "exp": "never"}), "expired"),
        (jwt({"aud": [AUD]}), "expired"),
        ("x" * 20000, "too long"),
    ],
)
def test_what_is_refused_unreviewed(token, why):
    assert why in (unreviewable(token, AUD, NOW) or "")
