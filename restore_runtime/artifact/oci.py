"""Artifacts in an OCI registry, the store that scales past one node: ``push`` uploads an
artifact directory as an OCI artifact, ``pull`` downloads one into a fresh directory, both a
part per worker. oras is the registry client (its sessions, token and basic auth, docker
config files); moving the bytes of each part is ours, so a multi-GB page image is neither
read whole into memory nor written anywhere before its digest is known.

The format (docs/oci-artifacts.md):
- an OCI image manifest, ``artifactType`` ARTIFACT_TYPE, the empty config;
- one layer per PART_SIZE part of each file: title = the file's path in the artifact,
  OFFSET_KEY = where the part starts, so a pull fetches all parts at once;
- manifest annotations: the artifact's own manifest digest (what admission pins and the shim
  checks) and the KEP-2008 checkpoint-image keys where they overlap.

A pull takes nothing on trust: the OCI manifest must hash to the digest it was asked for,
every part to its layer digest, and the parts must tile each file exactly. The engine then
verifies the result (file hashes, signature, binding) as it does any artifact."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from ..errors import SnapshotError

ARTIFACT_TYPE = "application/vnd.nvidia.snapshot.artifact.v1"
LAYER_TYPE = "application/vnd.nvidia.snapshot.artifact.part.v1"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
EMPTY_CONFIG = {"mediaType": "application/vnd.oci.empty.v1+json", "size": 2,
                "digest": "sha256:" + hashlib.sha256(b"{}").hexdigest()}  # fmt: skip
TITLE_KEY = "org.opencontainers.image.title"
OFFSET_KEY = "snapshot.nvidia.com/offset"
MANIFEST_DIGEST_KEY = "snapshot.nvidia.com/manifest-digest"
#: KEP-2008 (Kubernetes checkpoint images, as CRI-O and checkpointctl write them)
KEP2008_CONTAINER = "io.kubernetes.cri-o.annotations.checkpoint.name"
KEP2008_POD = "io.kubernetes.cri-o.annotations.checkpoint.pod"
KEP2008_NAMESPACE = "io.kubernetes.cri-o.annotations.checkpoint.namespace"

PART_SIZE = 64 * 1024 * 1024
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
#: seconds one request may wait for the registry (connect, then between bytes)
REQUEST_TIMEOUT = (10.0, 60.0)
#: a request that fails transiently is tried again after RETRY_FIRST_S, doubling up to
#: RETRY_MAX_S, for at most RETRY_WINDOW_S (and never past its operation's deadline)
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
RETRY_FIRST_S, RETRY_MAX_S, RETRY_WINDOW_S = 0.5, 4.0, 20.0
#: the deadlines of whole operations, retries included (docs/failures.md)
PUSH_TIMEOUT_S = 1800.0
DELETE_TIMEOUT_S = 30.0
_READ = 1024 * 1024
DIGEST = re.compile(r"sha256:[a-f0-9]{64}")
_REF = re.compile(
    r"oci://(?P<registry>[A-Za-z0-9.-]+(?::[0-9]{1,5})?)"
    r"/(?P<repository>[a-z0-9]+(?:(?:[._]|__|-+|/)[a-z0-9]+)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[a-f0-9]{64}))?"
)


class OciError(SnapshotError):
    """A push or pull that did not complete; what the registry or the content did wrong."""

    phase = "pull"


@dataclass(frozen=True)
class OciRef:
    """``oci://REGISTRY/REPOSITORY[:TAG][@sha256:…]``: where an artifact lives."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @classmethod
    def parse(cls, uri: str) -> OciRef:
        m = _REF.fullmatch(uri)
        if m is None:
            raise ValueError(f"{uri[:200]!r} is not oci://REGISTRY/REPOSITORY[:TAG][@DIGEST]")
        return cls(m["registry"], m["repository"], m["tag"], m["digest"])

    @property
    def uri(self) -> str:
        tag = f":{self.tag}" if self.tag else ""
        digest = f"@{self.digest}" if self.digest else ""
        return f"oci://{self.registry}/{self.repository}{tag}{digest}"


@dataclass(frozen=True)
class RegistryAccess:
    """How this node talks to registries (the admin's settings, never a pod's)."""

    #: registries spoken to over plain HTTP (a loopback or in-cluster test registry), as
    #: HOST:PORT or HOST (any port)
    plain_http: frozenset[str] = frozenset()
    #: a docker config.json (the pull secret's .dockerconfigjson) with credentials
    auth_file: Path | None = None
    workers: int = 8


