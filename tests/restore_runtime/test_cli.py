"""``snapshotctl`` as a user meets it, a real process each time: every bad input is one line
on stderr and a non-zero exit, never a traceback (what an admin expects, issue 41).

Cases: inspect and verify of a file, a missing path and an oci:// reference; keygen into a
missing directory, and over an existing key (refused unless --force; the private key is
created 0600); recover of a missing path; a wrong-type option; --version."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

CLI = [sys.executable, "-m", "restore_runtime.cli"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def one_line_error(r: subprocess.CompletedProcess, code: int, text: str) -> None:
    assert r.returncode == code, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert text in lines[-1], r.stderr
    if code == 1:
        assert len(lines) == 1, r.stderr


@pytest.mark.parametrize(
    ("args", "code", "text"),
    [
        (["inspect", "{file}"], 1, "not an artifact directory"),
        (["inspect", "{tmp}/missing"], 1, "not an artifact directory"),
        (["inspect", "oci://reg.example/snaps@sha256:" + "0" * 64], 1, "oci:// artifact"),
        (["verify", "{file}"], 1, "not an artifact directory"),
        (
            ["keygen", "--private", "{tmp}/no/such/k", "--public", "{tmp}/k.pub"],
            1,
            "No such file or directory",
        ),
        (["recover", "{tmp}/missing"], 1, "not a directory"),
        (["restore", "{tmp}/art", "--fill-threads", "many"], 2, "invalid int value"),
        (["checkpoint", "--pid", "1"], 2, "--output"),
    ],
    ids=[
        "inspect-file",
        "inspect-missing",
        "inspect-oci",
        "verify-file",
        "keygen-no-dir",
        "recover-missing",
        "wrong-type",
        "missing-option",
    ],
)
def test_bad_input_is_one_line_and_a_nonzero_exit(tmp_path, args, code, text):
    (tmp_path / "a-file").write_text("x")
    args = [a.format(tmp=tmp_path, file=tmp_path / "a-file") for a in args]
    one_line_error(run(*args), code, text)


def test_keygen_never_replaces_a_key_unless_forced(tmp_path):
    priv, pub = tmp_path / "k", tmp_path / "k.pub"
    assert run("keygen", "--private", str(priv), "--public", str(pub)).returncode == 0
    assert priv.stat().st_mode & 0o777 == 0o600
    first = priv.read_bytes()
    one_line_error(
        run("keygen", "--private", str(priv), "--public", str(pub)), 1, "refusing to replace a key"
    )
    assert priv.read_bytes() == first
    r = run("keygen", "--private", str(priv), "--public", str(pub), "--force")
    assert r.returncode == 0, r.stderr
    assert priv.read_bytes() != first and priv.stat().st_mode & 0o777 == 0o600


def test_version():
    r = run("--version")
    assert r.returncode == 0 and r.stdout.startswith("snapshotctl "), r


def test_the_ledger_directory_has_its_own_name():
    """One name per setting (structure issue): snapshot-agent's ``--fill-ledger`` switches
    the ledger on or off; snapshotctl's directory is ``--fill-ledger-dir``, and nothing
    else (a directory given as ``--fill-ledger`` is refused, not taken for a switch)."""
    from restore_runtime.cli import _parser

    args = _parser().parse_args(["restore", "art", "--fill-ledger-dir", "/tmp/ledger"])
    assert args.fill_ledger_dir == Path("/tmp/ledger")
    with pytest.raises(SystemExit):
        _parser().parse_args(["restore", "art", "--fill-ledger", "/tmp/ledger"])
