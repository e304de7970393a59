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


def test_a_shims_pull_in_flight_is_not_removed_by_an_agent_start(tmp_path):
    """Finding 15 of isolation round 2: the agent's start removed the node cache's staging
    directories too, under a shim pulling into one. A pull's staging goes only once it is
    older than any pull can run."""
    import os
    import time

    from restore_runtime.artifact.cache import CACHE_DIR, ArtifactCache

    cache = ArtifactCache(tmp_path / CACHE_DIR)
    cache.root.mkdir()
    pulling = Staging(cache.root / ("a" * 64))
    killed = Staging(cache.root / ("b" * 64))
    hour_ago = time.time() - 3601
    os.utime(killed.dir, (hour_ago, hour_ago))
    assert remove_stale_staging(tmp_path) == []
    assert pulling.dir.is_dir() and killed.dir.is_dir()
    assert cache.remove_stale_staging(3600) == [killed.dir]
    assert pulling.dir.is_dir() and not killed.dir.exists()
