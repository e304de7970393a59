"""Restore outcomes, told to Kubernetes: the agent reads the report a restoring pod's shim
wrote into the pod's control volume, and gives the pod the condition ``nvidia.com/Restored``
and an Event with the phase timings (agent/decisions.py decides what they say)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from api.handshake import RESTORE_REPORT
from api.report import RestoreReport
from kubeclient import api as kube
from restore_runtime.control_files import read_control_file
from restore_runtime.errors import SnapshotError

from . import decisions as d
from .metrics import AgentMetrics

log = logging.getLogger("snapshot.agent")
COMPONENT = "snapshot-agent"


class RestoreReports:
    def __init__(self, api: client.ApiClient, metrics: AgentMetrics, node: str,
                 kubelet_root: Path) -> None:  # fmt: skip
        self.api, self.core = api, client.CoreV1Api(api)
        self.metrics, self.node, self.kubelet_root = metrics, node, kubelet_root

    async def report(self, pod: dict[str, Any]) -> None:
        """The restore outcome of ``pod``, once its shim has written it (a later event of the
        pod, its containers starting, brings it back here otherwise)."""
        if not d.needs_restore_report(pod, self.node):
            return
        path = d.control_dir(self.kubelet_root, pod["metadata"]["uid"]) / RESTORE_REPORT
        try:
            report = RestoreReport.model_validate_json(read_control_file(path))
        except FileNotFoundError:
            return  # not started yet
        except (ValueError, SnapshotError) as e:  # the pod's tenant controls this file
            log.warning("unreadable restore report of pod %s/%s: %s",
                        pod["metadata"]["namespace"], pod["metadata"]["name"], e)  # fmt: skip
            return
        await self.tell(pod, report)

    async def tell(self, pod: dict[str, Any], report: RestoreReport) -> None:
        cond = d.restored_condition(report)
        self.metrics.restored(report.outcome.value, report.timings.get("total"))
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        meta = pod["metadata"]
        # A strategic merge patch merges conditions by type and leaves the kubelet's alone.
        await self.core.patch_namespaced_pod_status(
            meta["name"], meta["namespace"], {"status": {"conditions": [cond.to_api(now)]}}
        )
        type_ = "Normal" if cond.status == "True" else "Warning"
        pod_ref = {"apiVersion": "v1", "kind": "Pod", "metadata": meta}
        await kube.emit_event(self.api, pod_ref, type_, cond.reason, cond.message, COMPONENT)
        log.info("pod %s/%s: %s (%s)", meta["namespace"], meta["name"], cond.reason, cond.message)
