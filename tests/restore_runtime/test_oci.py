"""Artifacts through a real OCI registry (Debian's docker-registry on loopback) and the node's
content-addressed cache.

Cases: a pushed artifact pulls into an empty cache byte for byte, in parts, and restores
with the source's state; a second fetch is a cache hit; a tampered blob or manifest in the
registry is refused and leaves nothing in the cache; an OCI ref holding another artifact than
the admitted digest is refused; hostile layer titles never write outside the pull's
directory; a registry that trickles its bytes is cut at the pull timeout; the cache evicts
least recently used entries but never one in use."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from devnode import oci_registry
from restore_runtime.artifact import oci
from restore_runtime.artifact.cache import IN_USE_S, ArtifactCache
from restore_runtime.artifact.oci import OciError, OciRef, RegistryAccess
from restore_runtime.artifact.verify import manifest_digest
from tests.conftest import requires_criu
from tests.helpers import ask, kill, restore_cli, snapshotctl, start_counter

pytestmark = [
    requires_criu,
    pytest.mark.root,
    pytest.mark.skipif(oci_registry.missing() is not None, reason=oci_registry.missing() or ""),
]
ACCESS = RegistryAccess(plain_http=frozenset({"127.0.0.1"}))


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """The registry's address, and its storage directory (for tampering with it)."""
    work = tmp_path_factory.mktemp("registry")
    with oci_registry.docker_registry(work) as reg:
        yield SimpleNamespace(address=reg.address, data=work / "data")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory, registry) -> tuple[Path, int, dict]:
    """A real checkpoint of the counter after three requests: (artifact, port, last reply)."""
    tmp = tmp_path_factory.mktemp("src")
    pid, port = start_counter(tmp)
    try:
        for _ in range(3):
            last = ask("127.0.0.1", port)
        art = tmp / "art"
        snapshotctl("checkpoint", "--pid", str(pid), "--output", str(art))
    finally:
        kill(pid)
    return art, port, last


def pushed(registry, art: Path, tag: str) -> OciRef:
    ref = OciRef.parse(f"oci://{registry.address}/snapshots/test:{tag}")
    return oci.push(art, ref, ACCESS, {oci.MANIFEST_DIGEST_KEY: manifest_digest(art)})


def tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def blob_file(registry_dir: Path, digest: str) -> Path:
    hexd = digest.removeprefix("sha256:")
    return next(registry_dir.rglob(f"blobs/sha256/{hexd[:2]}/{hexd}/data"))


def test_pull_into_an_empty_cache_restores_the_source_state(
    registry, artifact, tmp_path, monkeypatch, cleanup_pids
):
    art, port, before = artifact
    monkeypatch.setattr(oci, "PART_SIZE", 1024 * 1024)  # many parts, pulled at once
    ref = pushed(registry, art, "state")
    assert ref.digest and ref.uri.endswith(f"@{ref.digest}")
    cache = ArtifactCache(tmp_path / "cache", access=ACCESS)
    entry, pulled = cache.fetch(ref, manifest_digest(art))
    assert pulled and tree(entry) == tree(art)
    assert cache.fetch(ref, manifest_digest(art)) == (entry, False)  # warm: no registry trip

    rpid, report = restore_cli(entry, tmp_path)
    cleanup_pids.append(rpid)
    assert report["outcome"] == "restored"
    after = ask("127.0.0.1", port)
    assert after["count"] == "4" and after["digest"] == before["digest"]


@pytest.mark.parametrize("what", ["part", "manifest"])
def test_tampered_registry_content_is_refused(registry, artifact, tmp_path, what):
    """Regression for the OCI store's trust: whoever can write the registry's storage must
    not get bytes into a node's cache."""
    art, _, _ = artifact
    ref = pushed(registry, art, f"tamper-{what}")
    c = oci._Client(ref, ACCESS, time.monotonic() + 60)
    manifest = json.loads(
        c.request(
            "GET", f"/manifests/{ref.digest}", ok=(200,), headers={"Accept": oci.MANIFEST_TYPE}
        ).content
    )
    digest = (
        ref.digest
        if what == "manifest"
        else max(manifest["layers"], key=lambda layer: layer["size"])["digest"]
    )
    data = blob_file(registry.data, digest)
    original = data.read_bytes()
    try:
        data.write_bytes(original[:100] + bytes([original[100] ^ 1]) + original[101:])
        cache = ArtifactCache(tmp_path / "cache", access=ACCESS)
        with pytest.raises(OciError, match="does not match"):
            cache.fetch(ref, manifest_digest(art))
        assert not any((tmp_path / "cache").iterdir()), "nothing half-pulled stays behind"
    finally:
        data.write_bytes(original)


