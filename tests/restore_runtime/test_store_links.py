"""Isolation round 4, attack 1: a link planted in a shared store makes a restoring node write
a file of its choosing. Root on another node that shares the store plants names in the
artifact's ``criu/`` after the restore's checks; every restore rewrites images (the network
lock always) and CRIU writes its restore stats among the images, so a view that merges the
store's names, or links them in, would write through them as root in the host's namespace.

Cases, with real CRIU, the links planted right after the verify phase (the moment chosen by
the test, by a hook on the next step, not by luck): symbolic links named as the engine's
temporaries and as CRIU's stats file, and a hard link to a file outside the store, each
pointing at a victim file; on the overlay view and on the linked view used where overlay
is unavailable. The victims keep their bytes and the restored counter continues."""

from __future__ import annotations

import os

import pytest

from restore_runtime.executor import workdir
from restore_runtime.executor.restore import Restore, RestoreRequest, restore
from tests.conftest import requires_criu
from tests.helpers import ask

pytestmark = [requires_criu, pytest.mark.root]
VICTIM = b"a host file the store must never reach\n"


def plant_after_the_checks(monkeypatch, art, victims) -> None:
    """Links in the store's criu/ once the verify phase is over: the next step plants."""
    gate = Restore._gate

    def planted_first(self, manifest):
        criu = art / "criu"
        os.symlink(victims["inventory"], criu / ".inventory.img.tmp")
        os.symlink(victims["files"], criu / ".files.img.tmp")
        os.symlink(victims["stats"], criu / "stats-restore")
        os.link(victims["hard"], criu / ".utsns-11.img.tmp")
        return gate(self, manifest)

    monkeypatch.setattr(Restore, "_gate", planted_first)


@pytest.mark.parametrize("view", ["overlay", "linked"])
def test_links_planted_in_the_store_write_nothing_outside_it(
    artifact, tmp_path, monkeypatch, cleanup_pids, view
):
    art, port = artifact
    victims = {}
    for name in ("inventory", "files", "stats", "hard"):
        victims[name] = tmp_path / f"victim-{name}"
        victims[name].write_bytes(VICTIM)
    plant_after_the_checks(monkeypatch, art, victims)
    if view == "linked":

        def no_overlay(*args, **kwargs):
            raise OSError(19, "overlay unavailable (the test's)")

        monkeypatch.setattr(workdir.mounts, "mount", no_overlay)
    report = restore(RestoreRequest(artifact=art))
    cleanup_pids.append(report.pid)
    assert ask("127.0.0.1", port)["count"] == "4", "restored"
    changed = {n: p.read_bytes() for n, p in victims.items() if p.read_bytes() != VICTIM}
    assert changed == {}, f"written through a link in the store: {sorted(changed)}"
    assert (art / "criu" / "stats-restore").is_symlink(), "the store's names were replaced"


def test_a_store_entry_that_is_not_a_regular_file_is_refused_in_the_linked_view(
    tmp_path, monkeypatch
):
    """The linked view takes the manifest's page images only, each the store's own entry
    (never what a link there points at) and a regular file."""
    store, verified, work = tmp_path / "store", tmp_path / "verified", tmp_path / "work"
    store.mkdir()
    (tmp_path / "elsewhere").write_bytes(b"x")
    os.symlink(tmp_path / "elsewhere", store / "pages-1.img")
    (store / "not-listed.img").write_bytes(b"y")
    work.mkdir()

    def no_overlay(*args, **kwargs):
        raise OSError(19, "overlay unavailable (the test's)")

    monkeypatch.setattr(workdir.mounts, "mount", no_overlay)
    with pytest.raises(OSError, match=r"pages-1\.img is not a regular file"):
        workdir.stage_images(store, verified, work, ["pages-1.img"])
    assert not (work / "images" / "not-listed.img").exists()
    assert not (work / "images" / "pages-1.img").exists()
