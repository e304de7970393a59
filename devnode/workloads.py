"""Running this repository's Python workloads inside busybox containers: the host's /usr, its
Python installation and the repository are mounted read-only at their own paths, so the
virtualenv works unchanged inside the container."""

from __future__ import annotations

import sys
from pathlib import Path

from api.handshake import DEFAULT_CONTROL_DIR, pod_empty_dir

ROOT = Path(__file__).resolve().parent.parent
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"


def python_home() -> Path:
    return Path(sys.base_prefix).resolve()


def mounts() -> tuple[tuple[str, str, bool], ...]:
    paths = {"/usr", str(python_home()), str(ROOT)}
    return tuple((p, p, True) for p in sorted(paths))


def command(module_or_script: list[str], port: int, *extra: str) -> list[str]:
    """Run ``python ARGS <pod IP> <port> EXTRA...`` in the container, on its eth0 address."""
    args = " ".join(module_or_script)
    tail = "".join(f" {e}" for e in extra)
    return [
        "sh",
        "-c",
        "IP=$(ip -4 -o addr show eth0 | awk '{print $4}'); "
        f"cd {ROOT} && exec {VENV_PYTHON} {args} ${{IP%/*}} {port}{tail}",
    ]


def control_mount(control: Path, pod_uid: str) -> tuple[str, str, bool]:
    """A control directory mounted at the workload's in pod ``pod_uid``, at the path the
    kubelet gives that pod's emptyDir volumes (the only control directory the shim writes
    into; containerd resolves links in mount sources, so the directory itself lies there):
    ``control``, an empty directory, becomes a link to it."""
    layout = pod_empty_dir(control.parent / "kubelet", pod_uid, control.name)
    layout.mkdir(parents=True)
    control.rmdir()
    control.symlink_to(layout)
    return (str(layout), DEFAULT_CONTROL_DIR, False)