class _Client:
    """One oras session for one repository (a session per thread: requests' sessions are
    not meant to be shared across threads), inside one operation's deadline.

    oras' ``do_request`` retries every failure 5 times with sleeps of 3 to 83 s (131 s in
    all) that no deadline cuts: a dead registry then held a restore past the kubelet's call
    and a checkpoint's push for minutes. So its undecorated body is called (it keeps oras'
    token and basic auth), and the retries are ours: a refused or reset connection, or a
    429/5xx answer, is tried again with a short backoff for at most RETRY_WINDOW_S, and never
    past the deadline; every request's timeouts shrink to what is left of it."""

    def __init__(self, ref: OciRef, access: RegistryAccess, deadline: float) -> None:
        import oras.provider  # oras pulls in requests and jsonschema: only OCI users pay

        plain = bool({ref.registry, ref.registry.rsplit(":", 1)[0]} & access.plain_http)
        self.reg = oras.provider.Registry(hostname=ref.registry, insecure=plain)
        self.deadline = deadline
        request = self.reg.session.request
        self.reg.session.request = lambda *a, **kw: request(*a, timeout=self._timeouts(), **kw)
        self._do_request = oras.provider.Registry.do_request.__wrapped__  # without the retry
        if access.auth_file is not None:
            container = self.reg.get_container(f"{ref.registry}/{ref.repository}")
            self.reg.auth.load_configs(container, configs=[str(access.auth_file)])
        self.base = f"{self.reg.prefix}://{ref.registry}/v2/{ref.repository}"
        self.registry = ref.registry

    def _timeouts(self) -> tuple[float, float]:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise OciError(f"registry {self.registry}: out of time (the operation's deadline)")
        return min(REQUEST_TIMEOUT[0], left), min(REQUEST_TIMEOUT[1], left)

    def request(self, method: str, path_or_url: str, ok: tuple[int, ...], **kw):
        url = path_or_url if "://" in path_or_url else self.base + path_or_url
        first_failure, delay = None, RETRY_FIRST_S
        while True:
            try:
                r = self._do_request(self.reg, url, method, **kw)
                why = f"answered {r.status_code}" if r.status_code in RETRY_STATUS else None
            except OciError:
                raise
            except Exception as e:  # requests' and oras' own errors alike
                if not _transient(e):
                    raise OciError(f"registry {self.registry}: {method} failed: {e}") from e
                r, why = None, f"failed: {e}"
            if why is None:
                break
            if r is not None:
                r.close()
            now = time.monotonic()
            first_failure = first_failure or now
            if now + delay >= self.deadline or now - first_failure + delay > RETRY_WINDOW_S:
                raise OciError(f"registry {self.registry}: {method} {path_or_url[:120]} {why}"
                               f" (tried for {now - first_failure:.0f}s)")  # fmt: skip
            time.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)
        assert r is not None
        if r.status_code not in ok:
            detail = r.text[:300] if not kw.get("stream") else ""
            raise OciError(f"registry {self.registry}: {method} {path_or_url[:120]} answered "
                           f"{r.status_code} {detail}".rstrip())  # fmt: skip
        return r


def _transient(e: Exception) -> bool:
    """A failure the same request may not meet again: the connection refused, reset or
    timed out (a registry restarting, a load balancer moving), not TLS or auth."""
    import requests.exceptions as rex

    if isinstance(e, rex.SSLError):
        return False
    return isinstance(e, (rex.ConnectionError, rex.Timeout, ConnectionError, TimeoutError))


class _Clients(threading.local):
    def __init__(self, ref: OciRef, access: RegistryAccess, deadline: float) -> None:
        self.client = _Client(ref, access, deadline)


@dataclass(frozen=True)
class _Part:
    title: str
    offset: int
    size: int
    digest: str = ""


def _parts_of(artifact: Path) -> list[_Part]:
    parts = []
    for dirpath, _dirs, files in os.walk(artifact):
        for name in sorted(files):
            p = Path(dirpath, name)
            if p.is_symlink() or not p.is_file():
                raise OciError(f"refusing to push {p.relative_to(artifact)}: not a regular file")
            title, size = p.relative_to(artifact).as_posix(), p.stat().st_size
            parts += [_Part(title, off, min(PART_SIZE, size - off))
                      for off in range(0, max(size, 1), PART_SIZE)]  # fmt: skip
    return sorted(parts, key=lambda q: (q.title, q.offset))


def _read(path: Path, offset: int, size: int) -> bytes:
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        data = f.read(size)
    if len(data) != size:
        raise OciError(f"{path} changed while it was being pushed")
    return data


