"""The restore's work directory: made fresh (what a dead restore of the same container left
is removed first), the private view of the images CRIU restores from, and CRIU's log kept
when the restore fails (the rest goes with the directory)."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path

from .. import mounts

log = logging.getLogger(__name__)


def make(path: Path | None) -> Path:
    if path is None:
        return Path(tempfile.mkdtemp(prefix="snapshot-restore-"))
    mounts.remove_tree(path)  # what a restore of the same container that died left
    path.mkdir(mode=0o700)
    return path


#: what CRIU itself writes among the images it restores from (its restore's stats file)
CRIU_RESTORE_WRITES = ("stats-restore",)


def stage_images(src: Path, verified: Path, work: Path, pages: list[str]) -> Path:
    """A private, writable view of the artifact's images: an overlay mount with the artifact
    as its read-only lower layer and the verified copies of its core images (``verified``,
    rewritten already) as the upper one, so CRIU reads the pages (``pages``: their names)
    from the artifact and everything else from the bytes that were hashed, without copying
    the pages. The view holds real files, not symlinks: runc's CRIU opens images after
    entering the container's root, where a symlink to the artifact's host path would not
    resolve.

    The store is shared with other nodes, whose root is not trusted: a name planted in it
    after the checks (a link to a host file) shows in the view, and a write to that name
    would follow it. So nothing writes into the view but CRIU, and each name it writes
    exists in the upper layer first (an overlay never writes its lower layer); the lower
    layer is the directory opened once without following links. Where overlay is
    unavailable, the view is a directory of its own holding the verified copies and hard
    links of the listed page images only, each checked to be a regular file."""
    view, scratch = work / "images", work / "ovl-work"
    for d in (view, scratch, verified):
        d.mkdir(parents=True, exist_ok=True)
    for name in CRIU_RESTORE_WRITES:
        with contextlib.suppress(FileExistsError):
            os.close(os.open(verified / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    lower = os.open(src, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        try:
            layers = (("lowerdir", f"/proc/self/fd/{lower}"), ("upperdir", verified))
            opts = [mounts.overlay_option(k, d) for k, d in (*layers, ("workdir", scratch))]
            mounts.mount("overlay", "overlay", str(view), opts)
        except OSError as e:
            log.warning("overlay over %s failed (%s); linking the images instead", src, e)
            _link_view(lower, verified, view, pages)
    finally:
        os.close(lower)
    return view


def _link_view(lower: int, verified: Path, view: Path, pages: list[str]) -> None:
    for f in verified.iterdir():  # the restore's own files
        shutil.copyfile(f, view / f.name)
    for name in pages:
        if (view / name).exists():
            continue
        try:  # the store's entry itself, never where a link in it points
            os.link(name, view / name, src_dir_fd=lower, follow_symlinks=False)
        except OSError:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=lower)
            with open(fd, "rb") as r, open(view / name, "xb") as w:
                shutil.copyfileobj(r, w, 1 << 20)
        if not stat.S_ISREG(os.lstat(view / name).st_mode):
            os.unlink(view / name)
            raise OSError(40, f"the store's {name} is not a regular file")


def keep_log(work: Path, log_dir: Path | None) -> None:
    """A failed restore leaves nothing on the host but CRIU's log: copied to ``log_dir``
    (the shim's per-container directory, removed with the container), or its tail logged."""
    src = work / "restore.log"
    with contextlib.suppress(OSError):
        if log_dir is not None:
            shutil.copyfile(src, log_dir / "criu-restore.log")
        else:
            tail = src.read_text(errors="replace").splitlines()[-40:]
            log.error("CRIU log of the failed restore:\n%s", "\n".join(tail))
