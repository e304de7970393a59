"""No privilege from images: CRIU runs as root and gives every restored thread the
credentials stored in its ``core-*.img`` (``runc restore`` does not re-apply the OCI spec's),
so a crafted image could come back with every capability. Before a restore, every thread's
credentials are checked against what the container's OCI spec grants, and the restore is
refused if any asks for more than a cold start of the same spec could ever have:

- capabilities: each of the five sets within the spec's bounding set (the ceiling no process
  of the container can exceed, even by exec); for a uid other than 0, the effective,
  permitted and ambient sets within the spec's ambient set (all such a process keeps across
  its exec: a root checkpoint never restores as root into a ``runAsUser: 1000`` pod);
- uid/gid and supplementary groups: the spec's, unless the process is granted CAP_SETUID /
  CAP_SETGID (then it could have changed them itself);
- no_new_privs: set if the spec sets it (it can never be cleared);
- seccomp: a filter on every thread if the spec has a profile;
- LSM profile: the spec's; none only where the spec has none.

The images are decoded with pycriu; the decision is a pure function of the decoded
credentials and the spec (``check``), tested without CRIU."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError

from ..errors import SnapshotError
from .images import _pycriu_images

#: Linux capability numbers (include/uapi/linux/capability.h)
CAPS = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
]
_BIT = {f"CAP_{name}": i for i, name in enumerate(CAPS)}
SETS = {
    "cap_inh": "inheritable",
    "cap_prm": "permitted",
    "cap_eff": "effective",
    "cap_bnd": "bounding",
    "cap_amb": "ambient",
}
SECCOMP_FILTER = 2


@dataclass(frozen=True)
class Creds:
    """One restored thread's credentials, as the images give them."""

    where: str  # e.g. "core-42.img"
    uids: tuple[int, ...]
    gids: tuple[int, ...]
    groups: tuple[int, ...]
    caps: dict[str, int]  # cap_inh/cap_prm/cap_eff/cap_bnd/cap_amb -> bitmask
    no_new_privs: bool
    seccomp_mode: int
    lsm_profile: str


def mask(names: list[str] | None) -> int:
    out = 0
    for n in names or []:
        if n in _BIT:
            out |= 1 << _BIT[n]
    return out


def names(bits: int) -> list[str]:
    return [f"CAP_{c}" for i, c in enumerate(CAPS) if bits >> i & 1] + (
        [f"cap#{i}" for i in range(len(CAPS), 64) if bits >> i & 1]
    )


def _words(ws: list[int]) -> int:
    return sum((w & 0xFFFFFFFF) << (32 * i) for i, w in enumerate(ws or []))


def _core_entries(path: Path) -> Iterator[Any]:
    """The entries of one ``core-*.img`` as pycriu's protobuf messages. Parsed directly: the
    dicts pycriu's ``images.load`` builds cost milliseconds per thread (every register set
    becomes Python objects), 1.4 s for a 6.65 B GPU worker's threads on the restore path."""
    images = _pycriu_images()
    with open(path, "rb") as f:
        try:
            (kind,) = struct.unpack("i", f.read(4))
            if kind in (images.magic.by_name["IMG_COMMON"], images.magic.by_name["IMG_SERVICE"]):
                (kind,) = struct.unpack("i", f.read(4))
            if kind != images.magic.by_name["CORE"]:
                raise SnapshotError(f"{path.name} is not a core image")
            while head := f.read(4):
                (size,) = struct.unpack("i", head)
                entry = images.pb.core_entry()
                entry.ParseFromString(f.read(size))
                yield entry
        except (struct.error, DecodeError) as e:
            raise SnapshotError(f"{path.name} does not decode: {e}") from e