def _upload(c: _Client, data: bytes, digest: str) -> None:
    if c.request("HEAD", f"/blobs/{digest}", ok=(200, 404)).status_code == 200:
        return  # the registry has it (a part shared with an earlier push)
    r = c.request("POST", "/blobs/uploads/", ok=(202,))
    location = r.headers.get("Location", "")
    if location.startswith("/"):
        location = f"{c.reg.prefix}://{c.registry}{location}"
    sep = "&" if "?" in location else "?"
    c.request("PUT", f"{location}{sep}digest={digest}", ok=(201,), data=data,
              headers={"Content-Type": "application/octet-stream",
                       "Content-Length": str(len(data))})  # fmt: skip


def push(
    artifact: Path, ref: OciRef, access: RegistryAccess, annotations: dict[str, str],
    timeout_s: float = PUSH_TIMEOUT_S,
) -> OciRef:  # fmt: skip
    """Upload ``artifact`` (a committed artifact directory) to ``ref`` (its tag names it)
    within ``timeout_s``, retries included; returns ``ref`` pinned to the pushed manifest's
    digest. The tag is written last: a push cut short leaves no tag (blobs only, which the
    registry's garbage collection takes)."""
    clients = _Clients(ref, access, time.monotonic() + timeout_s)

    def one(part: _Part) -> _Part:
        data = _read(artifact / part.title, part.offset, part.size)
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        _upload(clients.client, data, digest)
        return replace(part, digest=digest)

    with ThreadPoolExecutor(max_workers=access.workers) as pool:
        parts = list(pool.map(one, _parts_of(artifact)))
    c = clients.client
    _upload(c, b"{}", EMPTY_CONFIG["digest"])
    manifest = {
        "schemaVersion": 2, "mediaType": MANIFEST_TYPE, "artifactType": ARTIFACT_TYPE,
        "config": EMPTY_CONFIG,
        "layers": [{"mediaType": LAYER_TYPE, "digest": p.digest, "size": p.size,
                    "annotations": {TITLE_KEY: p.title, OFFSET_KEY: str(p.offset)}}
                   for p in parts],
        "annotations": annotations,
    }  # fmt: skip
    body = json.dumps(manifest, separators=(",", ":"), sort_keys=True).encode()
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    c.request("PUT", f"/manifests/{ref.tag or digest}", ok=(201,), data=body,
              headers={"Content-Type": MANIFEST_TYPE})  # fmt: skip
    return replace(ref, digest=digest)


def delete(ref: OciRef, access: RegistryAccess, timeout_s: float = DELETE_TIMEOUT_S) -> bool:
    """Delete the manifest ``ref`` pins (its blobs go at the registry's garbage collection)
    within ``timeout_s``. False when the registry does not allow deletes."""
    assert ref.digest is not None
    c = _Client(ref, access, time.monotonic() + timeout_s)
    r = c.request("DELETE", f"/manifests/{ref.digest}", ok=(202, 404, 405))
    return r.status_code != 405


def _safe_title(title: object) -> str:
    """A layer's title as a path inside the artifact: relative, no '..', nothing odd."""
    if not isinstance(title, str) or not title or len(title) > 512 or "\\" in title:
        raise OciError(f"layer title {str(title)[:80]!r} is not a path inside the artifact")
    p = PurePosixPath(title)
    if p.is_absolute() or any(part in ("", ".", "..") for part in title.split("/")):
        raise OciError(f"layer title {title[:80]!r} is not a path inside the artifact")
    return title


def _parse_layers(manifest: dict, max_bytes: int) -> tuple[list[_Part], dict[str, int]]:
    """The parts a manifest lists, checked: each file's parts tile it with no gap or
    overlap, and all of them fit in ``max_bytes``. Returns the parts and each file's size."""
    if manifest.get("artifactType") != ARTIFACT_TYPE:
        raise OciError(f"not a snapshot artifact (artifactType {manifest.get('artifactType')!r})")
    parts = []
    for layer in manifest.get("layers") or []:
        a = layer.get("annotations") or {}
        size, offset, digest = layer.get("size"), a.get(OFFSET_KEY, ""), layer.get("digest")
        if (layer.get("mediaType") != LAYER_TYPE or not isinstance(size, int) or size < 0
                or not str(offset).isdigit() or not DIGEST.fullmatch(str(digest))):  # fmt: skip
            raise OciError(f"malformed layer in the OCI manifest: {json.dumps(layer)[:200]}")
        parts.append(_Part(_safe_title(a.get(TITLE_KEY)), int(offset), size, digest))
    total = sum(p.size for p in parts)
    if total > max_bytes:
        raise OciError(f"the artifact is {total} bytes, more than the cache holds ({max_bytes})")
    sizes: dict[str, int] = {}
    for p in sorted(parts, key=lambda q: (q.title, q.offset)):
        if p.offset != sizes.get(p.title, 0):
            raise OciError(f"the parts of {p.title} overlap or leave a gap at {p.offset}")
        sizes[p.title] = p.offset + p.size
    return parts, sizes


