"""`snapshot-signer`: signs node agents' manifests with the cluster's key, over TLS.

    snapshot-signer --key /keys/private.pem --tls-cert tls.crt --tls-key tls.key \\
        --agent-service-account snapshot-system:snapshot-agent

It reviews tokens and reads PodSnapshots through in-cluster config or $KUBECONFIG."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from api.signer import SIGNER_AUDIENCE
from kubeclient import api as kube
from kubeclient import certs
from restore_runtime.artifact import signing

from .app import create_app
from .identity import token_review

log = logging.getLogger("snapshot.signer")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="snapshot-signer", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8443)
    p.add_argument("--key", type=Path, required=True, help="the Ed25519 private key (PEM)")
    p.add_argument("--tls-cert", type=Path, help="serving certificate (PEM)")
    p.add_argument("--tls-key", type=Path, help="its private key (PEM)")
    p.add_argument("--self-signed", type=Path, metavar="DIR",
                   help="make (or reuse) a CA and serving certificate in DIR instead")  # fmt: skip
    p.add_argument("--extra-san", action="append", default=[],
                   help="a name or IP the self-signed certificate covers")  # fmt: skip
    p.add_argument("--agent-service-account", required=True, metavar="NAMESPACE:NAME",
                   help="the node agents' service account: the only caller signed for")  # fmt: skip
    p.add_argument("--audience", default=SIGNER_AUDIENCE)
    p.add_argument("--kubeconfig", help="default: $KUBECONFIG, then in-cluster config")
    p.add_argument("--log-level", default="info")
    args = p.parse_args(argv)
    if args.self_signed is None and not (args.tls_cert and args.tls_key):
        p.error("give --tls-cert and --tls-key, or --self-signed DIR")
    if args.agent_service_account.count(":") != 1:
        p.error("--agent-service-account is NAMESPACE:NAME")
    return args


async def serve(args: argparse.Namespace) -> None:
    key = signing.load_private_key(args.key)
    if args.self_signed is not None:
        tls = certs.ensure(args.self_signed, args.extra_san or ["localhost"])
        cert, tls_key = tls.cert, tls.key
    else:
        cert, tls_key = args.tls_cert, args.tls_key
    api = await kube.api_client(args.kubeconfig)
    async with api:
        snapshots = kube.pod_snapshots(api)
        agent = f"system:serviceaccount:{args.agent_service_account}"
        app = create_app(key, token_review(api, args.audience), snapshots.get,
                         lambda ns, name: kube.read_pod(api, ns, name), agent,
                         args.audience)  # fmt: skip
        log.info("signing for %s (audience %s)", args.agent_service_account, args.audience)
        await certs.serve_tls(app, args.host, args.port, cert, tls_key, args.log_level)


def main(argv: list[str] | None = None) -> int:
    return certs.run_server(serve, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
