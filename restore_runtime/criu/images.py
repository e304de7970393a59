"""Rewriting CRIU images with pycriu (Debian's python3-pycriu), never a hand-written parser.

Network rebinding: a replica restores at a new pod IP, so every inet socket bound to (or
connected from) the old pod IP is rewritten to the new one before ``criu restore``. Listening
sockets then come back on the new address; established connections are closed by
``--tcp-close`` anyway.

Host name: CRIU sets the host name it dumped in the UTS namespace it restores into, and a
container restored into a pod joins its sandbox's, which every container of the pod shares.
The images are given the new pod's name first, so the pod keeps it.

Network lock: CRIU blocks the namespace it restores into with iptables rules while it
works, to shield TCP connections it brings back in repair mode. A restore reads the method
from the dump's inventory (its own ``--network-lock`` option is ignored), and ours restore no
connection (``--tcp-close``), so the inventory is given CRIU's ``skip``.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from pathlib import Path

from ..errors import SnapshotError

AF_INET, AF_INET6 = socket.AF_INET, socket.AF_INET6
FILES_IMG = "files.img"
INVENTORY_IMG = "inventory.img"
#: CRIU's NETWORK_LOCK_SKIP (enum NETWORK_LOCK_METHOD, criu/include/cr_options.h)
NETWORK_LOCK_SKIP = 2


def _pycriu_images():
    try:
        from pycriu import images
    except ImportError as e:  # pragma: no cover - depends on the system package
        raise SnapshotError(
            "pycriu is not importable: install Debian's python3-pycriu (make setup)"
        ) from e
    return images


def preload() -> None:
    """Import pycriu's image modules now, when a restore is coming: the import is ~80
    protobuf modules (0.05 s on a GPU node), and the first to pay it was the restore's
    credentials check."""
    _pycriu_images()


def encode_addr(ip: str) -> list[int]:
    """An address as CRIU stores it: network-order bytes read as host (little-endian) u32s."""
    addr = ipaddress.ip_address(ip)
    if addr.version == 4:
        return list(struct.unpack("<I", addr.packed))
    return list(struct.unpack("<4I", addr.packed))


def _rewrite(out_dir: Path, name: str, data: dict) -> None:
    """``name`` written into ``out_dir``: the restore's own directory of verified copies,
    never a view that merges the store's names (a link planted there, ``.NAME.tmp`` to a
    host file, would be followed by a plain open). The temporary is made new (``O_EXCL``,
    no link followed) through a descriptor of that directory."""
    images = _pycriu_images()
    tmp = f".{name}.tmp"
    dir_fd = os.open(out_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with open(os.open(tmp, flags, 0o600, dir_fd=dir_fd), "wb") as f:
            images.dump(data, f)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def rename_host(images_dir: Path, out_dir: Path, hostname: str) -> str | None:
    """Write the UTS namespace's image into ``out_dir`` with host name ``hostname``; return
    the name it had, or None when it had that one already, or the tree kept no UTS
    namespace of its own (no image). There is at most one: CRIU dumps nested namespaces of
    the mount, network and cgroup kinds only (``CLONE_SUBNS``) and refuses a tree whose
    processes made UTS namespaces of their own."""
    images = _pycriu_images()
    for path in sorted(images_dir.glob("utsns-*.img")):
        with open(path, "rb") as f:
            data = images.load(f)
        entry = data["entries"][0]
        old = entry.get("nodename")
        if old == hostname:
            return None
        entry["nodename"] = hostname
        _rewrite(out_dir, path.name, data)
        return old
    return None


def skip_network_lock(images_dir: Path, out_dir: Path) -> bool:
    """Write the inventory into ``out_dir`` with CRIU's network lock skipped; False when the
    dump had skipped it already. The lock would guard nothing in our restores, which close
    every established connection, while it blocked the whole pod's traffic (its sidecars
    too) and ran iptables four to six times (40-80 ms of CRIU's 0.2 s on the 2-core VM)."""
    with open(images_dir / INVENTORY_IMG, "rb") as f:
        data = _pycriu_images().load(f)
    entry = data["entries"][0]
    if entry.get("network_lock_method") == NETWORK_LOCK_SKIP:
        return False
    entry["network_lock_method"] = NETWORK_LOCK_SKIP
    _rewrite(out_dir, INVENTORY_IMG, data)
    return True


def load_files(images_dir: Path) -> dict:
    images = _pycriu_images()
    with open(images_dir / FILES_IMG, "rb") as f:
        return images.load(f)


def rebind(images_dir: Path, out_dir: Path, mapping: dict[str, str]) -> int:
    """Write ``out_dir/files.img`` with every socket address in ``mapping`` (old -> new IP)
    rewritten; return how many addresses changed. The source images are not modified."""
    enc: dict[tuple[int, tuple[int, ...]], list[int]] = {}
    for old, new in mapping.items():
        o, n = ipaddress.ip_address(old), ipaddress.ip_address(new)
        if o.version != n.version:
            raise SnapshotError(f"cannot rebind {old} to {new}: address families differ")
        fam = AF_INET if o.version == 4 else AF_INET6
        enc[(fam, tuple(encode_addr(old)))] = encode_addr(new)
    data = load_files(images_dir)
    changed = 0
    for e in data["entries"]:
        isk = e.get("isk")
        if not isk:
            continue
        for key in ("src_addr", "dst_addr"):
            new = enc.get((isk.get("family"), tuple(isk.get(key, []))))
            if new is not None:
                isk[key] = new
                changed += 1
    _rewrite(out_dir, FILES_IMG, data)
    return changed
