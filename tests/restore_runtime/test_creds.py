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
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
]


def spec(caps=DEFAULT_CAPS, uid=1000, gid=1000, nnp=True, seccomp=True, apparmor=None):
    sets = {v: list(caps) for v in ("bounding", "effective", "permitted")}
    process = {
        "user": {"uid": uid, "gid": gid, "additionalGids": [5]},
        "capabilities": sets,
        "noNewPrivileges": nnp,
    }
    if apparmor:
        process["apparmorProfile"] = apparmor
    return {
        "process": process,
        "linux": {"seccomp": {"defaultAction": "SCMP_ACT_ERRNO"}} if seccomp else {},
    }


def thread(caps=DEFAULT_CAPS, uid=1000, gid=1000, groups=(5,), nnp=True, seccomp=2, lsm=""):
    """A thread as a cold start of ``spec`` leaves it: root holds ``caps``, any other uid
    none but its bounding set (its exec dropped them)."""
    bits = mask(caps)
    held = bits if uid == 0 else 0
    sets = {"cap_bnd": bits, "cap_prm": held, "cap_eff": held, "cap_inh": 0, "cap_amb": 0}
    return Creds("core-1.img", (uid,) * 4, (gid,) * 4, tuple(groups), sets, nnp, seccomp, lsm)


def test_the_specs_own_credentials_pass():
    assert check([thread()], spec()) == []
    assert check([thread(uid=0, gid=0, groups=())], spec(uid=0, gid=0)) == []
    assert check([thread(caps=[], uid=0)], spec(uid=0)) == [], "fewer capabilities are fine"


@pytest.mark.parametrize("key", list(SETS))
def test_capabilities_beyond_the_bounding_set(key):
    t = thread(uid=0)
    t.caps[key] |= mask(["CAP_SYS_ADMIN", "CAP_SYS_MODULE"])
    (problem,) = check([t], spec(uid=0))
    assert SETS[key] in problem and "CAP_SYS_ADMIN" in problem and "CAP_SYS_MODULE" in problem
    assert "exceed the container's bounding set" in problem


def test_a_root_checkpoint_into_a_non_root_spec():
    """Isolation round 2, attack 5: containerd lists CAP_SETUID/SETGID for every uid, which
    counted as a grant, so a root dump restored as root with 14 capabilities into a
    ``runAsUser: 1000`` pod; a cold start of it runs as 1000 with none."""
    problems = check([thread(uid=0, gid=0, groups=(0,))], spec(uid=1000))
    assert any("uids [0, 0, 0, 0], the container runs as 1000" in p for p in problems), problems
    assert any("gids [0, 0, 0, 0]" in p for p in problems), problems
    assert any("effective capabilities" in p and "CAP_SETUID" in p for p in problems), problems
    # uid 1000 with capabilities it could not have kept across its exec
    t = thread()
    t.caps["cap_eff"] = t.caps["cap_prm"] = mask(["CAP_NET_RAW"])
    assert "ambient none" in check([t], spec())[0]
    # what the spec grants in its ambient set a non-root process does keep
    amb = spec()
    amb["process"]["capabilities"]["ambient"] = ["CAP_NET_RAW", "CAP_SETUID"]
    assert check([t], amb) == []
    t0 = thread(uid=0, caps=[])
    assert not any("uids" in p for p in check([t0], amb)), "CAP_SETUID granted: uid may change"


def test_uid_and_groups_only_with_setuid_setgid():
    no_set = [c for c in DEFAULT_CAPS if c not in ("CAP_SETUID", "CAP_SETGID")]
    root = spec(caps=no_set, uid=0, gid=0)
    assert check([thread(caps=no_set, uid=0, gid=0, groups=())], root) == []
    assert "uids [7, 7, 7, 7]" in check([thread(caps=no_set, uid=7, gid=0, groups=())], root)[0]
    assert "groups [9]" in check([thread(caps=no_set, uid=0, gid=0, groups=(9,))], root)[0]
    # a root spec with CAP_SETUID/CAP_SETGID: the process could have switched itself
    assert check([thread(uid=1000, groups=(0,))], spec(uid=0, gid=0)) == []


def test_no_new_privs_seccomp_and_lsm():
    assert "no_new_privs is cleared" in check([thread(nnp=False)], spec())[0]
    assert "no seccomp filter" in check([thread(seccomp=0)], spec())[0]
    assert check([thread(nnp=False, seccomp=0)], spec(nnp=False, seccomp=False)) == []
    assert (
        "LSM profile 'unconfined'"
        in check([thread(lsm="unconfined")], spec(apparmor="cri-default"))[0]
    )
    assert check([thread(lsm="apparmor:cri-default (enforce)")], spec(apparmor="cri-default")) == []
    # finding 11: an image without a profile restores unconfined into a spec that has one
    assert "LSM profile 'none'" in check([thread()], spec(apparmor="cri-default"))[0]
    assert "the container's is 'none'" in check([thread(lsm="apparmor:x (enforce)")], spec())[0]
    assert check([thread(lsm="unconfined")], spec()) == []


def test_load_reads_core_images_as_criu_writes_them(tmp_path):
    """The loader parses the protobuf entries itself (pycriu's dicts were 1.4 s of a large
    restore); an image written by pycriu reads back the same credentials."""
    images = pytest.importorskip("pycriu.images", reason="python3-pycriu is not installed")
    entry = {
        "mtype": "X86_64",
        "thread_core": {
            "futex_rla": 0,
            "futex_rla_len": 0,
            "seccomp_mode": "filter",
            "creds": {
                "uid": 1000,
                "gid": 1000,
                "euid": 1000,
                "egid": 1000,
                "suid": 1000,
                "sgid": 1000,
                "fsuid": 1000,
                "fsgid": 1000,
                "cap_inh": [0, 0],
                "cap_prm": [1 << 5, 0],
                "cap_eff": [1 << 5, 0],
                "cap_bnd": [0xFFFFFFFF, 0x1FF],
                "secbits": 0,
                "groups": [1000, 27],
                "no_new_privs": 1,
            },
        },
    }
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
