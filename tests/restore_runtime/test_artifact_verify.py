"""Artifact packing and verification, on synthetic artifacts (no CRIU needed).

Cases: a packed artifact verifies; tamper (one byte), truncate, delete, add a file, a
path-traversal entry, an absolute path, a symlink leaving the artifact, a duplicate entry, a
malformed manifest; signatures: good, wrong key, missing, manifest edited after signing;
chunked hashing of large files; the staging directory never survives a failure; the CLI's
exit status and one line per problem.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from api.manifest import MANIFEST_NAME, Compat, Manifest, Source
from restore_runtime.artifact import signing
from restore_runtime.artifact.pack import Staging, describe_files, write_manifest
from restore_runtime.artifact.verify import unsafe_path, verify
from restore_runtime.errors import ArtifactExists, VerificationError
from tests.helpers import snapshotctl

CHUNK = 1024


def make_artifact(
    parent: Path, name: str = "art", key=None, files: dict[str, bytes] | None = None
) -> Path:
    files = files or {
        "criu/pages-1.img": os.urandom(5 * CHUNK + 17),  # chunked
        "criu/core-1.img": b"core",
        "rootfs-diff.tar": b"tar" * 10,
    }
    with Staging(parent / name) as st:
        for rel, data in files.items():
            (st.dir / rel).parent.mkdir(parents=True, exist_ok=True)
            (st.dir / rel).write_bytes(data)
        manifest = Manifest(
            source=Source(pid=1, hostname="h"),
            compat=Compat(arch="x86_64", kernel="6.18.1", criuVersion="4.2.1"),
            files=describe_files(st.dir, CHUNK),
            chunkSize=CHUNK,
        )
        write_manifest(st.dir, manifest, key.sign if key else None)
        return st.commit()


def kinds(art: Path, key=None) -> list[tuple[str, str]]:
    _, problems = verify(art, key)
    return sorted((p.kind, p.path) for p in problems)


def rewrite_manifest(art: Path, edit) -> None:
    data = json.loads((art / MANIFEST_NAME).read_bytes())
    edit(data)
    (art / MANIFEST_NAME).write_text(json.dumps(data))


def test_packed_artifact_verifies(tmp_path):
    art = make_artifact(tmp_path)
    m = verify_or_raise(art)
    pages = next(f for f in m.files if f.path == "criu/pages-1.img")
    assert len(pages.chunks) == 6 and pages.size == 5 * CHUNK + 17
    assert [p.name for p in tmp_path.iterdir()] == ["art"], "no staging directory left"


def test_one_flipped_byte_is_detected(tmp_path):
    art = make_artifact(tmp_path)
    p = art / "criu/pages-1.img"
    data = bytearray(p.read_bytes())
    data[3 * CHUNK + 5] ^= 1
    p.write_bytes(bytes(data))
    assert kinds(art) == [("modified", "criu/pages-1.img")]


def test_small_file_modified(tmp_path):
    art = make_artifact(tmp_path)
    (art / "criu/core-1.img").write_bytes(b"CORE")
    assert kinds(art) == [("modified", "criu/core-1.img")]


def test_truncated(tmp_path):
    art = make_artifact(tmp_path)
    os.truncate(art / "criu/pages-1.img", 100)
    assert kinds(art) == [("truncated", "criu/pages-1.img")]


def test_grown_file(tmp_path):
    art = make_artifact(tmp_path)
    with open(art / "rootfs-diff.tar", "ab") as f:
        f.write(b"x")
    assert kinds(art) == [("modified", "rootfs-diff.tar")]


def test_deleted(tmp_path):
    art = make_artifact(tmp_path)
    (art / "criu/core-1.img").unlink()
    assert kinds(art) == [("missing", "criu/core-1.img")]


def test_extra_file_and_extra_symlink(tmp_path):
    art = make_artifact(tmp_path)
    (art / "criu/evil.img").write_bytes(b"x")
    (art / "criu/link").symlink_to("/etc")
    assert kinds(art) == [("extra", "criu/evil.img"), ("extra", "criu/link")]


@pytest.mark.parametrize(
    "bad", ["../outside", "criu/../../outside", "/etc/passwd", "criu/./x", "", "a\\b"]
)
def test_unsafe_manifest_paths(tmp_path, bad):
    (tmp_path / "outside").write_bytes(b"secret")
    art = make_artifact(tmp_path)
    rewrite_manifest(art, lambda d: d["files"][0].update(path=bad))
    assert ("unsafe-path", bad) in kinds(art)
    assert unsafe_path(bad)


def test_symlink_escaping_the_artifact(tmp_path):
    (tmp_path / "outside").write_bytes(b"core")
    art = make_artifact(tmp_path)
    (art / "criu/core-1.img").unlink()
    (art / "criu/core-1.img").symlink_to(tmp_path / "outside")
    assert kinds(art) == [("unsafe-path", "criu/core-1.img")]


def test_duplicate_entry(tmp_path):
    art = make_artifact(tmp_path)
    rewrite_manifest(art, lambda d: d["files"].append(d["files"][0]))
    first = json.loads((art / MANIFEST_NAME).read_text())["files"][0]["path"]
    assert kinds(art) == [("manifest", first)]


@pytest.mark.parametrize(
    "content", [b"", b"{not json", b'{"format": "other/v9"}', b'{"files": "nope"}']
)
def test_malformed_manifest(tmp_path, content):
    art = make_artifact(tmp_path)
    (art / MANIFEST_NAME).write_bytes(content)
    assert [k for k, _ in kinds(art)] == ["manifest"]


def test_a_file_without_any_digest_is_refused(tmp_path):
    """A file of one chunk needs its whole-file digest (larger files carry chunk digests
    only): a manifest that drops it describes nothing to check, and is refused."""
    art = make_artifact(tmp_path)
    pages = next(f for f in verify_or_raise(art).files if f.path == "criu/pages-1.img")
    assert pages.digest is None and len(pages.chunks) == 6  # no single-core whole-file pass

    def drop(d):
        core = next(f for f in d["files"] if f["path"] == "criu/core-1.img")
        del core["digest"]

    rewrite_manifest(art, drop)
    assert [k for k, _ in kinds(art)] == ["manifest"]


def test_an_artifact_made_before_blake3_still_verifies(tmp_path):
    """Older artifacts say nothing of their digests' algorithm: SHA-256, in a ``sha256``
    field per whole file. They verify as such, and a change to them is still found."""
    art = make_artifact(tmp_path)

    def to_sha256(d):
        del d["fileDigest"]
        for f in d["files"]:
            data = (art / f["path"]).read_bytes()
            if f.pop("digest", None):
                f["sha256"] = hashlib.sha256(data).hexdigest()
            f["chunks"] = (
                [
                    hashlib.sha256(data[o : o + CHUNK]).hexdigest()
                    for o in range(0, len(data), CHUNK)
                ]
                if f["chunks"]
                else []
            )

    rewrite_manifest(art, to_sha256)
    assert verify_or_raise(art).file_digest == "sha256"
    (art / "criu/core-1.img").write_bytes(b"CORE")
    assert kinds(art) == [("modified", "criu/core-1.img")]


def test_a_sha256_entry_in_a_blake3_manifest_is_refused(tmp_path):
    """A field names its algorithm: a ``sha256`` field is never checked with BLAKE3."""
    art = make_artifact(tmp_path)

    def relabel(d):
        core = next(f for f in d["files"] if f["path"] == "criu/core-1.img")
        core["sha256"] = core.pop("digest")

    rewrite_manifest(art, relabel)
    assert kinds(art) == [("manifest", MANIFEST_NAME)]


def test_missing_manifest(tmp_path):
    art = make_artifact(tmp_path)
    (art / MANIFEST_NAME).unlink()
    assert kinds(art) == [("missing", MANIFEST_NAME)]


def test_signatures(tmp_path):
    priv, pub = tmp_path / "k", tmp_path / "k.pub"
    signing.generate_keypair(priv, pub)
    signing.generate_keypair(tmp_path / "o", tmp_path / "o.pub")
    key = signing.load_private_key(priv)
    art = make_artifact(tmp_path, key=key)
    assert kinds(art, signing.load_public_key(pub)) == []
    assert kinds(art, signing.load_public_key(tmp_path / "o.pub")) == [
        ("signature", "manifest.sig")
    ]
    unsigned = make_artifact(tmp_path, name="unsigned")
    assert kinds(unsigned, signing.load_public_key(pub)) == [("signature", "manifest.sig")]
    # editing the manifest (e.g. to hide a swapped file) breaks the signature
    rewrite_manifest(art, lambda d: d["source"].update(hostname="evil"))
    assert ("signature", "manifest.sig") in kinds(art, signing.load_public_key(pub))


def test_a_retired_key_in_the_nodes_key_ring_still_verifies_what_it_signed(tmp_path):
    """Key rotation: the node's key file holds the current key, then the retired ones; an
    artifact signed before the rotation still verifies, one signed by a key never in the ring
    does not, and a ring with something other than Ed25519 keys is refused."""
    for name in ("old", "new", "stranger"):
        signing.generate_keypair(tmp_path / name, tmp_path / f"{name}.pub")
    ring = tmp_path / "ring.pem"
    ring.write_bytes((tmp_path / "new.pub").read_bytes() + (tmp_path / "old.pub").read_bytes())
    keys = signing.load_public_key(ring)
    assert isinstance(keys, signing.KeyRing) and len(keys.keys) == 2
    for name, problems in (("old", []), ("new", []), ("stranger", [("signature", "manifest.sig")])):
        art = make_artifact(
            tmp_path, name=name + "-art", key=signing.load_private_key(tmp_path / name)
        )
        assert kinds(art, keys) == problems, name
    ring.write_bytes((tmp_path / "new.pub").read_bytes() + b"garbage")
    with pytest.raises(signing.KeyError_, match="cannot load verification key"):
        signing.load_public_key(ring)


def test_bad_key_files_are_clear_errors(tmp_path):
    (tmp_path / "junk").write_text("not a key")
    with pytest.raises(signing.KeyError_, match="cannot load verification key"):
        signing.load_public_key(tmp_path / "junk")
    with pytest.raises(signing.KeyError_, match="cannot load signing key"):
        signing.load_private_key(tmp_path / "missing")


def test_staging_is_removed_on_failure_and_output_never_replaced(tmp_path):
    with pytest.raises(RuntimeError), Staging(tmp_path / "art") as st:
        (st.dir / "f").write_bytes(b"x")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    st = Staging(tmp_path / "art")
    (tmp_path / "art").mkdir()  # appears while we were writing
    with pytest.raises(ArtifactExists):
        st.commit()
    st.abort()
    with pytest.raises(ArtifactExists):
        Staging(tmp_path / "art")


def test_verify_or_raise_lists_every_problem(tmp_path):
    art = make_artifact(tmp_path)
    (art / "criu/core-1.img").unlink()
    (art / "extra").write_bytes(b"x")
    with pytest.raises(VerificationError) as e:
        verify_or_raise(art)
    assert sorted(p.kind for p in e.value.problems) == ["extra", "missing"]
    assert "2 problem(s)" in str(e.value)


def test_cli_verify_and_inspect(tmp_path):
    art = make_artifact(tmp_path)
    ok = snapshotctl("verify", str(art))
    assert ok.stdout.strip() == "OK"
    (art / "criu/core-1.img").write_bytes(b"XXXX")
    os.truncate(art / "criu/pages-1.img", 1)
    bad = snapshotctl("verify", str(art), check=False)
    assert bad.returncode == 1
    assert sorted(bad.stdout.splitlines()) == [
        "modified: criu/core-1.img: blake3 mismatch in content",
        f"truncated: criu/pages-1.img: 1 bytes, expected {5 * CHUNK + 17}",
    ]
    js = json.loads(snapshotctl("verify", str(art), "--json", check=False).stdout)
    assert js["ok"] is False and len(js["problems"]) == 2
    info = json.loads(snapshotctl("inspect", str(art), "--json").stdout)
    assert info["format"] == "snapshot.artifact/v1"
    assert info["sizeBytes"] == 5 * CHUNK + 17 + 4 + 30
    assert "x86_64, kernel 6.18.1, CRIU 4.2.1" in snapshotctl("inspect", str(art)).stdout


def verify_or_raise(art):
    manifest, problems = verify(art)
    if problems or manifest is None:
        raise VerificationError(problems)
    return manifest
