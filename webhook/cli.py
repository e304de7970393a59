"""`snapshot-webhook`: serves the mutating admission webhook over TLS.

    snapshot-webhook --port 8443 --tls-cert tls.crt --tls-key tls.key
    snapshot-webhook --port 8443 --self-signed /var/run/snapshot-webhook \\
        --service snapshot-webhook --namespace snapshot-system \\
        --patch-ca-bundle snapshot-webhook
    snapshot-webhook --tls-secret snapshot-webhook-tls --service snapshot-webhook \\
        --namespace snapshot-system --patch-ca-bundle snapshot-webhook

With --tls-secret, every replica serves the one CA and certificate kept in that Secret (made
by the first to start, never by the chart). With --patch-ca-bundle, the CA is written into
the webhook configuration, and written again within a minute whenever something else (a
GitOps sync of the chart's manifest) blanks or changes it.

It reads PodSnapshots through in-cluster config or $KUBECONFIG (or --kubeconfig)."""

from __future__ import annotations

import argparse
import asyncio
import base64
import logging
import sys
from pathlib import Path

from kubeclient import api as kube
from kubeclient import certs, owned
from webhook.app import create_app
from webhook.lookup import snapshot_lookup
from webhook.mutate import DEFAULT_RUNTIME_CLASS

log = logging.getLogger("snapshot.webhook")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="snapshot-webhook", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8443)
    p.add_argument("--tls-cert", type=Path, help="serving certificate (PEM)")
    p.add_argument("--tls-key", type=Path, help="its private key (PEM)")
    p.add_argument(
        "--self-signed",
        type=Path,
        metavar="DIR",
        help="make (or reuse) a CA and serving certificate in DIR instead of --tls-cert/--tls-key",
    )
    p.add_argument(
        "--tls-secret", metavar="NAME", help="keep the CA and serving certificate in this Secret"
    )
    p.add_argument("--service", default="snapshot-webhook", help="Service name, for the cert")
    p.add_argument("--namespace", default="snapshot-system", help="Service namespace")
    p.add_argument("--extra-san", action="append", default=[], help="more cert names or IPs")
    p.add_argument(
        "--patch-ca-bundle",
        metavar="NAME",
        help="set the caBundle of MutatingWebhookConfiguration NAME to the self-signed CA",
    )
    p.add_argument(
        "--ca-bundle-recheck",
        type=float,
        default=certs.FOLLOW_S,
        metavar="S",
        help="seconds between reads of the certificate's Secret and checks of the caBundle",
    )
    p.add_argument("--kubeconfig", help="default: $KUBECONFIG, then in-cluster config")
    p.add_argument(
        "--lookup-timeout",
        type=float,
        default=5.0,
        help="seconds to wait for the API server before answering under the pod's policy; "
        "keep it below the webhook's timeoutSeconds (default 10)",
    )
    p.add_argument("--runtime-class", default=DEFAULT_RUNTIME_CLASS)
    p.add_argument(
        "--pin-to-source-node",
        action="store_true",
        help="artifacts stay on the node that made them (a node-local store): a "
        "restore pod may run on that node only",
    )
    p.add_argument("--log-level", default="info")
    args = p.parse_args(argv)
    if not made(args) and not (args.tls_cert and args.tls_key):
        p.error("give --tls-cert and --tls-key, --self-signed DIR or --tls-secret NAME")
    if args.patch_ca_bundle and not made(args):
        p.error("--patch-ca-bundle needs --self-signed or --tls-secret")
    return args


async def patch_ca_bundle(api, name: str, ca_pem: bytes) -> bool:
    """Set every webhook's caBundle in MutatingWebhookConfiguration ``name`` to ``ca_pem``;
    False (nothing written) when they all hold it already."""
    from kubernetes_asyncio import client

    admission = client.AdmissionregistrationV1Api(api)
    async with asyncio.timeout(owned.DEADLINE_S):  # a hung API server: the next check tries
        return await _patch(admission, name, ca_pem)


async def _patch(admission, name: str, ca_pem: bytes) -> bool:
    cfg = await admission.read_mutating_webhook_configuration(name)
    bundle = base64.b64encode(ca_pem).decode()
    ops = [
        {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle}
        for i, hook in enumerate(cfg.webhooks or [])
        if hook.client_config.ca_bundle != bundle
    ]
    if not ops:
        return False
    await admission.patch_mutating_webhook_configuration(name, ops)
    log.info("set the caBundle of MutatingWebhookConfiguration %s (%d webhooks)", name, len(ops))
    return True


async def serve(args: argparse.Namespace) -> None:
    api = await kube.api_client(args.kubeconfig)
    async with api:
        tls = await certs.made_for(
            api, args.namespace, args.service, args.extra_san, args.tls_secret, args.self_signed
        )
        cert, key = (tls.cert, tls.key) if tls else (args.tls_cert, args.tls_key)
        app = create_app(
            snapshot_lookup(kube.pod_snapshots(api), args.lookup_timeout),
            args.runtime_class,
            pin_to_source=args.pin_to_source_node,
        )

        async def publish(ca_pem: bytes) -> None:  # every replica writes the same CAs
            if args.patch_ca_bundle:
                await patch_ca_bundle(api, args.patch_ca_bundle, ca_pem)

        follow, forget = certs.following(tls, publish, f"the caBundle of {args.patch_ca_bundle}")
        await certs.serve_tls(app, args.host, args.port, cert, key, args.log_level, follow,
                              args.ca_bundle_recheck, forget)  # fmt: skip


def made(args: argparse.Namespace) -> bool:
    return args.self_signed is not None or args.tls_secret is not None


def main(argv: list[str] | None = None) -> int:
    return certs.run_server(serve, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
