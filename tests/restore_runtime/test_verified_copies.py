"""What the restore uses is what it hashed (isolation round 2, attack 3, on a store that
another node's root can write, such as a shared NFS export): every file but the pages is
read once into the restore's work directory, hashed there, and CRIU, the credentials check,
the memory index and the rootfs diff read only those copies.

Cases, with real CRIU: core images and the memory index swapped in the store after
the engine verified them (the moment chosen by the test, not by luck) change nothing: the
restored counter continues with its state; a rootfs diff swapped right before it is unpacked
into a new root (the shim's runc path) unpacks what was hashed; a copy that does not match is
refused before anything runs, and says which file."""

from __future__ import annotations

import os

import pytest

from api.manifest import CHUNK_SIZE, ROOTFS_DIFF_NAME
from restore_runtime.artifact.pack import describe_files, write_manifest
from restore_runtime.artifact.rootfs_pack import pack_upper
from restore_runtime.artifact.verify import load_manifest
from restore_runtime.errors import VerificationError
from restore_runtime.executor import restore as restore_mod
from restore_runtime.executor.restore import RestoreRequest, restore
from restore_runtime.executor.tree_access import CriuRestorer
from tests.conftest import requires_criu
from tests.helpers import ask, up_to_the_tree

pytestmark = [requires_criu, pytest.mark.root]


def swap(path, data: bytes) -> None:
    """Replace ``path`` by rename, as a writer of the store would between two reads."""
    tmp = path.with_name(path.name + ".swap")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def test_images_swapped_after_the_check_are_not_what_criu_reads(artifact, cleanup_pids):
    art, port = artifact

    class SwapFirst(CriuRestorer):
        """Swaps the store's files once they were checked, right before CRIU reads."""

        def restore(self, images, work, netns):
            for core in (art / "criu").glob("core-*.img"):
                swap(core, b"\0" * core.stat().st_size)  # garbage CRIU cannot restore from
            for index in art.glob("memory/index.json"):
                swap(index, b'{"ranges": []}')
            return super().restore(images, work, netns)

    report = restore(RestoreRequest(artifact=art), SwapFirst())
    cleanup_pids.append(report.pid)
    assert ask("127.0.0.1", port)["count"] == "4", "restored from the bytes it checked"


def test_a_changed_core_image_is_refused_by_name(artifact):
    art, _ = artifact
    core = next((art / "criu").glob("core-*.img"))
    data = bytearray(core.read_bytes())
    data[-1] ^= 0xFF
    swap(core, bytes(data))
    with pytest.raises(VerificationError, match=f"modified: criu/{core.name}"):
        up_to_the_tree(RestoreRequest(artifact=art))


def test_a_rootfs_diff_swapped_after_the_check_is_not_what_is_unpacked(
    artifact, tmp_path, monkeypatch
):
    """Isolation round 3, a test that checked less: only core images and the memory index
    were swapped; the rootfs diff, which the shim's runc path unpacks into the new
    container's root, never was. The store's diff is swapped for one with other content at
    the worst moment (after the check, right before the unpack, by a hook on the unpack):
    the new root gets the content that was hashed."""
    art, _ = artifact
    upper = tmp_path / "upper"
    upper.mkdir()
    (upper / "hello").write_text("checked")
    pack_upper(str(upper), art / ROOTFS_DIFF_NAME)
    m = load_manifest(art)
    m.files += describe_files(art, CHUNK_SIZE, only=frozenset({ROOTFS_DIFF_NAME}))
    write_manifest(art, m, None)
    (upper / "hello").write_text("swapped")
    evil = tmp_path / "evil.tar"
    pack_upper(str(upper), evil)
    unpack = restore_mod.apply_rootfs_diff

    def swapped_first(verified, rootfs):
        swap(art / ROOTFS_DIFF_NAME, evil.read_bytes())
        return unpack(verified, rootfs)

    monkeypatch.setattr(restore_mod, "apply_rootfs_diff", swapped_first)
    root = tmp_path / "newroot"
    root.mkdir()
    up_to_the_tree(RestoreRequest(artifact=art, rootfs=root))
    assert (art / ROOTFS_DIFF_NAME).read_bytes() == evil.read_bytes(), "the store was swapped"
    assert (root / "hello").read_text() == "checked"
