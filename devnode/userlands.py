"""Other Linux userlands to install onto: a Debian release's essential packages as a root
tree (mmdebstrap, from Debian's own archive), cached as a tarball beside the other tools and
unpacked per test. Debian 11 stands for the old glibc of Ubuntu 22.04, RHEL 9 and AL2023
(2.31-2.35); Debian 13 for a host like this one."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

CACHE = Path(os.environ.get("SNAPSHOT_USERLANDS", "/var/cache/snapshot-tools/userlands"))


def missing() -> str | None:
    if shutil.which("mmdebstrap") is None:
        return "mmdebstrap is not installed (apt-get install mmdebstrap)"
    return None


def unpack(suite: str, dest: Path, include: tuple[str, ...] = ()) -> Path:
    """The essential packages of Debian ``suite`` (and ``include``) as a root tree at
    ``dest`` (built once, ~100 MB, ~15 s; then unpacked from the cache)."""
    name = "-".join((suite, "essential", *include))
    tar = CACHE / f"{name}.tar"
    if not tar.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = CACHE / f".{name}.part.tar"  # mmdebstrap's format is its suffix
        extra = [f"--include={','.join(include)}"] if include else []
        # no mirror given: mmdebstrap's default, Debian's own archive
        p = subprocess.run(
            [
                "mmdebstrap",
                "--variant=essential",
                "--mode=root",
                "--quiet",
                *extra,
                suite,
                str(tmp),
            ],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        if p.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise RuntimeError(f"mmdebstrap {suite}: {p.stderr.strip()[-2000:]}")
        tmp.rename(tar)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tar) as t:
        t.extractall(dest, filter="fully_trusted")  # our own build, with device nodes
    return dest
