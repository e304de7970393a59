"""The signer's HTTP contract: a node agent asks for the signature of one manifest, made for
one PodSnapshot; the signer holds the key, so no GPU node does (docs/security.md).

    POST /v1/sign     Authorization: Bearer <the agent's service-account token, audience
                      SIGNER_AUDIENCE, bound to its pod>; body SignRequest; answer SignResponse
    GET  /v1/key      the public key (PEM) nodes verify with
"""

from __future__ import annotations

import base64

from pydantic import BaseModel, ConfigDict, Field

#: the audience of the token an agent presents: a token made for the API server, or for any
#: other service, is refused
SIGNER_AUDIENCE = "snapshot-signer"
#: a manifest of a 100 GB artifact lists ~1,600 chunk digests (~110 KiB): room to spare,
#: and a bound on what an agent can make the signer parse
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
SIGN_PATH = "/v1/sign"
KEY_PATH = "/v1/key"


class SignRequest(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    #: the PodSnapshot the artifact is made for; the manifest must name the same three
    namespace: str
    name: str
    uid: str
    #: manifest.json's exact bytes, base64
    manifest: str = Field(max_length=(MAX_MANIFEST_BYTES * 4) // 3 + 4)

    @classmethod
    def of(cls, namespace: str, name: str, uid: str, manifest: bytes) -> SignRequest:
        return cls(
            namespace=namespace, name=name, uid=uid, manifest=base64.b64encode(manifest).decode()
        )

    def manifest_bytes(self) -> bytes:
        return base64.b64decode(self.manifest, validate=True)


class SignResponse(BaseModel):
    #: Ed25519 over the manifest's bytes, base64 (what manifest.sig holds, raw)
    signature: str

    @classmethod
    def of(cls, signature: bytes) -> SignResponse:
        return cls(signature=base64.b64encode(signature).decode())

    def signature_bytes(self) -> bytes:
        return base64.b64decode(self.signature, validate=True)
