"""The installer under faults (faults round 3): an install killed after it wrote containerd's
config still restarts containerd on its next run; a dead install's staging is removed before
the next one stages; the node's keys are replaced a file at a time, never leaving none; and
what the signer answers for its keys is checked before anything is written.

The signer here is a real HTTPS server on loopback (a CA of its own, as the chart's signer
has) answering whatever the case needs; the installs go into scratch host roots."""

from __future__ import annotations

import http.server
import ssl
import threading
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from agent import cli
from agent import install as inst
from agent.signer_client import RemoteSigner, SignerError
from api import handshake
from api.signer import KEY_PATH
from kubeclient import certs
from restore_runtime.artifact import signing
from restore_runtime.errors import SnapshotError
from tests.agent.test_install import host_with_config


@pytest.fixture
def no_packages(tmp_path, monkeypatch):
    packages = tmp_path / "site"
    packages.mkdir()
    monkeypatch.setattr(inst.sysconfig, "get_paths", lambda: {"purelib": str(packages)})


def install_args(host: Path, *more: str) -> list[str]:
    return ["install-node", f"--host-root={host}", "--skip-host-check", *more]


class Died(BaseException):
    """The installer's process killed (SIGKILL runs no handler: nothing after it runs)."""


def test_an_install_killed_after_the_config_restarts_containerd_next_time(
    tmp_path, monkeypatch, no_packages
):
    host, config = host_with_config(tmp_path)
    restarts = tmp_path / "restarts"

    def killed(*args, **kwargs):  # the step right after the config was replaced
        raise Died

    with monkeypatch.context() as m:
        m.setattr(inst, "advise_huge_pages", killed)
        with pytest.raises(Died):
            cli.main(install_args(host, "--no-signing-required", "--restart-command=true"))
    assert "snapshot" in config.read_text(), "the config was written before the kill"
    assert cli.main(install_args(host, "--no-signing-required",
                                 f"--restart-command=echo once >> {restarts}")) == 0  # fmt: skip
    assert restarts.read_text() == "once\n", "containerd never loaded the runtime"
    assert not inst.restart_marker(config).exists()


def test_a_dead_install_staging_is_removed_before_staging(tmp_path, monkeypatch, no_packages):
    """Removed before the new staging is made, not after a successful install: on a disk
    sized for one upgrade, the new staging would not fit beside it."""
    host, _ = host_with_config(tmp_path)
    prefix = host / "opt/snapshot"
    dead = prefix / ".staging-4242"
    (dead / "python").mkdir(parents=True)
    (dead / "python/big").write_bytes(b"\0" * 4096)
    stage, beside = inst.bundle.stage, []

    def staging(into, *args, **kwargs):
        beside.extend(sorted(p.name for p in prefix.glob(".staging-*") if p != into))
        return stage(into, *args, **kwargs)

    monkeypatch.setattr(inst.bundle, "stage", staging)
    assert cli.main(install_args(host, "--no-signing-required")) == 0
    assert beside == [], "a dead staging still there while the new one was made"
    assert list(prefix.glob(".staging-*")) == []


def test_keys_are_replaced_a_file_at_a_time(tmp_path, monkeypatch, no_packages):
    """Reinstalled with another key: at no moment of the key's replacement is there no
    verify.pem (the old directory swap had a window with none); the new key is in place."""
    host, _ = host_with_config(tmp_path)
    first, second = tmp_path / "1", tmp_path / "2"
    for d in (first, second):
        d.mkdir()
        signing.generate_keypair(d / "sign.pem", d / "verify.pem")
    assert cli.main(install_args(host, f"--verify-key={first / 'verify.pem'}")) == 0
    keys = host / "opt/snapshot/keys"
    seen: list[bytes | None] = []
    real_rename = handshake.os.rename

    def watched(src, dst, *a, **k):
        seen.append((keys / "verify.pem").read_bytes() if (keys / "verify.pem").exists() else None)
        real_rename(src, dst, *a, **k)
        seen.append((keys / "verify.pem").read_bytes() if (keys / "verify.pem").exists() else None)

    monkeypatch.setattr(handshake.os, "rename", watched)
    assert cli.main(install_args(host, f"--verify-key={second / 'verify.pem'}")) == 0
    assert None not in seen, "a moment with no verify key"
    assert (keys / "verify.pem").read_bytes() == (second / "verify.pem").read_bytes()
    assert (keys.stat().st_mode & 0o777) == 0o700
    assert ((keys / "verify.pem").stat().st_mode & 0o777) == 0o600


