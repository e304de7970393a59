"""PodSnapshot reconciler decisions, exhaustively over the source pod's states."""

from __future__ import annotations

import pytest

from api.crd import ARTIFACT_FINALIZER
from api.crd import PodSnapshotReasons as R
from controller.snapshots import reconcile
from tests.controller.objects import pod, snapshot


def cond(status, type_):
    return next((c for c in status.conditions if c.type == type_), None)


def test_running_source_is_handed_to_its_node():
    act = reconcile(snapshot(), pod())
    assert act.status.source.node_name == "node-a"
    ready = cond(act.status, "Ready")
    assert (ready.status, ready.reason) == ("False", R.CHECKPOINT_PENDING)
    assert "node-a" in ready.message and ready.last_transition_time is not None
    assert act.events == [("Normal", R.CHECKPOINT_PENDING, "checkpoint handed to node node-a")]
    assert not act.add_finalizer


def test_finalizer_is_added_first():
    assert reconcile(snapshot(finalizers=()), pod()).add_finalizer


@pytest.mark.parametrize(
    "source, fragment",
    [
        (None, "source pod src not found"),
        (pod(phase="Succeeded"), "has finished (Succeeded)"),
        (pod(phase="Failed"), "has finished (Failed)"),
    ],
)
def test_unusable_source_fails_the_snapshot(source, fragment):
    act = reconcile(snapshot(), source)
    failed, ready = cond(act.status, "Failed"), cond(act.status, "Ready")
    assert failed.status == "True" and failed.reason == R.INVALID_SOURCE
    assert fragment in failed.message
    assert ready.status == "False"
    assert act.events[0][:2] == ("Warning", R.INVALID_SOURCE)


def test_wrong_uid_fails():
    act = reconcile(snapshot(uid="other"), pod())
    assert "not other" in cond(act.status, "Failed").message


def test_missing_container_fails():
    act = reconcile(snapshot(container="worker"), pod())
    assert "no container 'worker'" in cond(act.status, "Failed").message


@pytest.mark.parametrize(
    "source, fragment",
    [
        (pod(node=""), "not scheduled yet"),
        (pod(phase="Pending"), "not running yet"),
        (pod(running=False), "not running yet"),
    ],
)
def test_source_not_yet_running_waits(source, fragment):
    act = reconcile(snapshot(), source)
    ready = cond(act.status, "Ready")
    assert (ready.status, ready.reason) == ("False", R.WAITING_FOR_SOURCE)
    assert fragment in ready.message and cond(act.status, "Failed") is None
    assert act.status.source is None


def test_waiting_twice_writes_nothing_new():
    first = reconcile(snapshot(), pod(running=False)).status
    snap = snapshot()
    snap.status = first
    assert reconcile(snap, pod(running=False)).status is None


@pytest.mark.parametrize(
    "conditions",
    [
        [("Ready", "True", R.CAPTURED)],
        [("Ready", "False", R.CHECKPOINT_FAILED), ("Failed", "True", R.CHECKPOINT_FAILED)],
    ],
)
def test_finished_snapshots_are_left_alone(conditions):
    act = reconcile(snapshot(conditions=conditions, node="node-a"), None)
    assert act.status is None and act.events == [] and not act.add_finalizer


def test_snapshot_in_the_agents_hands_is_left_alone():
    act = reconcile(snapshot([("Ready", "False", R.CHECKPOINTING)], node="node-a"), pod())
    assert act.status is None


def test_deleting_a_snapshot_no_node_took_drops_the_finalizer():
    act = reconcile(snapshot(deleting=True), pod())
    assert act.remove_finalizer and act.status is None


def test_deleting_a_snapshot_on_a_node_is_left_to_its_agent():
    act = reconcile(snapshot(deleting=True, node="node-a"), pod())
    assert not act.remove_finalizer


def test_deleting_without_our_finalizer_does_nothing():
    act = reconcile(snapshot(deleting=True, finalizers=()), pod())
    assert not act.remove_finalizer and not act.add_finalizer
    assert ARTIFACT_FINALIZER not in snapshot(finalizers=()).metadata.finalizers


@pytest.mark.parametrize(
    "snap",
    [
        snapshot(conditions=[("Ready", "True", "Captured")], node="node-a"),
        snapshot(
            conditions=[
                ("Ready", "False", "CheckpointFailed"),
                ("Failed", "True", "CheckpointFailed"),
            ],
            node="node-a",
        ),
        snapshot(conditions=[("Ready", "False", "CheckpointPending")], node="node-a"),
        snapshot(node="node-a", deleting=True),
        snapshot(deleting=True),
        snapshot(conditions=[("Failed", "True", "InvalidSource")], finalizers=()),
    ],
    ids=["captured", "failed", "handed-over", "deleting-on-node", "deleting", "invalid"],
)
def test_past_the_handover_the_source_pod_is_not_read(snap):
    """An idle pass costs one list, not one GET per snapshot: from the handover on, the
    decision is the same whatever the source pod, so the controller does not read it."""
    from controller.snapshots import needs_source

    assert not needs_source(snap)
    with_pod, without = reconcile(snap, pod()), reconcile(snap, None)
    assert with_pod == without


def test_before_the_handover_the_source_pod_is_read():
    from controller.snapshots import needs_source

    assert needs_source(snapshot()) and needs_source(
        snapshot(conditions=[("Ready", "False", "WaitingForSource")])
    )
