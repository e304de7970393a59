"""``snapshotctl``: checkpoint, restore, verify and inspect artifacts from a shell.

Exit status: 0 success, 1 the operation failed (the message says why), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from api.annotations import RestoreOutcome
from api.handshake import DEFAULT_HANDSHAKE_TIMEOUT_S
from api.node import NodeConfig
from api.paths import DEFAULT_RUNC_ROOT
from api.quiesce import Engine, Quiesce
from api.report import RestoreReport

from . import control_files
from .artifact.verify import load_manifest, manifest_digest, verify
from .errors import SnapshotError
from .executor.checkpoint import CheckpointRequest, checkpoint
from .executor.restore import RestoreRequest, restore
from .executor.tree_access import RuncContainer
from .progress import Progress, human
from .timing import phases_text


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="snapshotctl", description=__doc__.splitlines()[0])
    p.add_argument("-v", "--verbose", action="store_true", help="log every phase to stderr")
    p.add_argument("--version", action="version", version=f"snapshotctl {_version()}")
    sub = p.add_subparsers(dest="cmd", required=True)

    c = sub.add_parser("checkpoint", help="checkpoint a process tree into an artifact")
    src = c.add_mutually_exclusive_group(required=True)
    src.add_argument("--pid", type=int, help="root of the process tree (its PID 1)")
    src.add_argument("--container", help="a runc container id (checkpointed through runc)")
    c.add_argument(
        "--runc-root",
        type=Path,
        default=DEFAULT_RUNC_ROOT,
        help="runc state root of --container (default: containerd's k8s.io)",
    )
    c.add_argument("--output", type=Path, required=True, help="artifact directory to create")
    c.add_argument("--leave-running", action="store_true", help="source continues after dump")
    c.add_argument("--sign-key", type=Path, help="Ed25519 private key (PEM) to sign with")
    c.add_argument("--control-dir", type=Path, help="run the workload handshake here first")
    c.add_argument(
        "--handshake-timeout", type=float, default=DEFAULT_HANDSHAKE_TIMEOUT_S, metavar="S"
    )
    c.add_argument(
        "--quiesce",
        choices=[e.value for e in Engine],
        default=None,
        help="quiesce through this engine's own HTTP API on the source's loopback "
        "(vllm, sglang, tensorrt-llm), not at all (none), or the handshake "
        "(with --control-dir); a restore wakes it the same way",
    )
    c.add_argument("--quiesce-port", type=int, help="the engine's port (default: its own)")
    c.add_argument(
        "--namespace",
        help="the source pod's namespace: only pods of that "
        "namespace may restore the artifact through the shim",
    )
    c.add_argument("--pod-snapshot", help="the PodSnapshot it is made for (recorded)")
    c.add_argument(
        "--keep-zero-pages",
        action="store_true",
        help="keep the zero pages CRIU dumped (left out by default: they restore as zero anyway)",
    )
    c.add_argument(
        "--no-split-memory",
        action="store_true",
        help="leave all memory in CRIU's page images (by default large private "
        "anonymous memory goes to the artifact's memory file, restored by many "
        "threads)",
    )
    c.add_argument("--json", action="store_true", help="print the result as JSON")

    r = sub.add_parser("restore", help="verify an artifact and restore it", allow_abbrev=False)
    r.add_argument("artifact", type=Path)
    r.add_argument("--pidfile", type=Path, help="write the restored root's host PID here")
    r.add_argument("--verify-key", type=Path, help="Ed25519 public key (PEM); requires a sig")
    r.add_argument("--control-dir", type=Path, help="write restore-complete here")
    r.add_argument("--netns", help="network namespace (name or path) to restore into")
    r.add_argument("--skip-compat", action="store_true", help="skip the compatibility gates")
    r.add_argument("--json", action="store_true", help="print the restore report as JSON")
    r.add_argument(
        "--fill-threads",
        type=int,
        metavar="N",
        help="threads filling the memory file (default: min(CPUs, 16))",
    )
    # one name per setting: snapshot-agent's --fill-ledger is the on/off switch, this the place
    r.add_argument(
        "--fill-ledger-dir",
        type=Path,
        metavar="DIR",
        default=NodeConfig.from_env().fill_ledger_dir,
        help="root-only directory of the memory-file chunks this node verified, "
        "as the shim uses it (default: the shim's)",
    )

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
    k.add_argument("--force", action="store_true", help="replace existing key files")

    rec = sub.add_parser(
        "recover",
        help="give back the sources of checkpoints that died "
        "(killed or crashed) in a directory, and remove what they left",
    )
    rec.add_argument("directory", type=Path, help="where their --output was (or an agent's store)")
    rec.add_argument("--json", action="store_true", help="print what was done as JSON")

    run = sub.add_parser(
        "run", help="start a command in its own PID+mount namespace, ready to checkpoint"
    )
    run.add_argument("--log", type=Path, required=True, help="file for its stdout/stderr")
    run.add_argument("--netns", help="network namespace (name or path) to start it in")
    run.add_argument("--control-dir", type=Path, help="exported as SNAPSHOT_CONTROL_DIR")
    run.add_argument("argv", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")

    return p


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpu-snapshot")
    except PackageNotFoundError:  # run from a checkout without the package installed
        return "unknown"


def _emit(args: argparse.Namespace, data: dict, text: str) -> None:
    print(json.dumps(data, indent=2, default=str) if args.json else text)


def cmd_checkpoint(args: argparse.Namespace) -> int:
    from .artifact import signing

    signer = signing.local_signer(args.sign_key) if args.sign_key else None
    res = checkpoint(
        CheckpointRequest(
            pid=args.pid or 0,
            runc_container=RuncContainer(args.runc_root, args.container)
            if args.container
            else None,
            output=args.output,
            leave_running=args.leave_running,
            signer=signer,
            control_dir=args.control_dir,
            handshake_timeout_s=args.handshake_timeout,
            quiesce=Quiesce(
                engine=args.quiesce,
                port=args.quiesce_port,
                timeoutSeconds=int(args.handshake_timeout),
            )
            if args.quiesce
            else None,
            namespace=args.namespace,
            pod_snapshot=args.pod_snapshot,
            keep_zero_pages=args.keep_zero_pages,
            split_memory=not args.no_split_memory,
        ),
        Progress(enabled=None if not args.json else False),
    )
    m = res.manifest
    _emit(
        args,
        {
            "artifact": str(res.path),
            "manifestDigest": res.digest,
            "sizeBytes": m.size_bytes,
            "cuda": m.uses_cuda,
            "timings": m.timings,
        },
        f"checkpointed {args.container or f'PID {args.pid}'} -> {res.path} ({human(m.size_bytes)}, "
        f"{m.timings['total']:.2f}s: {phases_text(m.timings)})",
    )
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    from .node import NodeContext

    node = NodeContext.standalone(args.verify_key, args.fill_threads, args.fill_ledger_dir)
    try:
        report = restore(
            RestoreRequest(
                artifact=args.artifact,
                node=node,
                pidfile=args.pidfile,
                control_dir=args.control_dir,
                netns=args.netns,
                skip_compat=args.skip_compat,
            ),
            None,
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
            control_files.write_report(args.control_dir, failed)
        raise
    if args.control_dir:
        control_files.write_report(args.control_dir, report)
    _emit(
        args,
        json.loads(report.to_json()),
        f"restored {args.artifact} as PID {report.pid} in {report.timings['total']:.2f}s "
        f"({phases_text(report.timings)})",
    )
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from .artifact import signing

    key = signing.load_public_key(args.verify_key) if args.verify_key else None
    _, problems = verify(_artifact_dir(args.artifact), key)
    if args.json:
        print(json.dumps({"ok": not problems, "problems": [p.__dict__ for p in problems]}))
    elif problems:
        for p in problems:
            print(p)
    else:
        print("OK")
    return 1 if problems else 0


def _artifact_dir(path: Path) -> Path:
    if str(path).startswith("oci:"):
        raise SnapshotError(
            f"{path}: an oci:// artifact is not read here; give the artifact "
            "directory (a node's cache holds pulled ones)"
        )
    if not path.is_dir():
        raise SnapshotError(f"{path}: not an artifact directory")
    return path


def cmd_inspect(args: argparse.Namespace) -> int:
    m = load_manifest(_artifact_dir(args.artifact))
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
    print(f"timings      {m.timings.get('total', 0):.2f}s: {phases_text(m.timings)}")
    return 0


def cmd_keygen(args: argparse.Namespace) -> int:
    from .artifact import signing

    signing.generate_keypair(args.private, args.public, overwrite=args.force)
    print(f"wrote {args.private} (keep secret) and {args.public}")
    return 0


def cmd_recover(args: argparse.Namespace) -> int:
    from .executor.recovery import recover_interrupted

    if not args.directory.is_dir():
        raise SnapshotError(f"{args.directory}: not a directory")
    done = recover_interrupted(args.directory)
    _emit(
        args,
        {"recovered": [{"journal": str(r.journal), "actions": r.actions} for r in done]},
        "\n".join(f"{r.journal.name}: {r.summary}" for r in done) or "nothing to recover",
    )
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


COMMANDS = {
    "checkpoint": cmd_checkpoint,
    "restore": cmd_restore,
    "verify": cmd_verify,
    "inspect": cmd_inspect,
    "keygen": cmd_keygen,
    "recover": cmd_recover,
    "run": cmd_run,
}


def dispatch(prog: str, commands: dict, args: argparse.Namespace, level: int) -> int:
    """Run ``commands[args.cmd]``: a SnapshotError is one line on stderr and exit status 1
    (the console scripts' shared contract), Ctrl-C exit status 130."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return commands[args.cmd](args)
    except SnapshotError as e:
        print(f"{prog} {args.cmd}: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a path the user gave: one line, never a traceback
        where = f" ({e.filename})" if e.filename else ""
        print(f"{prog} {args.cmd}: {e.strerror or e}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog} {args.cmd}: interrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return dispatch(
        "snapshotctl", COMMANDS, args, logging.INFO if args.verbose else logging.WARNING
    )


if __name__ == "__main__":
    sys.exit(main())
