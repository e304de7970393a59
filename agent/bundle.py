"""The node bundle: what runs on the host (the shim's interpreter and packages, CRIU, and every
shared library they load, the dynamic loader included), copied from the image into one
versioned directory, so that a node needs nothing from its host but the kernel:

    PREFIX/<version>-<build>/
        lib/ld-linux-x86-64.so.2 lib/libc.so.6 ...    the image's loader and libraries
        lib/criu/                                     CRIU's plugin directory (empty: none)
        python/bin/python3.X python/lib/python3.X/    the interpreter, its standard library
        site-packages/
        libexec/criu                                  CRIU from the image
        sbin/criu                                     its launcher, first on the shim's PATH
        bin/shim                                      the shim's launcher
    PREFIX/current -> <version>-<build>               switched atomically on upgrade
    PREFIX/keys/                                      the node's keys (not versioned)

Both launchers start their program through the bundle's loader with ``--library-path``, so
the host's C library and loader never matter (Ubuntu 22.04's glibc 2.35 runs the image's
2.41), and nothing is exported that reaches what they start: runc, iptables for CRIU's
network lock, and the workload see the host's environment, with no LD_LIBRARY_PATH. A
launcher names its own version's directory, so a running shim keeps the files it started
with when ``current`` moves on; versions are removed once no process runs from them.

The driver's libraries (libcuda, libnvidia-*) are never bundled: they belong to the host's
driver and are opened from the host at run time."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import struct
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from restore_runtime.errors import SnapshotError

log = logging.getLogger("snapshot.install")

CURRENT = "current"
#: the driver's user-space libraries come from the host, matching its kernel module
HOST_ONLY = re.compile(r"^lib(cuda|nvidia-|nvcuvid|nvoptix)")
# what the shim never imports: tests, GUI, the base installation's own packages. Compiled
# bytecode (__pycache__) is copied with the sources, whose times copy2 keeps, so it stays
# valid: without it every shim start compiles what it imports (the engine alone took 0.45 s
# on a GPU node), or, where the host's prefix is read-only, every one of them does.
STDLIB_SKIP = shutil.ignore_patterns(
    "test", "tests", "idlelib", "tkinter", "_tkinter*", "turtledemo", "ensurepip", "site-packages"
)
# ldd's lines: "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)", "/lib64/ld-linux... (0x...)"
_RESOLVED = re.compile(r"^\s*(\S+) => (/\S+) \(0x[0-9a-f]+\)$")
_LOADER = re.compile(r"^\s*(/\S+) \(0x[0-9a-f]+\)$")
_MISSING = re.compile(r"^\s*(\S+) => not found$")


def program_interpreter(elf: Path) -> Path:
    """The dynamic loader an ELF executable names (its PT_INTERP)."""
    with open(elf, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit only: the nodes we support
            raise SnapshotError(f"{elf}: not a 64-bit ELF executable")
        end = "<" if head[5] == 1 else ">"
        (phoff,) = struct.unpack_from(end + "Q", head, 32)
        phentsize, phnum = struct.unpack_from(end + "HH", head, 54)
        for i in range(phnum):
            f.seek(phoff + i * phentsize)
            kind, _, offset, _, _, size = struct.unpack(end + "IIQQQQ", f.read(40))
            if kind == 3:  # PT_INTERP
                f.seek(offset)
                return Path(f.read(size).rstrip(b"\0").decode())
    raise SnapshotError(f"{elf}: statically linked, no loader to bundle")


def is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def libraries(loader: Path, files: list[Path]) -> tuple[dict[str, Path], dict[Path, list[str]]]:
    """What ``files`` load, as the loader resolves it (``ld.so --list``, ldd's own way): the
    libraries by the name they are asked for, and per file the names it could not find."""

    def listed(f: Path) -> tuple[Path, str]:
        p = subprocess.run(
            [str(loader), "--list", str(f)], capture_output=True, text=True, timeout=60
        )
        return f, p.stdout

    found: dict[str, Path] = {}
    missing: dict[Path, list[str]] = {}
    with ThreadPoolExecutor(max_workers=8) as pool:
        for f, out in pool.map(listed, files):
            for line in out.splitlines():
                if m := _RESOLVED.match(line):
                    found.setdefault(m[1], Path(m[2]))
                elif m := _LOADER.match(line):
                    found.setdefault(Path(m[1]).name, Path(m[1]))
                elif m := _MISSING.match(line):
                    missing.setdefault(f, []).append(m[1])
    return found, missing


def stage(staging: Path, python: str, site: Path, criu: Path) -> None:
    """The whole bundle but its launchers, from this image, into ``staging``."""
    _stage_python(staging, python, site)
    (staging / "libexec").mkdir()
    shutil.copy2(criu, staging / "libexec" / "criu")
    (staging / "lib" / "criu").mkdir(parents=True)
    exe = staging / "python" / "bin" / python
    elves = [exe, staging / "libexec" / "criu"]
    elves += [
        p
        for d in ("python/lib", "site-packages")
        for p in (staging / d).rglob("*.so*")
        if p.is_file() and not p.is_symlink() and is_elf(p)
    ]
    loader = program_interpreter(exe)
    found, missing = libraries(loader, elves)
    for name, src in sorted(found.items()):
        if HOST_ONLY.match(name) or src.is_relative_to(staging):
            continue
        dst = staging / "lib" / name
        if not dst.exists():
            shutil.copy2(src, dst)  # the file itself, not a link into the image
    for f, names in missing.items():
        # a wheel's optional extension (one against the GPU driver, say) may fail to load
        # in the image too; the shim does not import it before the driver is there
        log.debug("%s: not found in the image: %s", f.relative_to(staging), ", ".join(names))
    # the launchers name the loader by its plain name, whatever the image's path to it
    if loader.name not in found:
        shutil.copy2(loader, staging / "lib" / loader.name)


def _stage_python(staging: Path, python: str, site: Path) -> None:
    """The interpreter and its standard library, then this environment's packages."""
    import sys

    base = Path(sys.base_prefix)
    for part in (f"bin/{python}", f"lib/{python}"):
        src, dst = base / part, staging / "python" / part
        if src.is_dir():
            shutil.copytree(src, dst, symlinks=True, ignore=STDLIB_SKIP)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    shutil.copytree(site, staging / "site-packages", symlinks=False)


def loader_name(vdir: Path) -> str:
    return next(p.name for p in (vdir / "lib").glob("ld-linux*.so*"))


def run_command(vdir: Path, program: Path, loader: str) -> list[str]:
    """``program`` started by the bundle's loader with the bundle's libraries: paths as the
    host sees them (``vdir`` is the version's directory there)."""
    return [str(vdir / "lib" / loader), "--library-path", str(vdir / "lib"), str(program)]


def python_command(vdir: Path, python: str, loader: str) -> list[str]:
    """The bundle's interpreter in isolated mode (-I): it finds its standard library from
    its own path and ignores PYTHONPATH and every other PYTHON* variable of the host's
    (a PYTHONPATH in containerd's environment put another Python's packages first)."""
    return [*run_command(vdir, vdir / "python" / "bin" / python, loader), "-I"]


def python_env(vdir: Path) -> dict[str, str]:
    """What the bundle's interpreter and CRIU need in their environment. In any locale but
    C, the C library reads the host's locale files, whose format is the host's glibc's; in
    C, Python still runs in UTF-8 (PEP 540)."""
    return {
        "LC_ALL": "C",
        "CRIU_LIBS_DIR": str(vdir / "lib" / "criu"),  # never the host's plugins
    }


def shim_boot(vdir: Path) -> str:
    """The interpreter's ``-c`` program. The packages directory is added as a site directory,
    not through PYTHONPATH, so that its .pth files (namespace and editable installs) count.
    The locale has been read by then: out of the environment, so that what the shim starts
    runs in the host's own."""
    return (
        "import os, runpy, site; "
        "os.environ.pop('LC_ALL', None); "
        f"site.addsitedir({str(vdir / 'site-packages')!r}); "
        "runpy.run_module('shim', run_name='__main__', alter_sys=True)"
    )


def launchers(staging: Path, vdir: Path, python: str) -> None:
    """bin/shim and sbin/criu in ``staging``, naming ``vdir`` (where it will be on the host).
    The shim finds CRIU on its PATH, as runc does (runc >= 1.2 takes no --criu)."""
    loader = loader_name(staging)
    env = "".join(f'export {k}="{v}"\n' for k, v in python_env(vdir).items())
    shim = " ".join(f'"{a}"' for a in python_command(vdir, python, loader))
    criu = " ".join(f'"{a}"' for a in run_command(vdir, vdir / "libexec" / "criu", loader))
    _script(
        staging / "bin" / "shim",
        f'{env}export PATH="{vdir}/sbin:$PATH"\nexec {shim} -c "{shim_boot(vdir)}" "$@"\n',
    )
    _script(staging / "sbin" / "criu", f'{env}exec {criu} "$@"\n')


def _script(path: Path, body: str) -> None:
    if any(c in body for c in "`\\"):
        raise SnapshotError(f"{path.name}: a path in the bundle may not hold ` or \\")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "#!/bin/sh\n# installed by snapshot-agent install-node (the node bundle)\n" + body
    )
    path.chmod(0o755)


