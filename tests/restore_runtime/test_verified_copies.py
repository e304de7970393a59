"""What the restore uses is what it hashed (isolation round 2, attack 3, on a store that
another node's root can write, such as a shared NFS export): every file but the pages is
read once into the restore's work directory, hashed there, and CRIU, the credentials check,
the memory index and the rootfs diff read only those copies.

Cases, with real CRIU: core images and the memory index swapped in the store after
``prepare`` verified them (the moment chosen by the test, not by luck) change nothing: the
restored counter continues with its state; a copy that does not match is refused before
anything runs, and says which file."""

from __future__ import annotations

import os

import pytest

from restore_runtime.errors import VerificationError
from restore_runtime.executor.checkpoint import CheckpointRequest, checkpoint
from restore_runtime.executor.restore import RestoreRequest, prepare
from restore_runtime.executor.tree_access import criu_restore
from tests.conftest import requires_criu
from tests.helpers import ask, start_counter

pytestmark = [requires_criu, pytest.mark.root]


def swap(path, data: bytes) -> None:
    """Replace ``path`` by rename, as a writer of the store would between two reads."""
    tmp = path.with_name(path.name + ".swap")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@pytest.fixture
def artifact(tmp_path, cleanup_pids):
    pid, port = start_counter(tmp_path)
    cleanup_pids.append(pid)
    for _ in range(3):
        ask("127.0.0.1", port)
    art = tmp_path / "art"
    checkpoint(CheckpointRequest(output=art, pid=pid))
    return art, port


def test_images_swapped_after_the_check_are_not_what_criu_reads(artifact, cleanup_pids):
    art, port = artifact
    r = prepare(RestoreRequest(artifact=art))
    try:
        for core in (art / "criu").glob("core-*.img"):
            swap(core, b"\0" * core.stat().st_size)  # garbage CRIU cannot restore from
        for index in art.glob("memory/index.json"):
            swap(index, b'{"ranges": []}')
        pid = criu_restore(r.images, r.work, r.netns)
        cleanup_pids.append(pid)
        r.finish(pid)
    finally:
        r.close()
    assert ask("127.0.0.1", port)["count"] == "4", "restored from the bytes it checked"


def test_a_changed_core_image_is_refused_by_name(artifact):
    art, _ = artifact
    core = next((art / "criu").glob("core-*.img"))
    data = bytearray(core.read_bytes())
    data[-1] ^= 0xFF
    swap(core, bytes(data))
    with pytest.raises(VerificationError, match=f"modified: criu/{core.name}"):
        prepare(RestoreRequest(artifact=art)).close()
