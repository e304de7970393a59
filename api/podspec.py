"""Pod spec edits shared by the webhook (restore pods) and the controller (SnapshotJob source
pods): both give one container the control directory of the workload handshake, which the
node agent then finds by its volume's name. And the reading of a container's status, shared
by the controller and the node agent; and whether a pod is a PodSnapshot's source on a node,
which the node agent and the signer each check for themselves."""

from __future__ import annotations

from typing import Any

from .handshake import CONTROL_DIR_ENV, DEFAULT_CONTROL_DIR

CONTROL_VOLUME = "snapshot-control"


def add_control_dir(spec: dict[str, Any], container_name: str) -> str:
    """Adds (idempotently) the emptyDir control volume, mounted in container_name at
    $SNAPSHOT_CONTROL_DIR, and returns that path. A path the user already set in the
    container's env is kept."""
    volumes = spec.setdefault("volumes", [])
    if not any(v.get("name") == CONTROL_VOLUME for v in volumes):
        volumes.append({"name": CONTROL_VOLUME, "emptyDir": {}})
    container = next(c for c in spec["containers"] if c.get("name") == container_name)
    env = container.setdefault("env", [])
    control_dir = next((e.get("value") for e in env if e.get("name") == CONTROL_DIR_ENV), None)
    if control_dir is None:
        control_dir = DEFAULT_CONTROL_DIR
        env.append({"name": CONTROL_DIR_ENV, "value": control_dir})
    mounts = container.setdefault("volumeMounts", [])
    if not any(m.get("mountPath") == control_dir for m in mounts):
        mounts.append({"name": CONTROL_VOLUME, "mountPath": control_dir})
    return control_dir


def container_status(pod: dict[str, Any], name: str | None) -> dict[str, Any] | None:
    """The kubelet's status of container `name` in a pod (as the API server returns it)."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return next((s for s in statuses if s.get("name") == name), None)


def is_running(status: dict[str, Any] | None) -> bool:
    return status is not None and "running" in (status.get("state") or {})


def source_mismatch(
    pod: dict[str, Any], node: str, uid: str | None
) -> tuple[str, str | None, str] | None:
    """How ``pod`` is not the source a PodSnapshot names on ``node`` (with ``uid`` when it
    pins one): ("node", the node it runs on, node), ("uid", its uid, uid), or None. A pod's
    status is its node's to write, so only its binding and uid are believed; each caller
    words the refusal."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    if spec.get("nodeName") != node:
        return "node", spec.get("nodeName"), node
    if uid and meta.get("uid") != uid:
        return "uid", meta.get("uid"), uid
    return None
