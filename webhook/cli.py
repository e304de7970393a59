"""`snapshot-webhook`: serves the mutating admission webhook over TLS.

    snapshot-webhook --port 8443 --tls-cert tls.crt --tls-key tls.key
    snapshot-webhook --port 8443 --self-signed /var/run/snapshot-webhook \\
        --service snapshot-webhook --namespace snapshot-system \\
        --patch-ca-bundle snapshot-webhook

It reads PodSnapshots through in-cluster config or $KUBECONFIG (or --kubeconfig)."""

from __future__ import annotations

import argparse
import base64
import logging
import sys
from pathlib import Path

from kubeclient import api as kube
from kubeclient import certs
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
        "--self-signed", type=Path, metavar="DIR",
        help="make (or reuse) a CA and serving certificate in DIR instead of --tls-cert/--tls-key",
    )  # fmt: skip
    p.add_argument("--service", default="snapshot-webhook", help="Service name, for the cert")
    p.add_argument("--namespace", default="snapshot-system", help="Service namespace")
    p.add_argument("--extra-san", action="append", default=[], help="more cert names or IPs")
    p.add_argument(
        "--patch-ca-bundle", metavar="NAME",
        help="set the caBundle of MutatingWebhookConfiguration NAME to the self-signed CA",
    )  # fmt: skip
    p.add_argument("--kubeconfig", help="default: $KUBECONFIG, then in-cluster config")
    p.add_argument(
        "--lookup-timeout", type=float, default=5.0,
        help="seconds to wait for the API server before answering under the pod's policy; "
        "keep it below the webhook's timeoutSeconds (default 10)",
    )  # fmt: skip
    p.add_argument("--runtime-class", default=DEFAULT_RUNTIME_CLASS)
    p.add_argument("--log-level", default="info")
    args = p.parse_args(argv)
    if args.self_signed is None and not (args.tls_cert and args.tls_key):
        p.error("give --tls-cert and --tls-key, or --self-signed DIR")
    if args.patch_ca_bundle and args.self_signed is None:
        p.error("--patch-ca-bundle needs --self-signed")
    return args


async def patch_ca_bundle(api, name: str, ca_pem: bytes) -> None:
    from kubernetes_asyncio import client

    admission = client.AdmissionregistrationV1Api(api)
    cfg = await admission.read_mutating_webhook_configuration(name)
    bundle = base64.b64encode(ca_pem).decode()
    ops = [
        {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle}
        for i in range(len(cfg.webhooks or []))
    ]
    if ops:
        await admission.patch_mutating_webhook_configuration(name, ops)
    log.info("set the caBundle of MutatingWebhookConfiguration %s (%d webhooks)", name, len(ops))


async def serve(args: argparse.Namespace) -> None:
    if args.self_signed is not None:
        names = [*certs.service_names(args.service, args.namespace), *args.extra_san]
        tls = certs.ensure(args.self_signed, names)
        cert, key = tls.cert, tls.key
    else:
        cert, key = args.tls_cert, args.tls_key
    api = await kube.api_client(args.kubeconfig)
    async with api:
        if args.patch_ca_bundle:
            await patch_ca_bundle(api, args.patch_ca_bundle, tls.ca_pem)
        app = create_app(
            snapshot_lookup(kube.pod_snapshots(api), args.lookup_timeout), args.runtime_class
        )
        await certs.serve_tls(app, args.host, args.port, cert, key, args.log_level)


def main(argv: list[str] | None = None) -> int:
    return certs.run_server(serve, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
