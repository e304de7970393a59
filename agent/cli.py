"""``snapshot-agent``: the node agent (``run``, the DaemonSet's container) and the node
installer (``install-node``, its init container).

Exit status: 0 success, 1 the operation failed (the message says why), 2 bad usage."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from api.handshake import DEFAULT_HANDSHAKE_TIMEOUT_S
from api.node import DEFAULT_CACHE_MAX_BYTES, DEFAULT_STORE_ROOT, NodeConfig, switch
from api.paths import DEFAULT_RUNC_ROOT
from restore_runtime.artifact.oci import OciRef
from restore_runtime.cli import dispatch
from restore_runtime.errors import SnapshotError

from .signer_client import DEFAULT_TOKEN, RemoteSigner

#: run in the init container; the host's systemd is reached through PID 1's mount namespace
DEFAULT_RESTART = "nsenter --target 1 --mount -- systemctl restart containerd"
log = logging.getLogger("snapshot.agent")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="snapshot-agent", description=__doc__.splitlines()[0])
    p.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    sub = p.add_subparsers(dest="cmd", required=True)

    a = sub.add_parser("run", help="run the node agent (the chart's DaemonSet runs this)")
    a.add_argument("--node", default=os.environ.get("NODE_NAME"), help="default: $NODE_NAME")
    a.add_argument("--store", type=Path, default=DEFAULT_STORE_ROOT,
                   help="artifact store: the same path on every node that may restore")  # fmt: skip
    a.add_argument("--kubelet-root", type=Path, default=Path("/var/lib/kubelet"))
    a.add_argument("--runc-root", type=Path, default=DEFAULT_RUNC_ROOT)
    a.add_argument("--handshake-timeout", type=float, default=DEFAULT_HANDSHAKE_TIMEOUT_S,
                   metavar="S")  # fmt: skip
    a.add_argument("--sign-key", type=Path,
                   help="Ed25519 private key (PEM) to sign with, on this machine (a "
                        "one-machine setup; a cluster's nodes use --signer-url)")  # fmt: skip
    _signer_args(a)
    a.add_argument("--verify-key-path", type=Path, metavar="PATH",
                   help="the node's verification keys (install-node's): refreshed from the "
                        "signer every --key-refresh seconds")  # fmt: skip
    a.add_argument("--key-refresh", type=float, default=300.0, metavar="S")
    a.add_argument("--signer-token", type=Path, default=DEFAULT_TOKEN,
                   help="this agent's service-account token for the signer's audience")  # fmt: skip
    a.add_argument("--resync", type=float, default=300.0,
                   help="seconds between passes when nothing changes (passes run on watch "
                        "events)")  # fmt: skip
    a.add_argument(
        "--oci-repository",
        type=OciRef.parse,
        metavar="oci://REGISTRY/REPO",
        help="push artifacts to this OCI repository (the store keeps a node cache)",
    )
    a.add_argument("--oci-pre-pull", action="store_true",
                   help="pull each Ready PodSnapshot this node could restore before any pod "
                        "asks for it")  # fmt: skip
    _oci_args(a)
    a.add_argument("--max-checkpoints", type=int, default=4,
                   help="checkpoints at once on this node")  # fmt: skip
    a.add_argument("--max-checkpoints-per-namespace", type=int, default=2,
                   help="of those, at most this many of one namespace (the rest wait)")  # fmt: skip
    a.add_argument("--kubeconfig", help="default: $KUBECONFIG, then in-cluster config")
    a.add_argument("--metrics-port", type=int, default=9400, help="Prometheus /metrics; 0: off")
    a.add_argument("--daemonset", metavar="NAMESPACE/NAME",
                   help="the agent's DaemonSet: label the node snapshot.nvidia.com/ready=true "
                        "while it runs, and take the label off when it stops because the "
                        "DaemonSet is gone (uninstalled)")  # fmt: skip
    a.add_argument("--not-beside", metavar="SELECTOR",
                   help="with --daemonset: no label while pods matching this selector "
                        "run on the node (the signer, webhook, controller)")  # fmt: skip

    n = sub.add_parser("install-node", help="install the shim on a host, register it with "
                       "containerd (the agent's init container runs this)")  # fmt: skip
    _host_args(n, "config changed (until it succeeds once)")
    n.add_argument("--verify-key", type=Path, help="Ed25519 public key restores must match")
    n.add_argument(
        "--sign-key",
        type=Path,
        help="the agent's Ed25519 private key: only its public half is installed",
    )
    n.add_argument(
        "--store",
        type=Path,
        default=DEFAULT_STORE_ROOT,
        help="the artifact store: restores read artifacts from under it only",
    )
    _signer_args(n, "install the public key the signer serves (waits for it up to 5 min)")
    n.add_argument("--no-signing-required", dest="signing_required", action="store_false",
                   help="let the shim restore unsigned artifacts (weakens isolation)")  # fmt: skip
    n.add_argument("--fill-threads", type=int, default=0, metavar="N",
                   help="threads that fill a restore's memory into the tree (0: the node's "
                        "CPUs, at most 16)")  # fmt: skip
    n.add_argument("--fill-ledger", type=switch, default=True, metavar="BOOL",
                   help="restores skip hashing memory-file chunks this node already verified, "
                        "on a local store (default true)")  # fmt: skip
    n.add_argument(
        "--packages",
        type=Path,
        metavar="SITE_PACKAGES",
        help="the packages the bundle carries (default: this environment's)",
    )
    n.add_argument("--skip-host-check", dest="check_host", action="store_false",
                   help="do not run the installed interpreter inside the host's root before "
                        "registering it (for a host root that is not a whole system)")  # fmt: skip
    n.add_argument("--runtime-binary", default="runc", metavar="NAME_OR_PATH",
                   help="the runc-compatible runtime the shim runs (containerd's BinaryName), "
                        "e.g. nvidia-container-runtime on GPU Operator nodes")  # fmt: skip
    n.add_argument("--node", default=os.environ.get("NODE_NAME"),
                   help="this node's name (default: $NODE_NAME): a failure is also an Event "
                        "on it")  # fmt: skip
    n.add_argument("--host-to-container", action="append", default=[], type=Path,
                   metavar="HOST_PATH",
                   help="a host path the agent mounts with HostToContainer propagation (the "
                        "kubelet root, containerd's state and root): refused at once, with the "
                        "mount named, when it is on a private mount")  # fmt: skip
    _oci_args(n)

    sub.add_parser("unlabel-nodes", help="take the label snapshot.nvidia.com/ready off every "
                   "node (the chart's pre-delete hook)")  # fmt: skip

    u = sub.add_parser("uninstall-node", help="take off a host what install-node put "
                       "there (the runtime table, the shim, its keys)")  # fmt: skip
    _host_args(u, "config changed")
    u.add_argument("--purge-store", type=Path, metavar="STORE",
                   help="also delete this artifact store (every artifact on the node)")  # fmt: skip
    return p


def _host_args(p: argparse.ArgumentParser, when: str) -> None:
    """Where the host is and what install-node puts on it, and how containerd restarts:
    install-node and uninstall-node take the same."""
    p.add_argument("--host-root", type=Path, required=True, help="where the host's / is mounted")
    p.add_argument("--prefix", type=Path, default=Path("/opt/snapshot"))
    p.add_argument("--bin-dir", type=Path, default=Path("/usr/local/bin"),
                   help="the shim wrapper's directory, on containerd's PATH")  # fmt: skip
    p.add_argument("--containerd-config", type=Path, default=Path("/etc/containerd/config.toml"))
    p.add_argument("--restart-containerd", dest="restart_command", action="store_const",
                   const=DEFAULT_RESTART,
                   help=f"same as --restart-command '{DEFAULT_RESTART}'")  # fmt: skip
    p.add_argument(
        "--restart-command",
        metavar="CMD",
        help=f"shell command that restarts the host's containerd, run when its {when}",
    )


def _signer_args(p: argparse.ArgumentParser, what: str = "ask it for every signature") -> None:
    p.add_argument("--signer-url", metavar="https://HOST",
                   help=f"the cluster's signer (snapshot-signer): {what}")  # fmt: skip
    p.add_argument("--signer-ca", type=Path, help="the CA of the signer's certificate (PEM)")


def _remote_signer(args: argparse.Namespace) -> RemoteSigner | None:
    if not args.signer_url:
        return None
    if args.signer_ca is None or getattr(args, "sign_key", None) is not None:
        raise SnapshotError("--signer-url needs --signer-ca, and excludes --sign-key")
    token = getattr(args, "signer_token", DEFAULT_TOKEN)
    return RemoteSigner(args.signer_url, args.signer_ca, token)


def _oci_args(p: argparse.ArgumentParser) -> None:
    """How the agent (push) and the shim (pull) reach OCI registries: the same settings."""
    p.add_argument(
        "--oci-plain-http",
        default="",
        metavar="HOST[:PORT],…",
        help="registries reached over plain HTTP (test registries only)",
    )
    p.add_argument(
        "--oci-auth-file",
        type=Path,
        metavar="CONFIG_JSON",
        help="docker config.json with registry credentials (a pull secret's)",
    )
    p.add_argument("--oci-cache-max-gb", type=float, default=DEFAULT_CACHE_MAX_BYTES / 1024**3,
                   help="size of the node's cache of pulled artifacts")  # fmt: skip


def _oci_node(args: argparse.Namespace, **settings) -> NodeConfig:
    """The node's settings from the command line: the OCI ones every command takes, and
    ``settings`` (install-node's own)."""
    return NodeConfig(
        **settings,
        oci_plain_http=tuple(h for h in args.oci_plain_http.split(",") if h),
        oci_auth_file=args.oci_auth_file,
        oci_cache_max_bytes=int(args.oci_cache_max_gb * 1024**3),
    )


def agent_config(args: argparse.Namespace):
    """``run``'s arguments as the agent's configuration."""
    from restore_runtime.node import registry_access

    from .loop import AgentConfig

    if not args.node:
        raise SnapshotError("give --node or set NODE_NAME (the downward API's spec.nodeName)")
    oci = _oci_node(args)
    return AgentConfig(
        node=args.node,
        store=args.store,
        kubelet_root=args.kubelet_root,
        runc_root=args.runc_root,
        handshake_timeout_s=args.handshake_timeout,
        signer=_remote_signer(args),
        sign_key=args.sign_key,
        oci_repository=args.oci_repository,
        registry=registry_access(oci),
        oci_cache_max_bytes=oci.oci_cache_max_bytes,
        pre_pull=args.oci_pre_pull,
        max_checkpoints=args.max_checkpoints,
        max_checkpoints_per_namespace=args.max_checkpoints_per_namespace,
    )


def cmd_run(args: argparse.Namespace) -> int:
    from kubeclient import api as kube
    from kubeclient.workqueue import run_per_object

    from . import node_ready
    from .keys import keep_fresh
    from .loop import Agent

    cfg = agent_config(args)

    async def run() -> None:
        async with await kube.api_client(args.kubeconfig) as api:
            agent = Agent(api, cfg)
            if args.metrics_port:  # first: the kubelet's probes ask it while recovery runs
                agent.metrics.serve(args.metrics_port)
            await agent.recover()
            background = set()  # held here, as long as the agent runs
            if cfg.signer is not None and args.verify_key_path is not None:
                background.add(asyncio.create_task(
                    keep_fresh(cfg.signer, args.verify_key_path, args.key_refresh)))  # fmt: skip
            if args.daemonset:
                release_ns = args.daemonset.partition("/")[0]
                await node_ready.mark_ready(api, cfg.node, release_ns, args.not_beside)
                if args.not_beside:
                    background.add(asyncio.create_task(node_ready.keep_marked(
                        api, cfg.node, release_ns, args.not_beside)))  # fmt: skip
            log.info("agent for node %s, artifact store %s", cfg.node, cfg.store)
            await run_per_object(agent.reconcile_key, agent.watched(), args.resync,
                                 sanitize=api.sanitize_for_serialization)  # fmt: skip
            if args.daemonset:  # stopped (SIGTERM): uninstalled, or only restarted?
                namespace, _, name = args.daemonset.partition("/")
                await node_ready.unmark_if_uninstalled(api, cfg.node, namespace, name)

    asyncio.run(run())
    return 0


def cmd_install_node(args: argparse.Namespace) -> int:
    node = args.node  # with it, the API: imported only then (a node set up by hand has none)
    if node:  # not ready while (re)installing: a label left by an earlier install goes
        from .node_ready import mark

        asyncio.run(_best_effort(f"take the readiness label off node {node}",
                                 lambda api: mark(api, node, False)))  # fmt: skip
    try:
        return _install_node(args)
    except SnapshotError as e:
        if node:  # the admin sees why on the node (kubectl describe node), not only here
            from kubeclient.api import emit_event

            obj = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}
            why = f"snapshot-agent install-node: {e}"
            asyncio.run(_best_effort("record the node's event", lambda api: emit_event(
                api, obj, "Warning", "SnapshotNodeNotReady", why, "snapshot-agent")))  # fmt: skip
        raise


