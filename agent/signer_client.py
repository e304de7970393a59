"""The agent's side of the cluster's signer (api/signer.py): a manifest goes out with the
agent's pod-bound token, its signature comes back, and the key never reaches the node."""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from pydantic import ValidationError

from api.crd import PodSnapshot
from api.signer import KEY_PATH, SIGN_PATH, SignRequest, SignResponse
from restore_runtime.artifact import signing
from restore_runtime.artifact.pack import Signer
from restore_runtime.errors import SnapshotError

#: where the chart projects the agent's token for the signer's audience
DEFAULT_TOKEN = Path("/var/run/secrets/snapshot-signer/token")


class SignerError(SnapshotError):
    """The signer refused, or could not be reached: the checkpoint fails, nothing is kept."""


@dataclass(frozen=True)
class RemoteSigner:
    url: str  # https://NAME.NAMESPACE.svc
    ca: Path  # the CA its serving certificate is checked against (no system roots)
    token: Path = DEFAULT_TOKEN  # re-read per request: the kubelet rotates it
    timeout_s: float = 30.0

    def _client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            timeout=self.timeout_s,
            verify=ssl.create_default_context(cafile=str(self.ca)),
        )

    def for_snapshot(self, snap: PodSnapshot) -> Signer:
        """The engine's signer for one checkpoint: every signature it asks for is bound to
        ``snap`` (the signer checks the manifest names the same PodSnapshot)."""
        m = snap.metadata

        def sign(manifest: bytes) -> bytes:
            return self.sign(m.namespace, m.name, m.uid or "", manifest)

        return sign

    def sign(self, namespace: str, name: str, uid: str, manifest: bytes) -> bytes:
        body = SignRequest.of(namespace, name, uid, manifest).model_dump_json()
        try:
            headers = {
                "Authorization": f"Bearer {self.token.read_text().strip()}",
                "Content-Type": "application/json",
            }
            with self._client() as c:
                r = c.post(SIGN_PATH, content=body, headers=headers)
        except (OSError, httpx.HTTPError) as e:
            raise SignerError(f"signer {self.url}: {type(e).__name__}: {e}") from e
        if r.status_code != 200:
            raise SignerError(f"signer {self.url} refused ({r.status_code}): {_error(r)}")
        try:
            return SignResponse.model_validate_json(r.content).signature_bytes()
        except (ValidationError, ValueError) as e:
            raise SignerError(f"signer {self.url}: malformed answer: {e}") from e

    def public_key(self, wait_s: float = 0.0) -> bytes:
        """The PEM public keys nodes verify with (the current one first), each checked to load
        as an Ed25519 public key; retried for ``wait_s`` (an agent's init container may start
        before the signer serves)."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                with self._client() as c:
                    r = c.get(KEY_PATH)
                r.raise_for_status()
                try:  # a ring cut short, or another kind of key, replaces no good keys
                    signing.public_keys_from_pem(r.content, f"{self.url}{KEY_PATH}")
                except signing.KeyError_ as e:
                    raise SignerError(f"signer {self.url}: {e}") from e
                return r.content
            except (OSError, httpx.HTTPError) as e:
                if time.monotonic() >= deadline:
                    raise SignerError(f"signer {self.url}: {type(e).__name__}: {e}") from e
                time.sleep(2.0)


def _error(r: httpx.Response) -> str:
    try:
        return str(r.json().get("error"))[:500]
    except ValueError:
        return r.text[:500]
