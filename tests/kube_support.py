"""Driving the control plane's components in tests through their real per-object entry
point: ``resync`` does what one resync of kubeclient.workqueue.run_per_object does (every
watched collection listed, every key its objects name reconciled once, through the
component's own ``reconcile_key``), in turn rather than on four workers, so a test knows
when it is over. ``settle`` waits for the agent's checkpoints and pre-pulls in flight;
``hand_over`` creates a PodSnapshot and lets the controller hand it to its pod's node."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from controller.loop import Controller
from kubeclient import api as kube
from kubeclient.watch import listed_items
from kubeclient.workqueue import Key

log = logging.getLogger(__name__)


async def resync(component: Any) -> None:
    """``component``: a Controller or an Agent (``watched()`` and ``reconcile_key``)."""
    sanitize = component.api.sanitize_for_serialization
    keys: dict[Key, dict | None] = {}
    for w in component.watched():
        listed = await w.source.list_fn(*w.source.args, **w.source.kwargs)
        for obj in listed_items(listed, sanitize):
            for key, o in w.keys(obj):
                if o is not None or key not in keys:
                    keys[key] = o
    for key, obj in keys.items():
        try:
            await component.reconcile_key(key, obj)
        except Exception as e:  # as the work queue: logged, that key alone fails
            log.warning("reconciling %s %s/%s failed: %s", *key, e)


async def settle(agent: Any) -> None:
    """Until the agent's checkpoints and pre-pulls in flight have ended."""
    while agent.running or agent.pulling:
        await asyncio.gather(
            *agent.running.values(), *agent.pulling.values(), return_exceptions=True
        )


async def hand_over(control_plane, api, ns: str, name: str, pod: str, **spec) -> None:
    """A PodSnapshot of ``pod``, handed to the pod's node by the controller's own reconcile
    (two passes: it is created, then handed over)."""
    source = {"podRef": {"name": pod}, "containers": ["main"]}
    body = {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "PodSnapshot",
        "metadata": {"name": name},
        "spec": {"source": source, **spec},
    }
    r = api.post(f"/apis/nvidia.com/v1alpha1/namespaces/{ns}/podsnapshots", json=body)
    assert r.status_code == 201, r.text
    async with await kube.api_client(str(control_plane.kubeconfig)) as client:
        controller = Controller(client)
        await resync(controller)
        await resync(controller)