@contextlib.contextmanager
def _until(r, deadline: float, what: str) -> Iterator[None]:
    """Cut the response's connection once ``deadline`` passes. A registry that trickles its
    bytes keeps every read inside the read timeout, and a read of a whole block can last as
    long as it likes, so only a watchdog bounds the pull."""
    expired = threading.Event()

    def cut() -> None:
        expired.set()
        sock = getattr(getattr(r.raw, "connection", None), "sock", None)
        if sock is not None:  # a blocked read then ends at once
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(max(0.0, deadline - time.monotonic()), cut)
    timer.daemon = True
    timer.start()
    try:
        yield
    except Exception:
        if expired.is_set():
            raise OciError(f"pulling {what} took longer than the pull timeout") from None
        raise
    finally:
        timer.cancel()


def _fetch_manifest(c: _Client, digest: str, deadline: float) -> dict:
    body = b""
    # read no more than a manifest may be: a registry could answer with gigabytes
    with (c.request("GET", f"/manifests/{digest}", ok=(200,), stream=True,
                    headers={"Accept": MANIFEST_TYPE}) as r,
          _until(r, deadline, "the manifest")):  # fmt: skip
        for chunk in r.iter_content(chunk_size=64 * 1024):
            body += chunk
            if len(body) > MAX_MANIFEST_BYTES:
                raise OciError(f"the registry's manifest {digest} is larger than "
                               f"{MAX_MANIFEST_BYTES} bytes")  # fmt: skip
    if "sha256:" + hashlib.sha256(body).hexdigest() != digest:
        raise OciError(f"the registry's manifest does not match {digest} (tampered or corrupt)")
    try:
        return json.loads(body)
    except ValueError as e:
        raise OciError(f"the OCI manifest {digest} is not JSON: {e}") from None


def _download(c: _Client, part: _Part, fd: int, deadline: float) -> None:
    h, at = hashlib.sha256(), part.offset
    with (c.request("GET", f"/blobs/{part.digest}", ok=(200,), stream=True) as r,
          _until(r, deadline, part.title)):  # fmt: skip
        for chunk in r.iter_content(chunk_size=_READ):
            if at + len(chunk) > part.offset + part.size:
                raise OciError(f"blob {part.digest} of {part.title} is longer than its layer says")
            h.update(chunk)
            os.pwrite(fd, chunk, at)
            at += len(chunk)
            if time.monotonic() > deadline:
                raise OciError(f"pulling {part.title} took longer than the pull timeout")
    if at != part.offset + part.size or "sha256:" + h.hexdigest() != part.digest:
        raise OciError(f"blob {part.digest} of {part.title} does not match its digest "
                       "(tampered or corrupt in the registry)")  # fmt: skip


def pull(
    ref: OciRef, dest: Path, access: RegistryAccess, max_bytes: int, timeout_s: float = 600.0,
    reserve: Callable[[int], None] | None = None,
) -> dict:  # fmt: skip
    """Download the artifact ``ref`` pins (by digest: a tag could move) into the empty
    directory ``dest``; returns its OCI manifest. ``reserve(total bytes)`` is called once
    the size is known, before anything is written (the cache makes room)."""
    if ref.digest is None:
        raise OciError(f"{ref.uri} is not pinned to a digest")
    deadline = time.monotonic() + timeout_s
    clients = _Clients(ref, access, deadline)
    manifest = _fetch_manifest(clients.client, ref.digest, deadline)
    parts, sizes = _parse_layers(manifest, max_bytes)
    if reserve is not None:
        reserve(sum(sizes.values()))
    fds: dict[str, int] = {}
    try:
        for title, size in sizes.items():
            (dest / title).parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fds[title] = os.open(dest / title, flags, 0o644)
            os.ftruncate(fds[title], size)
        with ThreadPoolExecutor(max_workers=access.workers) as pool:
            for f in [pool.submit(lambda p: _download(clients.client, p, fds[p.title], deadline),
                                  p) for p in parts]:  # fmt: skip
                f.result()
    finally:
        for fd in fds.values():
            os.close(fd)
    return manifest
