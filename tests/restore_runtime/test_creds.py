"""No privilege from images (restore_runtime/criu/creds.py): the decision, as a pure function
of decoded credentials and an OCI spec. The CRI test (tests/shim/test_restore_isolation.py)
raises capabilities in real images.

Cases: a thread with the spec's own credentials passes; each way of asking for more is
named: capabilities beyond the bounding set (every set, including ambient), another uid or
group without CAP_SETUID/CAP_SETGID (allowed with them), no_new_privs cleared, seccomp
dropped, another LSM profile."""

from __future__ import annotations

import pytest

from restore_runtime.criu import creds
from restore_runtime.criu.creds import SETS, Creds, check, mask
from restore_runtime.errors import SnapshotError

#: containerd's default set for a container
DEFAULT_CAPS = [
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
    "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
]  # fmt: skip


def spec(caps=DEFAULT_CAPS, uid=1000, gid=1000, nnp=True, seccomp=True, apparmor=None):
    sets = {v: list(caps) for v in ("bounding", "effective", "permitted")}
    process = {"user": {"uid": uid, "gid": gid, "additionalGids": [5]},
               "capabilities": sets, "noNewPrivileges": nnp}  # fmt: skip
    if apparmor:
        process["apparmorProfile"] = apparmor
    return {"process": process, "linux": {"seccomp": {"defaultAction": "SCMP_ACT_ERRNO"}}
            if seccomp else {}}  # fmt: skip


def thread(caps=DEFAULT_CAPS, uid=1000, gid=1000, groups=(5,), nnp=True, seccomp=2, lsm=""):
    bits = mask(caps)
    return Creds("core-1.img", (uid,) * 4, (gid,) * 4, tuple(groups),
                 {k: bits if k != "cap_amb" else 0 for k in SETS}, nnp, seccomp, lsm)  # fmt: skip


def test_the_specs_own_credentials_pass():
    assert check([thread()], spec()) == []
    assert check([thread(caps=[])], spec()) == [], "fewer capabilities are fine"


@pytest.mark.parametrize("key", list(SETS))
def test_capabilities_beyond_the_bounding_set(key):
    t = thread()
    t.caps[key] |= mask(["CAP_SYS_ADMIN", "CAP_SYS_MODULE"])
    (problem,) = check([t], spec())
    assert SETS[key] in problem and "CAP_SYS_ADMIN" in problem and "CAP_SYS_MODULE" in problem


def test_uid_and_groups_only_with_setuid_setgid():
    no_set = [c for c in DEFAULT_CAPS if c not in ("CAP_SETUID", "CAP_SETGID")]
    assert "uids [0, 0, 0, 0]" in check([thread(caps=no_set, uid=0)], spec(caps=no_set))[0]
    assert "groups [0]" in check([thread(caps=no_set, groups=(0,))], spec(caps=no_set))[0]
    # with CAP_SETUID/CAP_SETGID the process could have switched itself
    assert check([thread(uid=0, groups=(0,))], spec()) == []


def test_no_new_privs_seccomp_and_lsm():
    assert "no_new_privs is cleared" in check([thread(nnp=False)], spec())[0]
    assert "no seccomp filter" in check([thread(seccomp=0)], spec())[0]
    assert check([thread(nnp=False, seccomp=0)], spec(nnp=False, seccomp=False)) == []
    assert "LSM profile 'unconfined'" in check([thread(lsm="unconfined")],
                                               spec(apparmor="cri-default"))[0]  # fmt: skip
    assert check([thread(lsm="apparmor:cri-default (enforce)")], spec(apparmor="cri-default")) == []


def test_load_reads_core_images_as_criu_writes_them(tmp_path):
    """The loader parses the protobuf entries itself (pycriu's dicts were 1.4 s of a large
    restore); an image written by pycriu reads back the same credentials."""
    images = pytest.importorskip("pycriu.images", reason="python3-pycriu is not installed")
    entry = {"mtype": "X86_64", "thread_core": {
        "futex_rla": 0, "futex_rla_len": 0, "seccomp_mode": "filter",
        "creds": {"uid": 1000, "gid": 1000, "euid": 1000, "egid": 1000, "suid": 1000,
                  "sgid": 1000, "fsuid": 1000, "fsgid": 1000, "cap_inh": [0, 0],
                  "cap_prm": [1 << 5, 0], "cap_eff": [1 << 5, 0], "cap_bnd": [0xFFFFFFFF, 0x1FF],
                  "secbits": 0, "groups": [1000, 27], "no_new_privs": 1}}}  # fmt: skip
    with open(tmp_path / "core-7.img", "wb") as f:
        images.dump({"magic": "CORE", "entries": [entry]}, f)
    (t,) = creds.load(tmp_path)
    assert t.uids == (1000,) * 4 and t.gids == (1000,) * 4 and t.groups == (1000, 27)
    assert t.caps["cap_eff"] == 1 << 5 and t.caps["cap_bnd"] == 0x1FF << 32 | 0xFFFFFFFF
    assert t.no_new_privs and t.seccomp_mode == 2 and t.caps["cap_amb"] == 0


def test_an_image_that_does_not_decode_is_refused(tmp_path):
    pytest.importorskip("pycriu.images", reason="python3-pycriu is not installed")
    (tmp_path / "core-1.img").write_bytes(b"\x00\x01")
    with pytest.raises(SnapshotError):
        creds.load(tmp_path)
