"""The restore's work directory: made fresh (what a dead restore of the same container left
is removed first), the private view of the images CRIU restores from, and CRIU's log kept
when the restore fails (the rest goes with the directory)."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
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


def stage_images(src: Path, verified: Path, work: Path) -> Path:
    """A private, writable view of the artifact's images: an overlay mount with the artifact
    as its read-only lower layer and the verified copies of its core images (``verified``)
    as the upper one, so CRIU reads the pages from the artifact and everything else from the
    bytes that were hashed. CRIU writes its stats there and rebinding replaces files.img,
    without touching the artifact or copying the pages. The view holds real files, not
    symlinks: runc's CRIU opens images after entering the container's root, where a symlink
    to the artifact's host path would not resolve. Hard links (pages) and copies (the rest)
    are the fallback where overlay is unavailable."""
    view, scratch = work / "images", work / "ovl-work"
    for d in (view, scratch, verified):
        d.mkdir(parents=True, exist_ok=True)
    try:
        layers = (("lowerdir", src), ("upperdir", verified), ("workdir", scratch))
        opts = [mounts.overlay_option(k, d) for k, d in layers]
        mounts.mount("overlay", "overlay", str(view), opts)
    except OSError as e:
        log.warning("overlay over %s failed (%s); linking the images instead", src, e)
        for f in src.iterdir():
            if (verified / f.name).exists():
                shutil.copyfile(verified / f.name, view / f.name)
                continue
            try:
                os.link(f, view / f.name)
            except OSError:
                shutil.copyfile(f, view / f.name)
    return view


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
