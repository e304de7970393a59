"""Staging directories of checkpoints killed mid-way (restore_runtime/artifact/pack.py): the
agent removes them at start, and nothing else (committed artifacts stay)."""

from __future__ import annotations

from restore_runtime.artifact.pack import Staging, remove_stale_staging


def test_stale_staging_dirs_are_removed_and_artifacts_kept(tmp_path):
    ns = tmp_path / "tenant-a"
    ns.mkdir()
    done = Staging(ns / "done")
    (done.dir / "manifest.json").write_text("{}")
    done.commit()
    killed = Staging(ns / "killed")  # a checkpoint that never committed nor aborted
    (killed.dir / "pages-1.img").write_bytes(b"x" * 1024)
    top = Staging(tmp_path / "old")

    removed = remove_stale_staging(tmp_path)
    assert sorted(removed) == sorted([killed.dir, top.dir])
    assert not killed.dir.exists() and not top.dir.exists()
    assert (ns / "done" / "manifest.json").exists()
