"""`snapshot-controller`: runs the PodSnapshot and SnapshotJob reconcilers.

snapshot-controller [--kubeconfig FILE] [--interval 2] [--metrics-port 9401]"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from controller.loop import Controller
from kubeclient import api as kube

log = logging.getLogger("snapshot.controller")


async def _main(args: argparse.Namespace) -> None:
    async with await kube.api_client(args.kubeconfig) as api:
        controller = Controller(api)
        if args.metrics_port:
            controller.metrics.serve(args.metrics_port)
        log.info("reconciling every %gs", args.interval)
        await kube.resync(controller.reconcile_all, args.interval)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="snapshot-controller", description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig", help="default: $KUBECONFIG, then in-cluster config")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between passes")
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
