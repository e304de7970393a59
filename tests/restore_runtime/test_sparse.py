"""Zero pages left out of a dump (restore_runtime/criu/sparse.py), with real CRIU (root).

The workload (tests/workloads/zero_pages.py) holds touched zero pages in private anonymous
memory and a zeroed copy-on-write page in a private file mapping. The dump without the zero
pages is smaller, and the restored process sees the same memory in both mappings: the
anonymous zeros come back as zeros, the file page as zero and not as the file's bytes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from devnode import free_port
from restore_runtime import sandbox
from restore_runtime.criu import sparse
from tests.conftest import requires_criu
from tests.helpers import ROOT, ask, restore_cli, snapshotctl

pytestmark = [requires_criu, pytest.mark.root]

ZERO_PAGES = ROOT / "tests" / "workloads" / "zero_pages.py"


def _start(tmp: Path) -> tuple[int, int]:
    port = free_port()
    argv = [sys.executable, str(ZERO_PAGES), "127.0.0.1", str(port), str(tmp / "ones.bin")]
    return sandbox.start(argv, tmp / "zero-pages.log"), port


def _page_bytes(art: Path) -> int:
    return sum(p.stat().st_size for p in (art / "criu").glob("pages-*.img"))


def _pagemap_pages(criu_dir: Path) -> int:
    from pycriu import images

    total = 0
    for pm in criu_dir.glob("pagemap-*.img"):
        with open(pm, "rb") as f:
            for e in images.load(f, pretty=False)["entries"][1:]:
                total += e.get("nr_pages") or e["compat_nr_pages"]
    return total


def test_zero_pages_are_left_out_and_memory_restores_the_same(tmp_path, cleanup_pids):
    pid, port = _start(tmp_path)
    cleanup_pids.append(pid)
    before = ask("127.0.0.1", port)
    dense, thin = tmp_path / "dense", tmp_path / "thin"
    # the memory file left out: these are CRIU's own page images (test_memfile.py has both)
    snapshotctl(
        "checkpoint",
        "--pid",
        str(pid),
        "--output",
        str(dense),
        "--leave-running",
        "--keep-zero-pages",
        "--no-split-memory",
    )
    out = snapshotctl(
        "checkpoint", "--pid", str(pid), "--output", str(thin), "--json", "--no-split-memory"
    )
    assert (
        json.loads(out.stdout)["sizeBytes"]
        < json.loads(snapshotctl("inspect", str(dense), "--json").stdout)["sizeBytes"]
    )
    # the workload zeroed 2 MiB in one block and every third page of 4 MiB
    assert _page_bytes(dense) - _page_bytes(thin) >= (2 << 20) + (4 << 20) // 3 - 4096
    # the page file holds exactly the pages the pagemap lists
    assert _pagemap_pages(thin / "criu") * sparse.PAGE == _page_bytes(thin)

    rpid, report = restore_cli(thin, tmp_path)
    cleanup_pids.append(rpid)
    assert report["outcome"] == "restored"
    after = ask("127.0.0.1", port)
    assert after["anon"] == before["anon"]
    # the file mapping's zeroed page stayed zero: it was not dropped (it would read as the
    # file's bytes)
    assert after["file"] == before["file"]


def test_an_image_without_zero_pages_is_left_as_it_is(tmp_path, cleanup_pids):
    """A second pass finds nothing to drop and rewrites nothing."""
    pid, port = _start(tmp_path)
    cleanup_pids.append(pid)
    ask("127.0.0.1", port)
    art = tmp_path / "art"
    snapshotctl("checkpoint", "--pid", str(pid), "--output", str(art))
    pages = {p: p.stat().st_mtime_ns for p in (art / "criu").glob("page*.img")}
    result = sparse.elide_zero_pages(art / "criu")
    assert result.dropped == 0 and result.pages > 0
    assert {p: p.stat().st_mtime_ns for p in pages} == pages


def _tree_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


def test_the_page_file_is_compacted_in_place_on_a_nearly_full_store(tmp_path, cleanup_pids):
    """The zero-page step writes no second copy of the page image: a store with room for the
    dense dump and a little more still takes the checkpoint (a copy beside the old file
    needed the kept pages twice over and failed with ENOSPC), and the result restores."""
    pid, port = _start(tmp_path)
    cleanup_pids.append(pid)
    before = ask("127.0.0.1", port)
    dense = tmp_path / "dense"
    snapshotctl(
        "checkpoint",
        "--pid",
        str(pid),
        "--output",
        str(dense),
        "--leave-running",
        "--keep-zero-pages",
    )
    # room for the dense artifact and 1 MiB: less than the kept pages a copy would need
    kept = _page_bytes(dense) - (2 << 20) - (4 << 20) // 3
    assert kept > (2 << 20), "the workload's page image is too small for this test"
    store = tmp_path / "store"
    store.mkdir()
    size = _tree_bytes(dense) + (1 << 20)
    opts = f"size={size},mode=0755"
    subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "snapshot-test", str(store)], check=True)
    try:
        snapshotctl("checkpoint", "--pid", str(pid), "--output", str(store / "thin"))
        assert _pagemap_pages(store / "thin" / "criu") * sparse.PAGE == _page_bytes(store / "thin")
        rpid, report = restore_cli(store / "thin", tmp_path)
        cleanup_pids.append(rpid)
        assert report["outcome"] == "restored"
        assert ask("127.0.0.1", port)["anon"] == before["anon"]
    finally:
        subprocess.run(["umount", "-l", str(store)], check=False)
