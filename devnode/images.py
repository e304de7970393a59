"""OCI images built locally (no registry is reachable): a busybox-static image, usable as the
CRI sandbox ("pause") image and as a container image."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

BUSYBOX = Path("/bin/busybox")


def applets(busybox: str) -> list[str]:
    """Every applet this busybox has (the CRI conformance tests use many: top, nslookup...)."""
    out = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True)
    return [a for a in out.stdout.split() if a and a != "busybox"]


def _blob(out: tarfile.TarFile, data: bytes) -> tuple[str, int]:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    out.addfile(info, io.BytesIO(data))
    return f"sha256:{digest}", len(data)


def busybox_layer() -> bytes:
    src = shutil.which("busybox") or str(BUSYBOX)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for d in ("bin", "tmp", "proc", "sys", "dev", "etc", "usr", "root", "work"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
            t.addfile(info)
        t.add(src, "bin/busybox")
        # merged-/usr layout, so a bind-mounted host /usr provides the dynamic loader
        for link, target in (("lib", "usr/lib"), ("lib64", "usr/lib64")):
            info = tarfile.TarInfo(link)
            info.type, info.linkname = tarfile.SYMTYPE, target
            t.addfile(info)
        for a in applets(src):
            info = tarfile.TarInfo(f"bin/{a}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            t.addfile(info)
        for name, text in (
            ("etc/passwd", "root:x:0:0:root:/:/bin/sh\n"),
            ("etc/group", "root:x:0:\n"),
        ):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def file_layer(files: dict[str, Path], mode: int = 0o755) -> bytes:
    """A reproducible layer of host files at the paths given, their directories made
    (root-owned, fixed times: the same files are the same digest)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        dirs: set[str] = set()
        for dst, src in sorted(files.items()):
            parts = dst.split("/")
            for n in range(1, len(parts)):
                d = "/".join(parts[:n])
                if d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    t.addfile(info)
            info = tarfile.TarInfo(dst)
            info.size, info.mode = src.stat().st_size, mode
            with src.open("rb") as f:
                t.addfile(info, f)
    return buf.getvalue()


def _add_file_blob(out: tarfile.TarFile, path: Path) -> tuple[str, int]:
    """A large layer from a file, streamed (a root filesystem is hundreds of MB)."""
    digest = hashlib.file_digest(path.open("rb"), "sha256").hexdigest()
    info = out.gettarinfo(str(path), f"blobs/sha256/{digest}")
    info.mode, info.uid, info.gid = 0o644, 0, 0
    with path.open("rb") as f:
        out.addfile(info, f)
    return f"sha256:{digest}", info.size


def write_archive(path: Path, name: str, layers: list[bytes | Path], config: dict) -> None:
    """An OCI image layout tar of uncompressed ``layers`` (bytes, or a tar file's path) that
    ``ctr images import`` (and so ``kind load image-archive``) names ``name``."""
    with tarfile.open(path, "w") as out:
        blobs = [_add_file_blob(out, x) if isinstance(x, Path) else _blob(out, x) for x in layers]
        config_data = json.dumps(
            {
                "architecture": "amd64",
                "os": "linux",
                "config": config,
                "rootfs": {"type": "layers", "diff_ids": [d for d, _ in blobs]},
            }
        ).encode()
        config_digest, config_size = _blob(out, config_data)
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {
                    "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": config_digest,
                    "size": config_size,
                },
                "layers": [
                    {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": d, "size": n}
                    for d, n in blobs
                ],
            }
        ).encode()
        manifest_digest, manifest_size = _blob(out, manifest)
        index = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.index.v1+json",
                "manifests": [
                    {
                        "mediaType": "application/vnd.oci.image.manifest.v1+json",
                        "digest": manifest_digest,
                        "size": manifest_size,
                        "annotations": {
                            "io.containerd.image.name": name,
                            "org.opencontainers.image.ref.name": name,
                        },
                    }
                ],
            }
        ).encode()
        for fname, data in (
            ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
            ("index.json", index),
        ):
            info = tarfile.TarInfo(fname)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))


def write_oci_archive(path: Path, name: str, cmd: list[str]) -> None:
    """A busybox image running ``cmd``."""
    write_archive(
        path, name, [busybox_layer()], {"Cmd": cmd, "Env": ["PATH=/bin"], "WorkingDir": "/"}
    )
