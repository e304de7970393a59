"""mount(2) and umount2(2) with containerd-style option lists (overlay, bind), for the shim's
rootfs and the engine's private image directories; and the propagation of the mount that
holds a path, read from mountinfo (the node agent's HostToContainer mounts need shared)."""

from __future__ import annotations

import ctypes
import os
import re

_libc = ctypes.CDLL(None, use_errno=True)
MS_RDONLY, MS_BIND, MS_REC, MNT_DETACH = 0x1, 0x1000, 0x4000, 0x2
_FLAGS = {"ro": MS_RDONLY, "bind": MS_BIND, "rbind": MS_BIND | MS_REC}
_IGNORED = {"rw", "defaults"}


def parse_options(options: list[str]) -> tuple[int, str]:
    """Split mount options into mount(2) flags and the data string."""
    flags, data = 0, []
    for o in options:
        if o in _FLAGS:
            flags |= _FLAGS[o]
        elif o not in _IGNORED:
            data.append(o)
    return flags, ",".join(data)


def mount(type_: str, source: str, target: str, options: list[str]) -> None:
    flags, data = parse_options(options)
    fstype = None if flags & MS_BIND else type_
    if (
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        )
        != 0
    ):
        err = ctypes.get_errno()
        raise OSError(err, f"mount {type_} {source} on {target}: {os.strerror(err)}")
    if flags & MS_BIND and flags & MS_RDONLY:  # a bind mount only becomes read-only on remount
        _libc.mount(None, target.encode(), None, MS_BIND | MS_RDONLY | 0x20, None)


def unmount(target: str) -> None:
    if _libc.umount2(target.encode(), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (22, 2):  # EINVAL: not mounted; ENOENT: gone
            raise OSError(err, f"umount {target}: {os.strerror(err)}")


#: characters with a meaning inside overlayfs's option string (separators and its escape)
_OVERLAY_SPECIAL = set(":,\\\n=")


def overlay_option(key: str, path: str | os.PathLike) -> str:
    """``key=path`` for an overlay mount. A path holding one of overlayfs's separators would
    change the mount (``:`` adds a lower layer, ``,`` another option), so it is refused
    rather than escaped: kernels differ in the escapes they honour."""
    text = os.fspath(path)
    if bad := sorted(_OVERLAY_SPECIAL & set(text)):
        raise OSError(
            22, f"{key} path {text!r} contains {''.join(bad)!r}, unusable in an overlay mount"
        )
    return f"{key}={text}"


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_of(path: str | os.PathLike, mountinfo: str = "/proc/self/mountinfo") -> tuple[str, str]:
    """The mount point that holds ``path`` (the topmost of the deepest) and its propagation:
    ``shared``, ``slave``, ``shared,slave``, ``private`` or ``unbindable``. ``mountinfo`` is
    whose mount namespace to read: ``/proc/1/mountinfo`` is the host's from a pod with
    ``hostPID``."""
    want = os.path.normpath(os.fspath(path))
    best, mode = "/", "private"
    with open(mountinfo) as f:
        for line in f:
            fields = line.split()
            target = _unescape(fields[4])
            inside = want == target or want.startswith(target.rstrip("/") + "/")
            if not inside or len(target) < len(best):
                continue
            tags = fields[6 : fields.index("-")]
            kinds = [
                k
                for k, tag in (("shared", "shared:"), ("slave", "master:"))
                if any(t.startswith(tag) for t in tags)
            ]
            best = target
            mode = ",".join(kinds) or ("unbindable" if "unbindable" in tags else "private")
    return best, mode


def propagation_problem(
    path: str | os.PathLike, mountinfo: str = "/proc/self/mountinfo"
) -> str | None:
    """Why a container cannot mount ``path`` with ``mountPropagation: HostToContainer``
    (containerd refuses: "is not a shared or slave mount"), or None when it can."""
    target, mode = mount_of(path, mountinfo)
    if "shared" in mode or "slave" in mode:
        return None
    return (
        f"{os.fspath(path)} is on mount {target}, whose propagation is {mode}: containers that "
        "mount it with HostToContainer (the node agent) cannot start. Make it shared "
        f"(`mount --make-rshared {target}`; systemd hosts have / shared by default)"
    )


def remove_tree(path: str | os.PathLike) -> None:
    """Remove a directory that may have mounts under it (a restore's images view, left by a
    process killed mid-way): each is detached first, deepest first, so nothing under it is
    deleted through a mount and no mount outlives the directory."""
    import shutil

    top = os.path.normpath(os.fspath(path))
    with open("/proc/self/mountinfo") as f:
        under = [_unescape(ln.split()[4]) for ln in f]
    for target in sorted(
        (t for t in under if t.startswith(top + "/") or t == top), key=len, reverse=True
    ):
        unmount(target)
    shutil.rmtree(top, ignore_errors=True)
