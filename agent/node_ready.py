"""Whether this node may run restore pods, said on the node itself: the label
``snapshot.nvidia.com/ready=true``, which the chart's RuntimeClass selects
(``scheduling.nodeSelector``), so the scheduler puts pods of the class only where the shim is
installed. The agent sets it once its init container has installed and registered the shim
(that container fails, with an Event on the node, when a prerequisite is missing; the agent
never starts there). It is taken off when the agent stops because its DaemonSet is gone (helm
uninstall), and kept across the agent's restarts and rolling updates, which leave the shim in
place. The agent-node admission policy lets an agent write this label on its own node only.
Because helm deletes the agent's RBAC beside its DaemonSet, the agent's own removal may come
too late; the chart's pre-delete hook (``snapshot-agent unlabel-nodes``) removes the label
from every node first, and an agent's installer removes it from its node before it starts,
so a label never outlives the shim it stands for.

Restore pods run tenants' code, so a node that also runs the signer (which holds the signing
key), the webhook or the controller is not made ready by default (``--not-beside``, the
chart's ``agent.readyBesideControlPlane``): those components' affinity keeps them off ready
nodes, and this keeps ready nodes off them when they were placed first, or moved there later
(the agent checks again while it runs). Only the release's own namespace is looked at: a
tenant's pod wearing the same labels blocks nothing."""

from __future__ import annotations

import asyncio
import logging

from kubernetes_asyncio import client

from kubeclient.api import emit_event, unless_absent
from kubeclient.owned import DEADLINE_S

log = logging.getLogger("snapshot.agent")
READY_LABEL = "snapshot.nvidia.com/ready"
STRATEGIC = "application/strategic-merge-patch+json"


async def mark(api: client.ApiClient, node: str, ready: bool) -> None:
    """Set (``ready``) or remove the label on ``node``."""
    body = {"metadata": {"labels": {READY_LABEL: "true" if ready else None}}}
    await client.CoreV1Api(api).patch_node(node, body, _content_type=STRATEGIC)
    log.info("node %s: label %s %s", node, READY_LABEL, "set" if ready else "removed")


async def beside(api: client.ApiClient, node: str, namespace: str, selector: str) -> list[str]:
    """The release's pods on ``node`` matching the label ``selector`` (namespace/name): only
    its own namespace is looked at, since a tenant may wear any labels in its own."""
    pods = await client.CoreV1Api(api).list_namespaced_pod(
        namespace, field_selector=f"spec.nodeName={node}", label_selector=selector
    )
    return sorted(
        f"{p.metadata.namespace}/{p.metadata.name}"
        for p in pods.items
        if p.status is None or p.status.phase not in ("Succeeded", "Failed")
    )


async def mark_ready(
    api: client.ApiClient, node: str, namespace: str, not_beside: str | None
) -> list[str]:
    """Set the label unless pods of the release (in ``namespace``) matching ``not_beside``
    run on the node; then remove it, and the node gets an Event that names them. Returns
    those pods."""
    blockers = await beside(api, node, namespace, not_beside) if not_beside else []
    await _label_for(api, node, blockers)
    return blockers


async def _label_for(api: client.ApiClient, node: str, blockers: list[str]) -> None:
    await mark(api, node, not blockers)
    if not blockers:
        return
    why = (
        f"not ready for restore pods: {', '.join(blockers)} run on this node, and restore "
        "pods run tenants' code (agent.readyBesideControlPlane=true allows it)"
    )
    log.warning("node %s %s", node, why)
    obj = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}
    await emit_event(api, obj, "Warning", "SnapshotNodeNotReady", why, "snapshot-agent")


async def keep_marked(
    api: client.ApiClient,
    node: str,
    namespace: str,
    not_beside: str,
    every_s: float = 60.0,
    deadline_s: float = DEADLINE_S,
) -> None:
    """While the agent runs: the label follows the control plane's pods as they come onto
    or leave the node (checked every ``every_s``, each check within ``deadline_s``); an
    Event only when the answer changes."""
    last: list[str] | None = None
    while True:
        await asyncio.sleep(every_s)
        try:
            async with asyncio.timeout(deadline_s):  # a hung API server: ask again later
                now = await beside(api, node, namespace, not_beside)
                if now != last:
                    await _label_for(api, node, now)
            last = now
        except Exception as e:  # the API server away: keep the label as it is, ask again
            log.warning("node %s: cannot check what runs beside the agent: %r", node, e)


async def unmark_all(api: client.ApiClient) -> list[str]:
    """Take the label off every node that has it (the chart's pre-delete hook); the nodes."""
    core = client.CoreV1Api(api)
    nodes = await core.list_node(label_selector=READY_LABEL)
    names = [n.metadata.name for n in nodes.items]
    for name in names:
        await mark(api, name, False)
    return names


async def unmark_if_uninstalled(
    api: client.ApiClient, node: str, namespace: str, daemonset: str
) -> bool:
    """At the agent's stop: take the label off when the agent's DaemonSet is gone or being
    deleted (an uninstall), not on a restart or a rolling update. True when taken off."""
    ds = await unless_absent(client.AppsV1Api(api).read_namespaced_daemon_set(daemonset, namespace))
    gone = ds is None or ds.metadata.deletion_timestamp is not None
    if gone:
        await mark(api, node, False)
    return gone
