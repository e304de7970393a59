"""The node agent's container has no CUDA driver library: with $SNAPSHOT_HOST_ROOT it loads
the host's, found through the host's loader cache (or the usual directories), following the
host's links inside that root.

No GPU or driver in CI: a stand-in libcuda.so.1 (compiled here, exporting one marker
function) plays the host's, in a directory tree playing the host's root. What is checked is
the mechanism cuda-python relies on: after the preload, a plain ``dlopen("libcuda.so.1")``,
as the bindings make, gets the host's library and not a search of this container."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from restore_runtime.cuda import driver

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc)")


def _fake_root(tmp_path: Path, absolute_link: bool = True) -> Path:
    root = tmp_path / "host"
    lib_dir = root / "opt" / "vendor-driver" / "lib64"
    lib_dir.mkdir(parents=True)
    src = tmp_path / "fake.c"
    src.write_text("int snapshot_fake_driver(void) { return 580; }\n")
    real = lib_dir / "libcuda.so.580.159.04"
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(real), str(src)],
        check=True,
    )
    # the driver's packages link libcuda.so.1 to the versioned file; an absolute target is
    # the host's path, which only exists under the root here
    target = "/opt/vendor-driver/lib64/libcuda.so.580.159.04" if absolute_link else real.name
    (lib_dir / "libcuda.so.1").symlink_to(target)
    (root / "etc").mkdir()
    (root / "etc" / "ld.so.conf").write_text("/opt/vendor-driver/lib64\n")
    subprocess.run(["ldconfig", "-r", str(root)], check=True)
    return root


def test_the_hosts_libcuda_is_found_through_its_loader_cache(tmp_path):
    root = _fake_root(tmp_path)
    found = driver.host_libcuda(root)
    assert found == root / "opt/vendor-driver/lib64/libcuda.so.580.159.04"


def test_without_a_cache_the_usual_directories_are_searched(tmp_path):
    root = tmp_path / "host"
    (root / "usr" / "lib64").mkdir(parents=True)
    (root / "usr" / "lib64" / "libcuda.so.1").write_bytes(b"\x7fELF")
    assert driver.host_libcuda(root) == root / "usr/lib64/libcuda.so.1"
    assert driver.host_libcuda(tmp_path / "nothing") is None


def test_the_bindings_dlopen_gets_the_hosts_library(tmp_path):
    """In a fresh interpreter: the preload, then dlopen by soname, as cuda-python does.
    Without the preload the same dlopen fails (no libcuda.so.1 in this container)."""
    root = _fake_root(tmp_path)
    probe = textwrap.dedent("""
        import ctypes, sys
        from restore_runtime.cuda import driver
        if sys.argv[1] == "preload":
            driver._load_host_driver()
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            print("no driver:", e)
        else:
            print("driver", lib.snapshot_fake_driver())
    """)
    env = {**os.environ, driver.HOST_ROOT_ENV: str(root)}
    env.pop("LD_LIBRARY_PATH", None)

    def run(mode: str) -> str:
        p = subprocess.run(
            [sys.executable, "-c", probe, mode], capture_output=True, text=True, env=env
        )
        assert p.returncode == 0, p.stderr
        return p.stdout.strip()

    assert run("preload") == "driver 580"
    assert run("none").startswith("no driver:")
