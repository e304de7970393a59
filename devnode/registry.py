"""A read-only OCI registry on loopback that serves one local image under any name and tag.

No registry is reachable from these machines, yet CRI tests (critest) pull their images by
name. containerd is pointed at this server for every registry host (``certs.d/_default``),
so a pull never leaves the machine: names get our busybox image, digests we do not hold get
404 at once."""

from __future__ import annotations

import hashlib
import json
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"


def load_oci_archive(path: Path) -> tuple[bytes, dict[str, bytes]]:
    """The manifest and all blobs (by digest) of a single-image OCI layout tar."""
    blobs: dict[str, bytes] = {}
    with tarfile.open(path) as t:
        index = json.loads(t.extractfile("index.json").read())  # type: ignore[union-attr]
        for m in t.getmembers():
            if m.name.startswith("blobs/sha256/"):
                blobs["sha256:" + m.name.rsplit("/", 1)[1]] = t.extractfile(m).read()  # type: ignore[union-attr]
    manifest = blobs[index["manifests"][0]["digest"]]
    return manifest, blobs


def serve(archive: Path, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    manifest, blobs = load_oci_archive(archive)
    manifest_digest = "sha256:" + hashlib.sha256(manifest).hexdigest()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def _send(
            self,
            code: int,
            body: bytes = b"",
            ctype: str = "application/json",
            digest: str | None = None,
        ) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Docker-Distribution-API-Version", "registry/2.0")
            if digest:
                self.send_header("Docker-Content-Digest", digest)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self) -> None:
            parts = self.path.split("?")[0].rstrip("/").split("/")
            if self.path.rstrip("/") == "/v2":
                return self._send(200, b"{}")
            if len(parts) >= 4 and parts[-2] == "manifests":
                ref = parts[-1]
                if ref.startswith("sha256:") and ref != manifest_digest:
                    return self._send(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')
                return self._send(200, manifest, MANIFEST_TYPE, manifest_digest)
            if len(parts) >= 4 and parts[-2] == "blobs" and parts[-1] in blobs:
                data = blobs[parts[-1]]
                return self._send(200, data, "application/octet-stream", parts[-1])
            return self._send(404, b'{"errors":[{"code":"NAME_UNKNOWN"}]}')

        do_HEAD = do_GET

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True, name="oci-registry").start()
    return server


def hosts_toml(address: str) -> str:
    """certs.d/_default/hosts.toml: every registry host resolves and pulls from ``address``."""
    return f"""server = "http://{address}"
[host."http://{address}"]
  capabilities = ["pull", "resolve"]
  skip_verify = true
"""