async def _best_effort(what: str, call) -> None:
    """``call(api)`` with the pod's API access; a failure is logged (a node set up by hand
    has no API access, and the installer's own outcome is what counts)."""
    from kubeclient import api as kube

    try:
        async with await kube.api_client() as api:
            await call(api)
    except Exception as e:
        log.warning("could not %s: %s", what, e)


def install_settings(args: argparse.Namespace) -> NodeConfig:
    """The node's settings as install-node's flags give them (the chart's agent values)."""
    return _oci_node(args, store_root=args.store, signing_required=args.signing_required,
                     fill_threads=args.fill_threads or None, fill_ledger=args.fill_ledger,
                     runtime_binary=args.runtime_binary)  # fmt: skip


def _install_node(args: argparse.Namespace) -> int:
    from .install import check_host_mounts, install, restart_marker

    check_host_mounts(args.host_to_container)
    node = install_settings(args)
    verify_key = args.verify_key
    if signer := _remote_signer(args):
        verify_key = Path(tempfile.mkdtemp()) / "verify.pem"
        verify_key.write_bytes(signer.public_key(wait_s=300.0))
        print(f"verify key: from {signer.url}")
    res = install(args.host_root, args.prefix, args.containerd_config, verify_key,
                  packages=args.packages, sign_key=args.sign_key, bin_dir=args.bin_dir,
                  node=node, check_host=args.check_host)  # fmt: skip
    print(f"shim: {res.shim}; containerd config {'updated' if res.config_changed else 'unchanged'}")
    # written by install() before the config: a restart that fails (the init container then
    # fails and runs again), or an install killed after the config, is retried
    pending = restart_marker(res.config)
    if pending.exists() and args.restart_command:
        try:
            _restart(args.restart_command)
        except SnapshotError as e:
            if res.config_changed:
                raise _put_back(res.config, pending, args.restart_command, e) from e
            raise
        pending.unlink()
    elif pending.exists():
        print("restart containerd to load the snapshot runtime")
    return 0


