"""``snapshotctl``: checkpoint, restore, verify and inspect artifacts from a shell.

Exit status: 0 success, 1 the operation failed (the message says why), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from . import handshake
from .artifact.verify import load_manifest, manifest_digest, verify
from .contracts.annotations import RestoreOutcome
from .contracts.report import RestoreReport
from .errors import SnapshotError
from .executor import CheckpointRequest, RestoreRequest, checkpoint, restore
from .executor.runners import RuncContainer
from .progress import Progress, human


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="snapshotctl", description=__doc__.splitlines()[0])
    p.add_argument("-v", "--verbose", action="store_true", help="log every phase to stderr")
    sub = p.add_subparsers(dest="cmd", required=True)

    c = sub.add_parser("checkpoint", help="checkpoint a process tree into an artifact")
    src = c.add_mutually_exclusive_group(required=True)
    src.add_argument("--pid", type=int, help="root of the process tree (its PID 1)")
    src.add_argument("--container", help="a runc container id (checkpointed through runc)")
    c.add_argument(
        "--runc-root",
        type=Path,
        default=Path("/run/containerd/runc/k8s.io"),
        help="runc state root of --container (default: containerd's k8s.io)",
    )
    c.add_argument("--output", type=Path, required=True, help="artifact directory to create")
    c.add_argument("--leave-running", action="store_true", help="source continues after dump")
    c.add_argument("--sign-key", type=Path, help="Ed25519 private key (PEM) to sign with")
    c.add_argument("--control-dir", type=Path, help="run the workload handshake here first")
    c.add_argument("--handshake-timeout", type=float, default=300.0, metavar="S")
    c.add_argument("--json", action="store_true", help="print the result as JSON")

    r = sub.add_parser("restore", help="verify an artifact and restore it")
    r.add_argument("artifact", type=Path)
    r.add_argument("--pidfile", type=Path, help="write the restored root's host PID here")
    r.add_argument("--verify-key", type=Path, help="Ed25519 public key (PEM); requires a sig")
    r.add_argument("--control-dir", type=Path, help="write restore-complete here")
    r.add_argument("--netns", help="network namespace (name or path) to restore into")
    r.add_argument("--skip-compat", action="store_true", help="skip the compatibility gates")
    r.add_argument("--json", action="store_true", help="print the restore report as JSON")

    v = sub.add_parser("verify", help="check an artifact's digests and signature")
    v.add_argument("artifact", type=Path)
    v.add_argument("--verify-key", type=Path)
    v.add_argument("--json", action="store_true")

    i = sub.add_parser("inspect", help="summarise an artifact's manifest")
    i.add_argument("artifact", type=Path)
    i.add_argument("--json", action="store_true")

    k = sub.add_parser("keygen", help="create an Ed25519 key pair for signing artifacts")
    k.add_argument("--private", type=Path, required=True)
    k.add_argument("--public", type=Path, required=True)

    run = sub.add_parser(
        "run", help="start a command in its own PID+mount namespace, ready to checkpoint"
    )
    run.add_argument("--log", type=Path, required=True, help="file for its stdout/stderr")
    run.add_argument("--netns", help="network namespace (name or path) to start it in")
    run.add_argument("--control-dir", type=Path, help="exported as SNAPSHOT_CONTROL_DIR")
    run.add_argument("argv", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")

    a = sub.add_parser("agent", help="run the node agent (the chart's DaemonSet runs this)")
    a.add_argument("--node", default=os.environ.get("NODE_NAME"), help="default: $NODE_NAME")
    a.add_argument("--store", type=Path, default=Path("/var/lib/snapshot/artifacts"),
                   help="artifact store: the same path on every node that may restore")  # fmt: skip
    a.add_argument("--kubelet-root", type=Path, default=Path("/var/lib/kubelet"))
    a.add_argument("--runc-root", type=Path, default=Path("/run/containerd/runc/k8s.io"))
    a.add_argument("--handshake-timeout", type=float, default=300.0, metavar="S")
    a.add_argument("--sign-key", type=Path, help="Ed25519 private key (PEM) to sign with")
    a.add_argument("--interval", type=float, default=2.0, help="seconds between passes")
    a.add_argument("--kubeconfig", help="default: $KUBECONFIG, then in-cluster config")
    a.add_argument("--metrics-port", type=int, default=9400, help="Prometheus /metrics; 0: off")

    n = sub.add_parser("install-node", help="install the shim on a host, register it with "
                       "containerd (the agent's init container runs this)")  # fmt: skip
    n.add_argument("--host-root", type=Path, required=True, help="where the host's / is mounted")
    n.add_argument("--prefix", type=Path, default=Path("/opt/snapshot"))
    n.add_argument("--containerd-config", type=Path, default=Path("/etc/containerd/config.toml"))
    n.add_argument("--verify-key", type=Path, help="Ed25519 public key restores must match")
    n.add_argument("--restart-containerd", action="store_true",
                   help="restart containerd (systemd) if its config changed")  # fmt: skip
    return p


def _emit(args: argparse.Namespace, data: dict, text: str) -> None:
    print(json.dumps(data, indent=2, default=str) if args.json else text)


def cmd_checkpoint(args: argparse.Namespace) -> int:
    from .artifact import signing

    key = signing.load_private_key(args.sign_key) if args.sign_key else None
    res = checkpoint(
        CheckpointRequest(
            pid=args.pid or 0,
            runc_container=RuncContainer(args.runc_root, args.container)
            if args.container
            else None,
            output=args.output,
            leave_running=args.leave_running,
            sign_key=key,
            control_dir=args.control_dir,
            handshake_timeout_s=args.handshake_timeout,
        ),
        Progress(enabled=None if not args.json else False),
    )
    m = res.manifest
    _emit(
        args,
        {"artifact": str(res.path), "manifestDigest": res.digest, "sizeBytes": m.size_bytes,
         "cuda": m.uses_cuda, "timings": m.timings},
        f"checkpointed {args.container or f'PID {args.pid}'} -> {res.path} ({human(m.size_bytes)}, "
        f"{m.timings['total']:.2f}s: {_phases(m.timings)})",
    )  # fmt: skip
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    from .artifact import signing

    key = signing.load_public_key(args.verify_key) if args.verify_key else None
    try:
        report = restore(
            RestoreRequest(
                artifact=args.artifact,
                pidfile=args.pidfile,
                verify_key=key,
                control_dir=args.control_dir,
                netns=args.netns,
                skip_compat=args.skip_compat,
            ),
            Progress(enabled=None if not args.json else False),
        )
    except SnapshotError as e:
        if args.control_dir:
            failed = RestoreReport(
                outcome=RestoreOutcome.FAILED,
                artifact=str(args.artifact),
                reason=str(e),
                failedPhase=e.phase,
            )
            handshake.write_report(args.control_dir, failed)
        raise
    if args.control_dir:
        handshake.write_report(args.control_dir, report)
    _emit(
        args,
        json.loads(report.to_json()),
        f"restored {args.artifact} as PID {report.pid} in {report.timings['total']:.2f}s "
        f"({_phases(report.timings)})",
    )
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from .artifact import signing

    key = signing.load_public_key(args.verify_key) if args.verify_key else None
    _, problems = verify(args.artifact, key)
    if args.json:
        print(json.dumps({"ok": not problems, "problems": [p.__dict__ for p in problems]}))
    elif problems:
        for p in problems:
            print(p)
    else:
        print("OK")
    return 1 if problems else 0


def cmd_inspect(args: argparse.Namespace) -> int:
    m = load_manifest(args.artifact)
    if args.json:
        data = json.loads(m.to_json())
        data["manifestDigest"] = manifest_digest(args.artifact)
        data["sizeBytes"] = m.size_bytes
        print(json.dumps(data, indent=2))
        return 0
    c = m.compat
    gpus = ", ".join(f"{g.product} {g.uuid}" for g in c.gpus) or "none (CPU only)"
    print(f"artifact     {args.artifact}")
    print(f"format       {m.format}, created {m.created_at.isoformat()}")
    print(f"digest       {manifest_digest(args.artifact)}")
    print(f"source       PID {m.source.pid} on {m.source.hostname}: {' '.join(m.source.command)}")
    if m.source.pod:
        print(f"pod          {m.source.namespace}/{m.source.pod} container {m.source.container}")
    print(f"compat       {c.arch}, kernel {c.kernel}, CRIU {c.criu_version}")
    print(f"gpus         {gpus}")
    if c.driver_version:
        print(f"driver       {c.driver_version} (CUDA {c.cuda_driver_version})")
    print(f"network      pod IPs {m.network.pod_ips or '-'}")
    print(f"size         {human(m.size_bytes)} in {len(m.files)} files")
    print(f"timings      {m.timings.get('total', 0):.2f}s: {_phases(m.timings)}")
    return 0


def cmd_keygen(args: argparse.Namespace) -> int:
    from .artifact import signing

    signing.generate_keypair(args.private, args.public)
    print(f"wrote {args.private} (keep secret) and {args.public}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from . import sandbox

    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    env = {}
    if args.control_dir:
        args.control_dir.mkdir(parents=True, exist_ok=True)
        env["SNAPSHOT_CONTROL_DIR"] = str(args.control_dir.absolute())
    pid = sandbox.start(argv, args.log, netns=args.netns, env=env)
    print(pid)
    return 0


def _phases(t: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f}s" for k, v in t.items() if k not in ("total",))


def cmd_agent(args: argparse.Namespace) -> int:
    import asyncio

    from . import kube  # the control-plane libraries load only for the agent
    from .agent.run import Agent, AgentConfig

    if not args.node:
        raise SnapshotError("give --node or set NODE_NAME (the downward API's spec.nodeName)")
    cfg = AgentConfig(
        node=args.node,
        store=args.store,
        kubelet_root=args.kubelet_root,
        runc_root=args.runc_root,
        handshake_timeout_s=args.handshake_timeout,
        sign_key=args.sign_key,
    )

    async def run() -> None:
        async with await kube.api_client(args.kubeconfig) as api:
            agent = Agent(api, cfg)
            if args.metrics_port:
                agent.metrics.serve(args.metrics_port)
            logging.getLogger("snapshot.agent").info(
                "agent for node %s, artifact store %s", cfg.node, cfg.store
            )
            await kube.resync(agent.pass_once, args.interval)

    asyncio.run(run())
    return 0


def cmd_install_node(args: argparse.Namespace) -> int:
    import subprocess

    from .agent.install import install

    res = install(args.host_root, args.prefix, args.containerd_config, args.verify_key)
    print(f"shim: {res.shim}; containerd config {'updated' if res.config_changed else 'unchanged'}")
    if res.config_changed and args.restart_containerd:
        # containers keep running across a containerd restart (their shims outlive it)
        subprocess.run(["nsenter", "--target", "1", "--mount", "--", "systemctl", "restart",
                        "containerd"], check=True)  # fmt: skip
        print("containerd restarted")
    return 0


COMMANDS = {
    "checkpoint": cmd_checkpoint,
    "restore": cmd_restore,
    "verify": cmd_verify,
    "inspect": cmd_inspect,
    "keygen": cmd_keygen,
    "run": cmd_run,
    "agent": cmd_agent,
    "install-node": cmd_install_node,
}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return COMMANDS[args.cmd](args)
    except SnapshotError as e:
        print(f"snapshotctl {args.cmd}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"snapshotctl {args.cmd}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
