"""`snapshot-signer`: signs node agents' manifests with the cluster's key, over TLS.

    snapshot-signer --key /keys/private.pem --tls-cert tls.crt --tls-key tls.key \\
        --agent-service-account snapshot-system:snapshot-agent
    snapshot-signer --key-secret snapshot-signing --tls-secret snapshot-signer-tls \\
        --ca-configmap snapshot-signer-ca --service snapshot-signer --namespace snapshot-system \\
        --agent-service-account snapshot-system:snapshot-agent

With --key-secret, the key lives in a Secret: made there on the first start (never by the
chart), kept after; its ``retired.pem`` (public keys, PEM one after the other) is served
beside the current key, so nodes still verify what a retired key signed. With --tls-secret,
the serving CA and certificate too, and --ca-configmap publishes the CA for the agents.

It reviews tokens and reads PodSnapshots through in-cluster config or $KUBECONFIG."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from api.signer import SIGNER_AUDIENCE
from kubeclient import api as kube
from kubeclient import certs, owned
from restore_runtime.artifact import signing

from .app import create_app
from .identity import token_review

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

log = logging.getLogger("snapshot.signer")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="snapshot-signer", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8443)
    key = p.add_mutually_exclusive_group(required=True)
    key.add_argument("--key", type=Path, help="the Ed25519 private key (PEM)")
    key.add_argument(
        "--key-secret",
        metavar="NAME",
        help="the Secret (in --namespace) that holds it as private.pem; made there when absent",
    )
    p.add_argument(
        "--retired-keys",
        type=Path,
        help="with --key: public keys (PEM) still served for verification",
    )
    p.add_argument("--tls-cert", type=Path, help="serving certificate (PEM)")
    p.add_argument("--tls-key", type=Path, help="its private key (PEM)")
    p.add_argument(
        "--self-signed",
        type=Path,
        metavar="DIR",
        help="make (or reuse) a CA and serving certificate in DIR instead",
    )
    p.add_argument(
        "--tls-secret",
        metavar="NAME",
        help="keep a CA and serving certificate for --service in this Secret "
        "(made there when absent or due for renewal)",
    )
    p.add_argument(
        "--ca-configmap", metavar="NAME", help="publish the serving CA (ca.crt) in this ConfigMap"
    )
    p.add_argument("--service", default="snapshot-signer", help="Service name, for the cert")
    p.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE", "snapshot-system"),
        help="the signer's namespace (default: $POD_NAMESPACE)",
    )
    p.add_argument(
        "--extra-san",
        action="append",
        default=[],
        help="a name or IP the self-signed certificate covers",
    )
    p.add_argument(
        "--agent-service-account",
        required=True,
        metavar="NAMESPACE:NAME",
        help="the node agents' service account: the only caller signed for",
    )
    p.add_argument("--audience", default=SIGNER_AUDIENCE)
    p.add_argument("--kubeconfig", help="default: $KUBECONFIG, then in-cluster config")
    p.add_argument("--log-level", default="info")
    args = p.parse_args(argv)
    made = args.self_signed is not None or args.tls_secret is not None
    if not made and not (args.tls_cert and args.tls_key):
        p.error("give --tls-cert and --tls-key, --self-signed DIR or --tls-secret NAME")
    if args.ca_configmap and not made:
        p.error("--ca-configmap needs --self-signed or --tls-secret")
    if args.agent_service_account.count(":") != 1:
        p.error("--agent-service-account is NAMESPACE:NAME")
    return args


async def load_key(api, args: argparse.Namespace) -> tuple[Ed25519PrivateKey, bytes]:
    """The signing key and the retired public keys (PEM) served beside its own."""
    if args.key is not None:
        retired = args.retired_keys.read_bytes() if args.retired_keys else b""
        return signing.load_private_key(args.key), retired
    new = lambda: {"private.pem": signing.new_private_pem()}  # noqa: E731
    data = await owned.ensure_secret(api, args.namespace, args.key_secret, new)
    where = f"Secret {args.namespace}/{args.key_secret}"
    if "private.pem" not in data:
        raise signing.KeyError_(f"{where} has no private.pem")
    key = signing.private_key_from_pem(data["private.pem"], where)
    retired = data.get("retired.pem", b"")
    if retired:
        signing.public_keys_from_pem(retired, f"{where} retired.pem")  # refused when unusable
    return key, retired


async def serving_cert(api, args: argparse.Namespace):
    """The certificate and key files to serve with, how to follow them (the Secret
    read again and the CAs published to the agents: their ConfigMap holds the current CA
    and the one it replaced, so an agent trusts a replica that has not followed yet), and
    what forgets the files once loaded."""
    tls = await certs.made_for(
        api, args.namespace, args.service, args.extra_san, args.tls_secret, args.self_signed
    )
    if tls is None:
        return args.tls_cert, args.tls_key, None, None

    async def publish(ca_pem: bytes) -> None:
        if args.ca_configmap:
            await owned.publish_configmap(
                api, args.namespace, args.ca_configmap, {"ca.crt": ca_pem.decode()}
            )

    await publish(tls.ca_pem)  # the agents' CA before the first request can come
    return (tls.cert, tls.key, *certs.following(tls, publish, f"ConfigMap {args.ca_configmap}"))


async def serve(args: argparse.Namespace) -> None:
    api = await kube.api_client(args.kubeconfig)
    async with api:
        key, retired = await load_key(api, args)
        cert, tls_key, follow, forget = await serving_cert(api, args)
        snapshots = kube.pod_snapshots(api)
        agent = f"system:serviceaccount:{args.agent_service_account}"
        app = create_app(
            key,
            token_review(api, args.audience),
            snapshots.get,
            lambda ns, name: kube.read_pod(api, ns, name),
            agent,
            args.audience,
            retired,
        )
        log.info("signing for %s (audience %s)", args.agent_service_account, args.audience)
        await certs.serve_tls(app, args.host, args.port, cert, tls_key, args.log_level, follow,
                              loaded=forget)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    return certs.run_server(serve, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
