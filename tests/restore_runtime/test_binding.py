"""The binding checks of the engine (restore_runtime/artifact/binding.py), before anything
under a path a pod named is read.

Cases: a FIFO as the manifest of an artifact outside the store is refused at once (reading it
first would hang the restore, and with it the pod's shim); a path that resolves into the store
through ``..`` is judged by where it resolves."""

from __future__ import annotations

import os
import threading

import pytest

from restore_runtime.errors import VerificationError
from restore_runtime.executor.restore import RestoreRequest
from tests.helpers import bound_node, up_to_the_tree


def prepare_within(req: RestoreRequest, seconds: float = 10.0) -> BaseException | None:
    out: dict = {}

    def run():
        try:
            up_to_the_tree(req)
        except BaseException as e:  # the assertion is on what it raised
            out["e"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "prepare blocked on a file the pod controls"
    return out.get("e")


def test_a_fifo_outside_the_store_is_never_opened(tmp_path):
    store, evil = tmp_path / "store", tmp_path / "tenant"
    store.mkdir()
    evil.mkdir()
    os.mkfifo(evil / "manifest.json")
    e = prepare_within(
        RestoreRequest(
            artifact=evil,
            node=bound_node(store),
            namespace="default",
            admitted_digest="sha256:" + "0" * 64,
        )
    )
    assert isinstance(e, VerificationError) and "not in this node's artifact store" in str(e)


def test_dot_dot_is_judged_where_it_resolves(tmp_path):
    store = tmp_path / "store"
    (store / "default").mkdir(parents=True)
    (tmp_path / "tenant").mkdir()
    e = prepare_within(
        RestoreRequest(
            artifact=store / "default" / ".." / ".." / "tenant",
            node=bound_node(store),
            namespace="default",
            admitted_digest="sha256:" + "0" * 64,
        )
    )
    assert isinstance(e, VerificationError) and "not in this node's artifact store" in str(e)


@pytest.mark.parametrize("digest", [None, "sha256:" + "0" * 64])
def test_an_artifact_in_the_store_still_needs_the_admitted_digest(tmp_path, digest):
    art = tmp_path / "store" / "default" / "snap"
    art.mkdir(parents=True)
    (art / "manifest.json").write_text("{}")
    e = prepare_within(
        RestoreRequest(
            artifact=art,
            node=bound_node(tmp_path / "store"),
            namespace="default",
            admitted_digest=digest,
        )
    )
    assert isinstance(e, VerificationError)
    assert ("no admitted manifest digest" if digest is None else "is not the admitted") in str(e)


@pytest.mark.parametrize("what", ["store", "artifact", "criu", "file"])
@pytest.mark.parametrize("how", ["group-writable", "owned-by-a-user"])
def test_an_artifact_others_than_root_can_write_is_refused(tmp_path, what, how):
    """Isolation round 2, attack 3: whoever can write the artifact directory swaps a
    checked core image between the check and CRIU's read of it. So no one but root may be
    able to write any of it; checked before anything in it is opened."""
    store = tmp_path / "store"
    art = store / "default" / "snap"
    (art / "criu").mkdir(parents=True)
    (art / "criu" / "core-1.img").write_bytes(b"x")
    (art / "manifest.json").write_text("{}")
    target = {
        "store": store / "default",
        "artifact": art,
        "criu": art / "criu",
        "file": art / "criu" / "core-1.img",
    }[what]
    if how == "group-writable":
        target.chmod(target.stat().st_mode | 0o020)
    else:
        os.chown(target, 1000, 1000)
    e = prepare_within(
        RestoreRequest(
            artifact=art,
            node=bound_node(store),
            namespace="default",
            admitted_digest="sha256:" + "0" * 64,
        )
    )
    assert isinstance(e, VerificationError), e
    assert f"{target} can be written by others than root" in str(e)
