"""The node installer: registering runtime `snapshot` in containerd's config (pure text edits,
idempotent), and a real install into a scratch host root whose copied interpreter then runs
the shim."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from agent import bundle
from agent import install as inst
from api.node import NodeConfig
from restore_runtime.artifact import signing
from restore_runtime.errors import SnapshotError

V2 = """version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
"""


def test_runtime_is_added_once_and_the_rest_is_kept():
    new = inst.with_runtime(V2)
    cfg = tomllib.loads(new)
    runtimes = cfg["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
    assert runtimes["snapshot"] == {
        "runtime_type": "io.containerd.snapshot.v2",
        "pod_annotations": ["nvidia.com/*", "snapshot.nvidia.com/*"],
        "container_annotations": ["io.kubernetes.container.restartCount"],
    }
    assert runtimes["runc"]["runtime_type"] == "io.containerd.runc.v2"
    assert cfg["plugins"]["io.containerd.grpc.v1.cri"]["sandbox_image"].endswith("pause:3.10")
    assert inst.with_runtime(new) is None  # idempotent


def test_containerd_2_config():
    cfg = tomllib.loads(inst.with_runtime("version = 3\n"))
    assert "snapshot" in cfg["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]


@pytest.mark.parametrize(
    "text, message", [("[plugins\n", "does not parse"), ("root = '/x'\n", "version 1")]
)
def test_bad_configs_are_refused(text, message):
    with pytest.raises(SnapshotError, match=message):
        inst.with_runtime(text)


def host_with_config(tmp_path):
    """A scratch host root holding a containerd config (version 2)."""
    host = tmp_path / "host"
    config = host / "etc/containerd/config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(V2)
    return host, config


def test_install_into_a_host_root(tmp_path):
    host, config = host_with_config(tmp_path)
    # the packages to copy: one .pth that points at this checkout (a real image copies its
    # whole site-packages; 600 MB is too much for a test)
    packages = tmp_path / "site"
    packages.mkdir()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    purelib = next(p for p in sys.path if p.endswith("site-packages"))
    (packages / "snapshot.pth").write_text(f"{root}\n{purelib}\n")
    private, public = tmp_path / "sign.pem", tmp_path / "verify.pem"
    signing.generate_keypair(private, public)

    res = inst.install(host, packages=packages, sign_key=private, check_host=False)
    assert res.config_changed and res.shim == host / "usr/local/bin/containerd-shim-snapshot-v2"
    assert (host / "etc/containerd/config.toml.pre-snapshot").read_text() == V2
    assert (
        "snapshot"
        in tomllib.loads(config.read_text())["plugins"]["io.containerd.grpc.v1.cri"]["containerd"][
            "runtimes"
        ]
    )
    text = res.shim.read_text()
    assert 'SNAPSHOT_VERIFY_KEY="/opt/snapshot/keys/verify.pem"' in text
    assert 'SNAPSHOT_SIGNING_REQUIRED="true"' in text
    assert 'SNAPSHOT_STORE_ROOT="/var/lib/snapshot/artifacts"' in text
    # only the public half reaches the host
    assert (host / "opt/snapshot/keys/verify.pem").read_bytes() == public.read_bytes()
    assert b"PRIVATE" not in b"".join(f.read_bytes() for f in (host / "opt").rglob("*.pem"))
    assert os.access(res.shim, os.X_OK)

    # The bundle's launcher, pointed at the scratch root instead of the host's /, runs the
    # shim with nothing but the bundle's loader, libraries and interpreter.
    python = f"python{sys.version_info.major}.{sys.version_info.minor}"
    vdir = host / res.bundle.relative_to("/")
    assert (host / "opt/snapshot/current").resolve() == vdir.resolve()
    assert 'exec "/opt/snapshot/current/bin/shim" "$@"' in text
    cmd = bundle.python_command(vdir, python, bundle.loader_name(vdir))
    env = {**bundle.python_env(vdir), "PATH": "/usr/bin"}
    out = subprocess.run(
        [*cmd, "-c", bundle.shim_boot(vdir), "-v"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "snapshot-shim" in out.stdout
    # A PYTHONPATH in containerd's environment (a GPU run's, with another Python's packages)
    # is not the bundle's: a shim package there that would fail is never imported.
    hostile = tmp_path / "hostile"
    (hostile / "shim").mkdir(parents=True)
    (hostile / "shim" / "__init__.py").write_text("raise SystemExit('the host PYTHONPATH')\n")
    env["PYTHONPATH"] = str(hostile)
    out = subprocess.run(
        [*cmd, "-c", bundle.shim_boot(vdir), "-v"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 0 and "snapshot-shim" in out.stdout, out.stderr
    launcher = (vdir / "bin/shim").read_text()
    assert "LD_LIBRARY_PATH" not in launcher and "LD_LIBRARY_PATH" not in text
    assert f'"{res.bundle}/lib/ld-linux' in launcher, "the bundle's own loader"
    # the standard library's bytecode came along: no shim start compiles it
    cached = Path(sys.base_prefix, "lib", python, "json", "__pycache__")
    if cached.is_dir():
        copied = vdir / "python/lib" / python / "json" / "__pycache__"
        assert {f.name for f in copied.iterdir()} >= {f.name for f in cached.iterdir()}

    auth = tmp_path / "config.json"
    auth.write_text('{"auths": {"registry.internal": {"auth": "dTpw"}}}')
    settings = NodeConfig(
        oci_plain_http=("registry.internal",),
        oci_auth_file=auth,
        oci_cache_max_bytes=10**9,
        fill_threads=6,
    )
    res = inst.install(host, packages=packages, sign_key=private, node=settings, check_host=False)
    node = NodeConfig.from_env(dict(re.findall(r'export (\w+)="([^"]*)"', res.shim.read_text())))
    assert node.oci_plain_http == ("registry.internal",) and node.oci_cache_max_bytes == 10**9
    assert node.fill_threads == 6, "the shim reads the node's fill-thread setting back"
    assert node.oci_auth_file == Path("/opt/snapshot/keys/oci-auth.json")
    copied = host / "opt/snapshot/keys/oci-auth.json"
    assert copied.read_bytes() == auth.read_bytes() and copied.stat().st_mode & 0o077 == 0

    again = inst.install(
        host, packages=packages, node=NodeConfig(signing_required=False), check_host=False
    )
    assert not again.config_changed and "SNAPSHOT_VERIFY_KEY" not in again.shim.read_text()
    assert NodeConfig.from_env({}).fill_threads is None  # unset: the engine's default
    assert 'SNAPSHOT_SIGNING_REQUIRED="false"' in again.shim.read_text()


def test_uninstall_leaves_the_node_as_it_was(tmp_path):
    """Operations issue: helm uninstall left /opt/snapshot, the wrapper and the runtime table
    on every node. `snapshot-agent uninstall-node` takes off exactly what install-node put
    there (the admin's own lines after our table stay), the store only when asked."""
    host, config = host_with_config(tmp_path)
    packages = tmp_path / "site"
    packages.mkdir()
    store = host / "var/lib/snapshot/artifacts/ns/a"
    store.mkdir(parents=True)
    inst.install(host, packages=packages, node=NodeConfig(signing_required=False), check_host=False)
    config.write_text(config.read_text() + '\n[plugins."admin.later"]\n  kept = true\n')
    edited = config.read_text()

    cli = [sys.executable, "-m", "agent.cli", "uninstall-node", f"--host-root={host}"]
    p = subprocess.run(cli, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "containerd config updated" in p.stdout and "restart containerd" in p.stdout
    assert tomllib.loads(config.read_text()) == tomllib.loads(
        edited.replace(inst.runtime_table(2), "")
    )
    assert "snapshot" not in config.read_text().split("admin.later")[0].split("runtimes")[-1]
    assert not (host / "opt/snapshot").exists()
    assert not (host / "usr/local/bin/containerd-shim-snapshot-v2").exists()
    assert store.exists(), "artifacts are data: kept unless --purge-store"
    again = subprocess.run(cli, capture_output=True, text=True)
    assert again.returncode == 0 and "removed: nothing" in again.stdout
    assert "config unchanged" in again.stdout
    p = subprocess.run(
        [*cli, "--purge-store=/var/lib/snapshot/artifacts"], capture_output=True, text=True
    )
    assert p.returncode == 0 and not store.exists()


def test_uninstall_refuses_what_is_not_ours(tmp_path):
    host, config = host_with_config(tmp_path)
    (tmp_path / "site").mkdir()
    inst.install(
        host, packages=tmp_path / "site", node=NodeConfig(signing_required=False), check_host=False
    )
    config.write_text(
        config.read_text().replace(
            'runtime_type = "io.containerd.snapshot.v2"', 'runtime_type = "io.containerd.runc.v2"'
        )
    )
    p = subprocess.run(
        [sys.executable, "-m", "agent.cli", "uninstall-node", f"--host-root={host}"],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 1 and "was edited since install-node added it" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert (host / "opt/snapshot").exists(), "nothing removed before the config's problem"


def test_a_failed_containerd_restart_is_retried_by_the_next_run(tmp_path, monkeypatch):
    """The init container fails when the restart fails, and runs again; by then the config is
    already registered, yet containerd has not loaded it: the second run must restart it."""
    from agent import cli

    host, _ = host_with_config(tmp_path)
    packages = tmp_path / "site"
    packages.mkdir()
    monkeypatch.setattr(inst.sysconfig, "get_paths", lambda: {"purelib": str(packages)})
    restarts = tmp_path / "restarts"
    args = ["install-node", f"--host-root={host}", "--no-signing-required", "--skip-host-check"]

    assert cli.main([*args, "--restart-command=exit 3"]) != 0
    assert cli.main([*args, f"--restart-command=echo once >> {restarts}"]) == 0
    assert restarts.read_text() == "once\n"
    assert cli.main([*args, f"--restart-command=echo again >> {restarts}"]) == 0
    assert restarts.read_text() == "once\n", "nothing changed: no restart"


@pytest.mark.parametrize(
    ("text", "mode", "advised"),
    [
        ("always [madvise] never\n", "madvise", True),
        ("[always] madvise never\n", "always", False),
        ("", None, False),
    ],
)
def test_huge_pages_advice(tmp_path, caplog, text, mode, advised):
    knob = tmp_path / "enabled"
    knob.write_text(text)
    with caplog.at_level(logging.INFO, logger="snapshot.install"):
        assert inst.advise_huge_pages(knob) == mode
    assert ("transparent huge pages" in caplog.text) is advised
    assert inst.advise_huge_pages(tmp_path / "absent") is None


def test_an_upgrade_switches_current_and_keeps_what_runs(tmp_path):
    """A bundle is installed beside the one before and ``current`` moves in one rename; a
    process still running from the old one keeps its files, and the next install after it
    ended removes them. The same image installed again reuses its directory."""
    host, _ = host_with_config(tmp_path)
    packages = tmp_path / "site"
    packages.mkdir()
    prefix = host / "opt/snapshot"
    node = NodeConfig(signing_required=False)
    first = inst.install(host, packages=packages, node=node, check_host=False).bundle
    assert inst.install(host, packages=packages, node=node, check_host=False).bundle == first
    old = host / first.relative_to("/")
    # a shim of the first bundle, as the host runs it: its loader is the process's executable
    sleep = bundle.run_command(old, Path("/bin/sleep"), bundle.loader_name(old))
    running = subprocess.Popen([*sleep, "600"])
    try:
        (packages / "new.py").write_text("")  # the next image
        second = inst.install(host, packages=packages, node=node, check_host=False).bundle
        assert second != first and os.readlink(prefix / "current") == second.name
        assert old.is_dir(), "in use: kept"
    finally:
        running.kill()
        running.wait()
    (prefix / "admin-notes").mkdir()  # not install-node's: kept
    inst.install(host, packages=packages, node=node, check_host=False)
    assert sorted(p.name for p in prefix.iterdir()) == sorted(
        ["admin-notes", "current", "keys", second.name]
    )