def build_id(tree: Path) -> str:
    """Names a bundle by what it holds: its files' paths, sizes and times (copy2 keeps the
    image's), so that installing the same image again reuses its directory."""
    h = hashlib.sha256()
    for p in sorted(tree.rglob("*")):
        if p.is_symlink():
            h.update(f"{p.relative_to(tree)}\0-> {os.readlink(p)}\n".encode())
        elif p.is_file():  # a directory's time is when this install made it
            st = p.stat()
            h.update(f"{p.relative_to(tree)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:12]


def current(host_prefix: Path) -> str | None:
    try:
        return os.readlink(host_prefix / CURRENT)
    except OSError:
        return None


def switch_current(host_prefix: Path, name: str) -> None:
    """``current`` -> ``name``, in one rename: a shim starting meanwhile gets one or the other."""
    tmp = host_prefix / f".{CURRENT}.new"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(name)
    tmp.replace(host_prefix / CURRENT)


def in_use(host_prefix: Path, proc: Path = Path("/proc")) -> set[str]:
    """The versions under ``host_prefix`` some process runs from, by file identity: a
    version's loader (every process of a bundle starts through it, so it is the process's
    executable) against the device and inode of each ``/proc/PID/exe``. Not by path: on a
    host where the prefix lies behind a link (``/opt`` on Fedora CoreOS and RHCOS) the
    kernel names the resolved path, and a tenant's container may run a file of its own at
    ``/opt/snapshot/<version>/...`` in its mount namespace. Needs the host's PID namespace
    (the agent's hostPID)."""
    loaders: dict[tuple[int, int], str] = {}
    for vdir in host_prefix.iterdir():
        if vdir.is_symlink() or not vdir.is_dir():
            continue
        for loader in (vdir / "lib").glob("ld-linux*.so*"):
            with contextlib.suppress(OSError):
                st = loader.stat()
                loaders[(st.st_dev, st.st_ino)] = vdir.name
    used = set()
    for exe in proc.glob("[0-9]*/exe"):
        try:
            st = exe.stat()  # the executable itself, in whatever mount namespace it runs
        except OSError:
            continue
        if (name := loaders.get((st.st_dev, st.st_ino))) is not None:
            used.add(name)
    return used


#: what install-node makes under the prefix and may remove: a version, a staging left by an
#: install that died, and the single tree (python/, site-packages/) from before the bundle
OURS = re.compile(r"^(\d[\w.+]*-[0-9a-f]{12}|\.staging-\d+|python|site-packages)$")


def prune(host_prefix: Path, keep: str) -> list[str]:
    """Remove what install-node made (``OURS``) that is not ``keep`` and that no process
    runs from; anything else an admin keeps under the prefix stays. Returns what went."""
    busy = in_use(host_prefix)
    gone = []
    for d in host_prefix.iterdir():
        if d.name == keep or d.name in busy or not OURS.match(d.name) or d.is_symlink():
            continue
        if d.is_dir():
            shutil.rmtree(d)
            gone.append(d.name)
    return gone