@contextlib.contextmanager
def _trickling(upstream: str, fast: int = 64 * 1024, gap: float = 0.05):
    """A TCP proxy in front of the real registry: requests pass at once, and each connection's
    answers too up to ``fast`` bytes, then one byte every ``gap`` seconds, so every read stays
    inside the client's read timeout. (A test tool in front of the real registry: no registry
    server can be told to be slow.) Yields the proxy's address."""
    host, port = upstream.rsplit(":", 1)
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    conns: list[socket.socket] = []

    def pipe(a: socket.socket, b: socket.socket, slow: bool) -> None:
        sent = 0
        with contextlib.suppress(OSError):
            while not stop.is_set() and (data := a.recv(65536)):
                quick = data if not slow else data[: max(0, fast - sent)]
                b.sendall(quick)
                for i in range(len(quick), len(data)):
                    if stop.wait(gap):
                        return
                    b.sendall(data[i : i + 1])
                sent += len(data)
        with contextlib.suppress(OSError):
            b.shutdown(socket.SHUT_WR)

    def serve() -> None:
        with contextlib.suppress(OSError):
            while not stop.is_set():
                client, _ = srv.accept()
                server = socket.create_connection((host, int(port)))
                conns.extend([client, server])
                for a, b, slow in ((client, server, False), (server, client, True)):
                    threading.Thread(target=pipe, args=(a, b, slow), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        srv.close()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()


def test_a_registry_that_trickles_is_cut_at_the_pull_timeout(registry, artifact, tmp_path):
    """Isolation round 2, finding 15: the pull deadline held only between blocks, so a
    registry sending a byte at a time (each read inside its timeout) held a restore, and the
    kubelet's call, for as long as it liked. The pull now ends at its timeout, mid-block."""
    art, _, _ = artifact
    ref = pushed(registry, art, "trickle")
    cache = ArtifactCache(tmp_path / "cache", access=ACCESS)
    got: list[BaseException | None] = []
    with _trickling(registry.address) as slow:
        t0 = time.monotonic()
        pull = threading.Thread(
            target=lambda: got.append(
                _error_of(
                    lambda: cache.fetch(
                        replace(ref, registry=slow), manifest_digest(art), timeout_s=2
                    )
                )
            ),
            daemon=True,
        )
        pull.start()
        pull.join(30)
        took = time.monotonic() - t0
    assert not pull.is_alive(), "the pull was not cut at its timeout"
    assert isinstance(got[0], OciError) and "longer than the pull timeout" in str(got[0])
    assert took < 10, took
    assert not any((tmp_path / "cache").iterdir()), "nothing half-pulled stays behind"


def _error_of(call) -> BaseException | None:
    try:
        call()
    except BaseException as e:
        return e
    return None


def test_another_artifact_under_the_admitted_digest_is_refused(registry, artifact, tmp_path):
    art, _, _ = artifact
    ref = pushed(registry, art, "other")
    cache = ArtifactCache(tmp_path / "cache", access=ACCESS)
    with pytest.raises(OciError, match="not sha256:" + "0" * 64):
        cache.fetch(ref, "sha256:" + "0" * 64)
    assert not (tmp_path / "cache" / ("0" * 64)).exists()


def test_a_pushed_copy_with_one_page_changed_never_enters_the_cache(registry, artifact, tmp_path):
    """Isolation round 2, attack 4: another namespace pushes the victim's manifest and
    signature with one page changed and restores from it. The cache entry is named by that
    manifest's digest; it was committed after checking manifest.json alone, so the victim's
    own restores on that node then failed, for good. Now nothing enters the cache, and the
    victim's genuine artifact still pulls."""
    art, _, _ = artifact
    forged = tmp_path / "forged"
    shutil.copytree(art, forged)
    pages = max((forged / "criu").glob("pages-*.img"), key=lambda f: f.stat().st_size)
    data = bytearray(pages.read_bytes())
    data[0] ^= 1
    pages.write_bytes(bytes(data))
    assert manifest_digest(forged) == manifest_digest(art)
    evil = pushed(registry, forged, "poison")
    cache = ArtifactCache(tmp_path / "cache", access=ACCESS)
    with pytest.raises(OciError, match="does not hold the files its manifest lists"):
        cache.fetch(evil, manifest_digest(art))
    assert not cache.entry(manifest_digest(art)).exists()
    entry, pulled = cache.fetch(pushed(registry, art, "genuine"), manifest_digest(art))
    assert pulled and tree(entry) == tree(art)


@pytest.mark.parametrize("title", ["../escape", "/etc/escape", "a/../../escape", "a//b", "."])
def test_hostile_layer_titles_are_refused(registry, tmp_path, title):
    ref = OciRef.parse(f"oci://{registry.address}/snapshots/hostile:t")
    c = oci._Client(ref, ACCESS, time.monotonic() + 60)
    data = b"x" * 10
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    oci._upload(c, data, digest)
    oci._upload(c, b"{}", oci.EMPTY_CONFIG["digest"])
    body = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": oci.MANIFEST_TYPE,
            "artifactType": oci.ARTIFACT_TYPE,
            "config": oci.EMPTY_CONFIG,
            "layers": [
                {
                    "mediaType": oci.LAYER_TYPE,
                    "digest": digest,
                    "size": 10,
                    "annotations": {oci.TITLE_KEY: title, oci.OFFSET_KEY: "0"},
                }
            ],
        }
    ).encode()
    c.request(
        "PUT", "/manifests/t", ok=(201,), data=body, headers={"Content-Type": oci.MANIFEST_TYPE}
    )
    pinned = replace(ref, digest="sha256:" + hashlib.sha256(body).hexdigest())
    dest = tmp_path / "a" / "dest"
    dest.mkdir(parents=True)
    with pytest.raises(OciError, match="not a path inside the artifact"):
        oci.pull(pinned, dest, ACCESS, max_bytes=1 << 30)
    assert not any(tmp_path.rglob("escape")) and not any(dest.iterdir())