@pytest.fixture
def signer_answering(tmp_path):
    """A loopback HTTPS server whose KEY_PATH answers ``answer[0]``; its CA's path."""
    answer: list[bytes] = [b""]
    tls = certs.ensure(tmp_path / "tls", ["127.0.0.1"])

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = answer[0] if self.path == KEY_PATH else b""
            self.send_response(200 if self.path == KEY_PATH else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tls.cert, tls.key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{server.server_address[1]}", tls.ca, answer
    server.shutdown()


def ring(tmp_path: Path, n: int) -> bytes:
    pems = []
    for i in range(n):
        signing.generate_keypair(tmp_path / f"s{i}", tmp_path / f"v{i}")
        pems.append((tmp_path / f"v{i}").read_bytes())
    return b"".join(pems)


def rsa_pem() -> bytes:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


@pytest.mark.parametrize("bad", ["cut-short", "rsa", "garbage", "empty"])
def test_a_bad_key_answer_is_refused_and_writes_nothing(
    tmp_path, signer_answering, no_packages, bad
):
    url, ca, answer = signer_answering
    good = ring(tmp_path, 2)
    answer[0] = {
        "cut-short": good[: len(good) - 40],
        "rsa": rsa_pem(),
        "garbage": b"-----BEGIN PUBLIC KEY-----\nnot a key\n-----END PUBLIC KEY-----\n",
        "empty": b"",
    }[bad]
    with pytest.raises(SignerError):
        RemoteSigner(url, ca).public_key()
    # install-node asks before it installs anything: the node keeps what it had
    host, config = host_with_config(tmp_path)
    before = config.read_text()
    code = cli.main(install_args(host, f"--signer-url={url}", f"--signer-ca={ca}"))
    assert code != 0
    assert config.read_text() == before and not (host / "opt").exists()
    answer[0] = good
    assert RemoteSigner(url, ca).public_key() == good


def test_a_version_in_use_behind_a_linked_prefix_is_kept(tmp_path, no_packages):
    """Faults round 3, case 1: on hosts where /opt is a link (Fedora CoreOS, RHCOS), the
    kernel names a running shim's executable by its resolved path; the version it runs is
    found by file identity and kept by the next upgrade."""
    import os
    import subprocess

    from agent import bundle
    from api.node import NodeConfig

    host, _ = host_with_config(tmp_path)
    (host / "var/opt").mkdir(parents=True)
    (host / "opt").symlink_to("var/opt")  # /opt -> /var/opt, as on those hosts
    node = NodeConfig(signing_required=False)
    first = inst.install(host, node=node, check_host=False).bundle
    old = host / first.relative_to("/")
    sleep = bundle.run_command(old, Path("/bin/sleep"), bundle.loader_name(old))
    running = subprocess.Popen([*sleep, "600"])
    try:
        assert os.readlink(f"/proc/{running.pid}/exe").startswith(str(host / "var/opt"))
        (tmp_path / "site" / "new.py").write_text("")  # the next image
        second = inst.install(host, node=node, check_host=False).bundle
        assert second != first
        assert old.is_dir(), "the version a running process uses was removed"
    finally:
        running.kill()
        running.wait()


def test_a_cri_o_node_is_refused_and_nothing_is_written(tmp_path, no_packages):
    """CRI-O (OpenShift) without containerd: install-node stops before writing anything, with
    a reason that names CRI-O (the init container fails with it; the agent's node Event
    carries it), instead of creating /etc/containerd for a containerd that does not exist."""
    host = tmp_path / "host"
    (host / "run/crio").mkdir(parents=True)
    (host / "run/crio/crio.sock").touch()
    (host / "usr/bin").mkdir(parents=True)
    (host / "usr/bin/crio").touch()
    with pytest.raises(SnapshotError, match="CRI-O runs this node"):
        inst.install(host, check_host=False)
    assert cli.main(install_args(host, "--no-signing-required")) != 0
    assert sorted(p.name for p in host.iterdir()) == ["run", "usr"], "something was written"
    # with containerd beside it, CRI-O's leftovers do not stop the install
    (host / "usr/bin/containerd").touch()
    assert cli.main(install_args(host, "--no-signing-required")) == 0


INLINE = {
    2: """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"
  runtimes = { runc = { runtime_type = "io.containerd.runc.v2" } }
""",
    3: """version = 3
[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "runc"
  runtimes = { runc = { runtime_type = "io.containerd.runc.v2" } }
""",
}


@pytest.mark.parametrize("version", [2, 3])
def test_a_config_with_inline_runtimes_is_refused_unchanged(tmp_path, no_packages, version):
    """Faults round 3, case 2: runtimes written as an inline table load in containerd 1.7
    and 2.x, but a table appended under them loads in neither; the installer parses what
    it would write and refuses, leaving the config as it was."""
    host, config = host_with_config(tmp_path)
    config.write_text(INLINE[version])
    with pytest.raises(SnapshotError, match="inline table"):
        inst.with_runtime(INLINE[version])
    assert cli.main(install_args(host, "--no-signing-required", "--restart-command=true")) != 0
    assert config.read_text() == INLINE[version]
    assert not inst.restart_marker(config).exists()


def containerd_binaries() -> list[pytest.param]:
    import shutil

    from devnode.containerd import CONTAINERD2

    found = [("1.7", shutil.which("containerd"), 2), ("2.x", CONTAINERD2 / "usr/bin/containerd", 3)]
    return [
        pytest.param(
            binary,
            version,
            id=line,
            marks=pytest.mark.skipif(
                not binary or not Path(binary).exists(), reason=f"no containerd {line} here"
            ),
        )
        for line, binary, version in found
    ]


@pytest.mark.parametrize(("binary", "version"), containerd_binaries())
def test_containerd_loads_inline_runtimes_and_refuses_a_table_appended_under_them(
    tmp_path, binary, version
):
    """What the refusal above rests on, asked of containerd itself (``config dump``): the
    inline config loads, the naive append does not."""
    import subprocess

    def loads(text: str) -> bool:
        path = tmp_path / "config.toml"
        path.write_text(text)
        p = subprocess.run([str(binary), "--config", str(path), "config", "dump"],
                           capture_output=True, timeout=60)  # fmt: skip
        return p.returncode == 0

    assert loads(INLINE[version])
    assert not loads(INLINE[version] + inst.runtime_table(version))


def test_a_config_containerd_does_not_come_up_with_is_put_back(tmp_path, no_packages):
    """Faults round 3, case 2's other half: when containerd's restart fails with the config
    this run wrote, the config from before is put back and containerd restarted with it,
    so the node keeps the runtimes it had; the install still fails, saying so."""
    host, config = host_with_config(tmp_path)
    before = config.read_text()
    restarts = tmp_path / "restarts"
    # a containerd that refuses any config naming our runtime, and starts with any other
    restart = f"if grep -q snapshot {config}; then exit 1; fi; echo up >> {restarts}"
    code = cli.main(install_args(host, "--no-signing-required", f"--restart-command={restart}"))
    assert code != 0
    assert config.read_text() == before, "the config containerd refused was kept"
    assert restarts.read_text() == "up\n", "containerd was not restarted with the old config"
    assert not inst.restart_marker(config).exists()
