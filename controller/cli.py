"""`snapshot-controller`: runs the PodSnapshot and SnapshotJob reconcilers.

snapshot-controller [--kubeconfig FILE] [--resync 60] [--metrics-port 9401]"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys

from controller.loop import Controller
from kubeclient import api as kube
from kubeclient.leader import LeaderElector
from kubeclient.workqueue import run_per_object

log = logging.getLogger("snapshot.controller")


async def _main(args: argparse.Namespace) -> None:
    async with await kube.api_client(args.kubeconfig) as api:
        controller = Controller(api)
        if args.metrics_port:
            controller.metrics.serve(args.metrics_port)

        async def work() -> None:
            log.info(
                "reconciling each object as it changes (watches), and all every %gs", args.resync
            )
            await run_per_object(
                controller.reconcile_key,
                controller.watched(),
                args.resync,
                sanitize=api.sanitize_for_serialization,
                on_depth=controller.metrics.queue_depth.set,
            )

        if not args.leader_elect:
            await work()
            return
        identity = os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
        # client-go's proportions: 15 s lease, renew within 10 s, retry every 2 s
        d = args.lease_duration
        elector = LeaderElector(
            api,
            args.lease_namespace,
            args.lease_name,
            identity,
            lease_duration=d,
            renew_deadline=d * 2 / 3,
            retry_period=d * 2 / 15,
            on_change=controller.metrics.leader.set,
        )
        log.info(
            "campaigning for lease %s/%s as %s", args.lease_namespace, args.lease_name, identity
        )
        await elector.run(work)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="snapshot-controller", description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig", help="default: $KUBECONFIG, then in-cluster config")
    p.add_argument(
        "--resync",
        type=float,
        default=60.0,
        help="seconds between passes when nothing changes (passes run on watch "
        "events; the resync also enforces SnapshotJob deadlines)",
    )
    p.add_argument(
        "--leader-elect",
        action="store_true",
        help="run several replicas: one reconciles, the others stand by",
    )
    p.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE", "default"))
    p.add_argument("--lease-name", default="snapshot-controller")
    p.add_argument(
        "--lease-duration",
        type=float,
        default=15.0,
        metavar="S",
        help="a stand-by takes over this long after the leader stops renewing",
    )
    p.add_argument("--metrics-port", type=int, default=9401, help="Prometheus /metrics; 0: off")
    p.add_argument("--log-level", default="info")
    args = p.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    asyncio.run(_main(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
