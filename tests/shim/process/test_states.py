"""Process states x operations (shim/process/states.py), with a stand-in process that records
the work each transition asks for. Every pair is covered: allowed operations do their work
and move to the documented state; the others fail with the shim's own FailedPrecondition
(NotFound once deleted), which the task service answers as FAILED_PRECONDITION (NOT_FOUND),
and do no work. The stand-in replaces runc only: the real thing runs in the
containerd tests.

The restore decision is the state's: a restore that fails cold-starts under ``fallback``
and fails Start under ``strict``, reporting the outcome either way."""

from __future__ import annotations

import pytest

from api.annotations import RestoreOutcome, RestorePolicy
from shim.process import states as st
from shim.process.errors import ProcessError
from shim.process.restore import RestoreFailed
from shim.task.errors import to_rpc
from shim.ttrpc.codes import Code


class Target:
    """Stands in for RestoreTarget: the policy, and the reports it was asked to write."""

    def __init__(self, policy: RestorePolicy) -> None:
        self.policy = policy
        self.reported: list[RestoreOutcome] = []

    def report_failure(self, e: RestoreFailed, outcome: RestoreOutcome) -> None:
        self.reported.append(outcome)


class Recorder:
    def __init__(self, policy: RestorePolicy = RestorePolicy.FALLBACK, fail: bool = False):
        self.calls: list[str] = []
        self.restore_target = Target(policy)
        self.container_id = "c1"
        self.fail_restore = fail

    def drop_failed_io(self) -> None:
        """A failed restore's stdio let go of (nothing to let go of here)."""

    def __getattr__(self, name: str):
        if not name.startswith("do_"):
            raise AttributeError(name)

        async def op(*args, **kwargs):
            self.calls.append(name)
            if name == "do_restore" and self.fail_restore:
                raise RestoreFailed("criu", "CRIU said no")

        return op


OPS = ["start", "kill", "delete", "pause", "resume"]
# state -> op -> (next state class or None for "no change", work done)
ALLOWED = {
    st.Created: {
        "start": (st.Running, "do_start"),
        "kill": (None, "do_kill"),
        "delete": (st.Deleted, "do_delete"),
    },
    st.CreatedFromArtifact: {
        "start": (st.Running, "do_restore"),
        "delete": (st.Deleted, "do_delete"),
    },
    st.Running: {"kill": (None, "do_kill"), "pause": (st.Paused, "do_pause")},
    st.Paused: {"kill": (None, "do_kill"), "resume": (st.Running, "do_resume")},
    st.Stopped: {"delete": (st.Deleted, "do_delete")},
    st.Deleted: {},
}


def refusal_code(state_cls: type, op: str) -> Code:
    # nothing to act on: the process is gone, finished, or not started yet (restores on start)
    if state_cls is st.Deleted or (
        op == "kill" and state_cls in (st.Stopped, st.CreatedFromArtifact)
    ):
        return Code.NOT_FOUND
    return Code.FAILED_PRECONDITION


async def apply(state: st.State, op: str, p: Recorder):
    if op == "kill":
        return await state.kill(p, 9, False)
    return await getattr(state, op)(p)


@pytest.mark.parametrize("state_cls", list(ALLOWED))
@pytest.mark.parametrize("op", OPS)
async def test_every_state_and_operation(state_cls, op):
    p = Recorder()
    allowed = ALLOWED[state_cls].get(op)
    if allowed is None:
        with pytest.raises(ProcessError) as e:
            await apply(state_cls(), op, p)
        assert to_rpc(e.value).code == refusal_code(state_cls, op)
        assert p.calls == []
        return
    next_cls, work = allowed
    result = await apply(state_cls(), op, p)
    assert p.calls == [work]
    if next_cls is None:
        assert result is None
    else:
        assert isinstance(result, next_cls) and type(result) is next_cls


@pytest.mark.parametrize("state_cls", list(ALLOWED))
def test_exit_transitions(state_cls):
    after = state_cls().exited(Recorder())
    if state_cls is st.Deleted:
        assert isinstance(after, st.Deleted)
    else:
        assert type(after) is st.Stopped


async def test_stopped_kill_all_still_reaches_strays():
    p = Recorder()
    await st.Stopped().kill(p, 9, True)
    assert p.calls == ["do_kill"]


async def test_failed_restore_cold_starts_under_fallback():
    p = Recorder(RestorePolicy.FALLBACK, fail=True)
    result = await st.CreatedFromArtifact().start(p)
    assert type(result) is st.Running
    assert p.calls == ["do_restore", "do_create", "do_start"]
    assert p.restore_target.reported == [RestoreOutcome.FELL_BACK]


async def test_failed_restore_fails_start_under_strict():
    p = Recorder(RestorePolicy.STRICT, fail=True)
    with pytest.raises(ProcessError) as e:
        await st.CreatedFromArtifact().start(p)
    assert to_rpc(e.value).code == Code.FAILED_PRECONDITION and "CRIU said no" in str(e.value)
    assert p.calls == ["do_restore"]
    assert p.restore_target.reported == [RestoreOutcome.FAILED]