def cmd_unlabel_nodes(args: argparse.Namespace) -> int:
    from kubeclient import api as kube

    from .node_ready import unmark_all

    async def run() -> list[str]:
        async with await kube.api_client() as api:
            return await unmark_all(api)

    names = asyncio.run(run())
    print(f"label removed from {len(names)} node(s): {', '.join(names) or '-'}")
    return 0


def cmd_uninstall_node(args: argparse.Namespace) -> int:
    from .uninstall import uninstall

    res = uninstall(args.host_root, args.prefix, args.containerd_config, args.bin_dir,
                    args.purge_store)  # fmt: skip
    print("removed: " + (", ".join(str(p) for p in res.removed) or "nothing"))
    print(f"containerd config {'updated' if res.config_changed else 'unchanged'}")
    if res.config_changed and args.restart_command:
        _restart(args.restart_command)
    elif res.config_changed:
        print("restart containerd to unload the snapshot runtime")
    return 0


def _put_back(config: Path, pending: Path, command: str, why: SnapshotError) -> SnapshotError:
    """containerd did not come up with the config this run wrote: the one before it is put
    back and containerd restarted with it, so the node keeps the runtimes it had (the next
    run registers ours again). The error to fail the install with."""
    backup = config.with_name(config.name + ".pre-snapshot")
    if not backup.exists():
        return why
    shutil.copy2(backup, config)
    pending.unlink(missing_ok=True)
    try:
        _restart(command)
    except SnapshotError as again:
        return SnapshotError(f"{why}; the config before install-node was put back, and "
                             f"containerd did not restart with it either: {again}")  # fmt: skip
    return SnapshotError(f"{why}; the config before install-node was put back and "
                         "containerd restarted with it")  # fmt: skip


def _restart(command: str) -> None:
    # containers keep running across a containerd restart (their shims outlive it)
    p = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
    if p.returncode != 0:
        raise SnapshotError(f"restarting containerd ({command!r}) failed "
                            f"({p.returncode}): {p.stderr.strip()}")  # fmt: skip
    print(f"containerd restarted ({command})")


COMMANDS = {"run": cmd_run, "install-node": cmd_install_node,
            "uninstall-node": cmd_uninstall_node, "unlabel-nodes": cmd_unlabel_nodes}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return dispatch(
        "snapshot-agent", COMMANDS, args, logging.DEBUG if args.verbose else logging.INFO
    )


if __name__ == "__main__":
    sys.exit(main())