def load(images_dir: Path) -> list[Creds]:
    """Every thread's credentials from the ``core-*.img`` files of a CRIU image directory.
    Absent fields read as zero, as in the kernel's own defaults (uid 0, no capabilities)."""
    out = []
    for path in sorted(images_dir.glob("core-*.img")):
        for entry in _core_entries(path):
            tc = entry.thread_core
            c = tc.creds
            out.append(
                Creds(
                    where=path.name,
                    uids=(c.uid, c.euid, c.suid, c.fsuid),
                    gids=(c.gid, c.egid, c.sgid, c.fsgid),
                    groups=tuple(c.groups),
                    caps={k: _words(list(getattr(c, k))) for k in SETS},
                    no_new_privs=bool(c.no_new_privs),
                    seccomp_mode=int(tc.seccomp_mode),
                    lsm_profile=str(c.lsm_profile),
                )
            )
    return out


def _confined(profile: str) -> bool:
    return bool(profile) and not profile.startswith("unconfined")


def check(threads: list[Creds], spec: dict[str, Any]) -> list[str]:
    """Why the images ask for more than ``spec`` (an OCI runtime spec) grants; [] if not."""
    process = spec.get("process") or {}
    caps = process.get("capabilities") or {}
    given = {k: mask(caps.get(v)) for k, v in SETS.items()}
    ceiling = given["cap_bnd"]
    user = process.get("user") or {}
    uid, gid = int(user.get("uid", 0)), int(user.get("gid", 0))
    groups = {gid, *(int(g) for g in user.get("additionalGids") or [])}
    # What a cold start's process can hold: root refills its permitted set from the bounding
    # set at every exec; any other uid keeps only the spec's ambient set across its exec
    # (containerd lists its defaults as effective and permitted for every uid).
    granted = ceiling if uid == 0 else given["cap_amb"] & ceiling
    limits = {
        "cap_bnd": ceiling,
        "cap_inh": ceiling,
        "cap_prm": granted,
        "cap_eff": granted,
        "cap_amb": granted,
    }
    can_setuid = bool(granted >> _BIT["CAP_SETUID"] & 1)
    can_setgid = bool(granted >> _BIT["CAP_SETGID"] & 1)
    nnp = bool(process.get("noNewPrivileges"))
    seccomp = bool((spec.get("linux") or {}).get("seccomp"))
    lsm = process.get("apparmorProfile") or process.get("selinuxLabel") or ""
    problems = []
    for t in threads:
        for key, bits in t.caps.items():
            if not (extra := bits & ~limits[key]):
                continue
            if limits[key] == ceiling:
                problems.append(
                    f"{t.where}: {SETS[key]} capabilities {names(extra)} exceed the "
                    "container's bounding set"
                )
            else:
                problems.append(
                    f"{t.where}: {SETS[key]} capabilities {names(extra)}, the "
                    f"container runs as uid {uid} with ambient "
                    f"{names(granted) or 'none'}"
                )
        if not can_setuid and set(t.uids) != {uid}:
            problems.append(f"{t.where}: uids {list(t.uids)}, the container runs as {uid}")
        if not can_setgid and (set(t.gids) != {gid} or not set(t.groups) <= groups):
            problems.append(
                f"{t.where}: gids {list(t.gids)} / groups {list(t.groups)}, the "
                f"container runs as {gid} with groups {sorted(groups)}"
            )
        if nnp and not t.no_new_privs:
            problems.append(f"{t.where}: no_new_privs is cleared; the container sets it")
        if seccomp and t.seccomp_mode != SECCOMP_FILTER:
            problems.append(f"{t.where}: no seccomp filter; the container has a profile")
        # the spec's profile, or none on both sides: an image without one would restore
        # unconfined into a spec that has one
        same = lsm in t.lsm_profile if lsm else not _confined(t.lsm_profile)
        if not same or (lsm and not _confined(t.lsm_profile)):
            problems.append(
                f"{t.where}: LSM profile {t.lsm_profile or 'none'!r}, the "
                f"container's is {lsm or 'none'!r}"
            )
    return sorted(set(problems))