def test_cache_evicts_least_recently_used_but_not_in_use(registry, artifact, tmp_path):
    art, _, _ = artifact
    size = sum(p.stat().st_size for p in art.rglob("*") if p.is_file())
    ref = pushed(registry, art, "evict")
    cache = ArtifactCache(tmp_path / "cache", max_bytes=int(size * 1.5), access=ACCESS)
    old = cache.entry("sha256:" + "1" * 64)
    old.mkdir(parents=True)
    (old / "pages.img").write_bytes(b"\0" * size)
    with pytest.raises(OciError, match="cannot make room"):
        cache.fetch(ref, manifest_digest(art))  # the other entry was used just now
    assert old.is_dir() and len(cache.entries()) == 1
    stale = time.time() - IN_USE_S - 1
    os.utime(old, (stale, stale))
    entry, pulled = cache.fetch(ref, manifest_digest(art))
    assert pulled and not old.exists() and cache.entries() == [entry]


def test_refs_parse_and_refuse():
    r = OciRef.parse("oci://127.0.0.1:5000/snapshots/team-a:ns.name-1234@sha256:" + "a" * 64)
    assert (r.registry, r.repository) == ("127.0.0.1:5000", "snapshots/team-a")
    assert r.tag == "ns.name-1234"
    assert OciRef.parse(r.uri) == r
    for bad in ("oci://reg/Upper", "https://reg/x", "oci://reg/x@sha256:short", "oci://reg/../x"):
        with pytest.raises(ValueError):
            OciRef.parse(bad)
    cache = ArtifactCache(Path("/cache"))
    assert cache.entry("sha256:" + "a" * 64) == Path("/cache/" + "a" * 64)
    for bad in ("sha256:../../etc", "sha512:" + "a" * 64, "sha256:" + "A" * 64, "a" * 64):
        with pytest.raises(OciError, match="not a sha256 manifest digest"):
            cache.entry(bad)


@contextlib.contextmanager
def _silent_registry():
    """A registry that accepts connections (the kernel's backlog does) and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    try:
        yield f"127.0.0.1:{srv.getsockname()[1]}"
    finally:
        srv.close()


@contextlib.contextmanager
def _refusing_registry():
    """A registry that is down: its port refuses every connection."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{s.getsockname()[1]}"
    s.close()
    yield address


@pytest.mark.parametrize("down", [_refusing_registry, _silent_registry], ids=["refusing", "silent"])
@pytest.mark.parametrize("op", ["push", "pull", "delete"])
def test_every_registry_call_ends_within_its_deadline(registry, artifact, tmp_path, op, down):
    """Faults round 2: oras retried every failure 5 times with sleeps of 3 to 83 s (131 s)
    that no deadline cut, so a dead registry held a restore past the kubelet's call and a
    push for minutes. A push, pull or delete against a registry that refuses connections, or
    accepts them and never answers, now fails with an OciError within its deadline, retries
    included, and a pull leaves nothing in the cache."""
    art, _, _ = artifact
    ref = pushed(registry, art, f"deadline-{op}")
    cache = ArtifactCache(tmp_path / "cache", access=ACCESS)
    with down() as address:
        gone = replace(ref, registry=address)
        calls = {
            "push": lambda: oci.push(
                art,
                replace(gone, digest=None),
                ACCESS,
                {oci.MANIFEST_DIGEST_KEY: manifest_digest(art)},
                timeout_s=4,
            ),
            "pull": lambda: cache.fetch(gone, manifest_digest(art), timeout_s=4),
            "delete": lambda: oci.delete(gone, ACCESS, timeout_s=4),
        }
        t0 = time.monotonic()
        got = _error_of(calls[op])
        took = time.monotonic() - t0
    assert isinstance(got, OciError), got
    assert address in str(got)
    assert took < 7, f"{op} took {took:.1f}s against a 4 s deadline"
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
