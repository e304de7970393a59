"""Pure CRIU option builders and log parsing (no CRIU needed)."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import pytest

from restore_runtime.criu import options
from restore_runtime.criu.runner import error_lines, own_seconds, version_tuple


def flag_value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_dump_args_defaults():
    a = options.dump_args(options.DumpOptions(pid=42, images_dir=Path("/i"), work_dir=Path("/w")))
    assert a[0] == "dump"
    assert flag_value(a, "--tree") == "42"
    assert flag_value(a, "--images-dir") == "/i"
    assert flag_value(a, "--work-dir") == "/w"
    assert "--tcp-established" in a and "--skip-in-flight" in a and "--leave-running" not in a
    assert flag_value(a, "--ext-mount-map") == "auto"
    assert "--external" not in a


def test_dump_args_leave_running_and_external_netns():
    o = options.DumpOptions(
        pid=1,
        images_dir=Path("/i"),
        work_dir=Path("/w"),
        leave_running=True,
        external_netns_inode=4026532000,
    )
    a = options.dump_args(o)
    assert "--leave-running" in a
    assert flag_value(a, "--external") == "net[4026532000]:extnet"


def test_restore_args():
    o = options.RestoreOptions(
        images_dir=Path("/i"), work_dir=Path("/w"), pidfile=Path("/w/p"), netns_fd=7
    )
    a = options.restore_args(o)
    assert a[0] == "restore"
    assert "--restore-detached" in a and "--tcp-close" in a
    assert flag_value(a, "--pidfile") == "/w/p"
    assert flag_value(a, "--inherit-fd") == "fd[7]:extnet"
    assert flag_value(a, "--root") == "/"
    assert "--inherit-fd" not in options.restore_args(
        options.RestoreOptions(images_dir=Path("/i"), work_dir=Path("/w"), pidfile=Path("/p"))
    )


def test_error_lines_skip_benign_and_keep_errors():
    log = """(00.01) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: x
(00.02) Dumping path for 3 fd via self 13 [/dev/null]
(00.03) Error (criu/files-reg.c:1790): Can't lookup mount=24 for fd=0 path=/dev/null
(00.04) Error (criu/cr-dump.c:1975): Dumping FAILED."""
    assert error_lines(log) == [
        "(00.03) Error (criu/files-reg.c:1790): Can't lookup mount=24 for fd=0 path=/dev/null",
        "(00.04) Error (criu/cr-dump.c:1975): Dumping FAILED.",
    ]


def test_version_tuple():
    assert version_tuple("4.2.1") == (4, 2, 1)
    assert version_tuple("6.18.44-fc-v1098") == (6, 18, 44)


def test_a_mount_criu_cannot_dump_is_named(tmp_path):
    """The driver's squashfs carried in by an rbind stopped a GPU dump with only CRIU's own
    line; the error now names the mount and what to do (lab notes, second day)."""
    from restore_runtime.criu.runner import failure

    log = tmp_path / "dump.log"
    log.write_text(
        "(00.1) Error (criu/mount.c:1100): mnt: FS mnt ./usr/local/nvidia dev 0xfe00010 "
        "root / unsupported id 63\n(00.2) Error (criu/cr-dump.c:2100): Dumping FAILED.\n"
    )
    e = failure("dump (runc checkpoint)", 1, log, [])
    assert e.log_lines[0].startswith("the mount at /usr/local/nvidia (device 0xfe00010")
    assert "a mount of its own" in str(e) and "Dumping FAILED" in str(e)


def test_own_seconds_is_the_last_stamp_of_a_long_log(tmp_path):
    log = tmp_path / "restore.log"
    filler = "".join(f"({i / 1e4:09.6f}) mnt: line {i}\n" for i in range(2000))
    log.write_text(filler + "(00.155518) Running post-resume scripts\n\tRPC\n")
    assert own_seconds(log) == 0.155518
    log.write_text("criu: no stamps here\n")
    assert own_seconds(log) is None
    assert own_seconds(tmp_path / "absent.log") is None


@pytest.mark.root
def test_a_full_file_system_is_named_when_the_log_could_not_say_so(tmp_path):
    """CRIU's log is written beside its images: on a full store the line naming ENOSPC was
    the one it could not write (make test, 2026-12-07: only the benign rlimit line was
    left), and the error said nothing of the cause."""
    from restore_runtime.criu.runner import failure

    store = tmp_path / "store"
    store.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "snapshot-test", str(store)], check=True
    )
    try:
        log = store / "dump.log"
        log.write_text("(00.03) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE\n")
        with contextlib.suppress(OSError), open(store / "fill", "wb", buffering=0) as f:
            while True:
                f.write(b"x" * 65536)
        e = failure("dump (runc checkpoint)", 1, log, [])
        assert "No space left on device" in str(e), e
    finally:
        subprocess.run(["umount", str(store)], check=True)
    roomy = tmp_path / "dump.log"
    roomy.write_text("(00.04) Error (criu/cr-dump.c:1975): Dumping FAILED.\n")
    assert "No space left" not in str(failure("dump", 1, roomy, []))
