"""The project's images without Docker, pushed to devnode's registry: the base layer from
``tools/build-image.sh`` (Debian packages from mmdebstrap and the pinned Python dependencies,
cached outside the repository) and the code of this checkout as a second layer on top, so a
code change rebuilds only that layer.

- ``snapshot``: what the Dockerfile builds, and what the chart runs (webhook, controller,
  agent); the project's packages go into /opt/snapshot's site-packages.
- ``cpu-demo``: what examples/cpu_demo/Dockerfile builds: the demo's model server under /app.

    ref = push(registry, "snapshot")    # "127.0.0.1:PORT/snapshot/snapshot:<code digest>"
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from restore_runtime.artifact.hashing import file_sha256

from .images import file_layer
from .oci_registry import Registry

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("SNAPSHOT_IMAGE_CACHE", "/var/cache/snapshot-tools/images"))
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: the packages the Dockerfile copies into the project image
PROJECT_PACKAGES = (
    "api",
    "restore_runtime",
    "shim",
    "webhook",
    "controller",
    "agent",
    "signer",
    "kubeclient",
)
#: the files examples/cpu_demo/Dockerfile copies (the workload helper and the demo)
CPU_DEMO_FILES = (
    "restore_runtime/__init__.py",
    "restore_runtime/workload.py",
    "api/__init__.py",
    "api/handshake.py",
    "examples/__init__.py",
    "examples/cpu_demo/__init__.py",
    "examples/cpu_demo/workload.py",
)
LAYER = "application/vnd.oci.image.layer.v1.tar"


@dataclass(frozen=True)
class ImageSpec:
    name: str
    venv: str
    workdir: str
    user: str
    files: dict[str, Path]  # path in the image -> file in this checkout


def missing() -> str | None:
    """Why the images cannot be built and pushed here, or None."""
    absent = [t for t in ("mmdebstrap", "skopeo") if shutil.which(t) is None]
    return f"{', '.join(absent)} not installed (make system)" if absent else None


def spec(name: str) -> ImageSpec:
    if name == "snapshot":
        site = "opt/snapshot/lib/python3.13/site-packages"
        files = {
            f"{site}/{p.relative_to(REPO)}": p
            for pkg in PROJECT_PACKAGES
            for p in sorted((REPO / pkg).rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts
        }
        return ImageSpec(name, "/opt/snapshot", "/", "65532:65532", files)
    if name == "cpu-demo":
        return ImageSpec(
            name, "/opt/venv", "/app", "0:0", {f"app/{f}": REPO / f for f in CPU_DEMO_FILES}
        )
    raise ValueError(f"unknown image {name!r}")


def base_layer(name: str) -> Path:
    """The cached base layer (built on first use: about a minute)."""
    out = subprocess.run(
        ["bash", str(REPO / "tools/build-image.sh"), name],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "SNAPSHOT_PYTHON": sys.executable},
    )
    return Path(out.stdout.strip().splitlines()[-1])


def code_layer(s: ImageSpec) -> bytes:
    """A reproducible tar of the checkout's files (root-owned, fixed times)."""
    return file_layer(s.files, mode=0o644)


def _sha256_file(path: Path) -> str:
    """The digest of a large file, remembered beside it (the base layers never change)."""
    memo = path.with_suffix(".sha256")
    if memo.exists() and memo.stat().st_mtime >= path.stat().st_mtime:
        return memo.read_text().strip()
    digest = f"sha256:{file_sha256(path)}"
    memo.write_text(f"{digest}\n")
    return digest


def write_layout(name: str, layout: Path) -> str:
    """An OCI image layout of image ``name`` in ``layout``; returns its tag (from both
    layers' digests: a new checkout or base is a new tag)."""
    s = spec(name)
    base = base_layer(name)
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)

    def put(data: bytes) -> tuple[str, int]:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return f"sha256:{digest}", len(data)

    base_digest = _sha256_file(base)
    target = blobs / base_digest.split(":")[1]
    if not target.exists():
        os.link(base, target)  # the layout lives beside the cache: no 400 MB copy
    code_digest, code_size = put(code_layer(s))
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": [f"PATH={s.venv}/bin:{SYSTEM_PATH}"],
            "WorkingDir": s.workdir,
            "User": s.user,
        },
        "rootfs": {"type": "layers", "diff_ids": [base_digest, code_digest]},
    }
    config_digest, config_size = put(json.dumps(config).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config_size,
        },
        "layers": [
            {"mediaType": LAYER, "digest": base_digest, "size": base.stat().st_size},
            {"mediaType": LAYER, "digest": code_digest, "size": code_size},
        ],
    }
    manifest_digest, manifest_size = put(json.dumps(manifest).encode())
    tag = hashlib.sha256(f"{base_digest} {code_digest}".encode()).hexdigest()[:16]
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    (layout / "index.json").write_text(
        json.dumps(
            {
                "schemaVersion": 2,
                "manifests": [
                    {
                        "mediaType": "application/vnd.oci.image.manifest.v1+json",
                        "digest": manifest_digest,
                        "size": manifest_size,
                        "annotations": {"org.opencontainers.image.ref.name": tag},
                    }
                ],
            }
        )
    )
    # the index names one image: older builds' blobs (an old base is 400 MB) go
    keep = {d.split(":")[1] for d in (base_digest, code_digest, config_digest, manifest_digest)}
    for blob in blobs.iterdir():
        if blob.name not in keep:
            blob.unlink()
    return tag


def push(registry: Registry, name: str) -> str:
    """Builds image ``name`` and pushes it with skopeo; returns the pullable reference."""
    layout = CACHE / f"layout-{name}"
    tag = write_layout(name, layout)
    ref = f"{registry.address}/snapshot/{name}:{tag}"
    subprocess.run(
        [
            "skopeo",
            "copy",
            "--quiet",
            "--dest-tls-verify=false",
            f"oci:{layout}:{tag}",
            f"docker://{ref}",
        ],
        check=True,
    )
    return ref
