"""Network rebinding with real CRIU in network namespaces this test creates.

A server bound to address A (10.231.1.2) in namespace 1 is checkpointed, restored into
namespace 2 whose address is B (10.231.2.2), and must serve on B with its state. The host
reaches each namespace over its own veth pair; no traffic leaves the machine. Also: the
address codec round-trips, and rebinding never edits the artifact itself.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import struct
import subprocess
import uuid

import pytest

from restore_runtime.criu import images
from restore_runtime.executor.checkpoint import CheckpointRequest, checkpoint
from restore_runtime.executor.restore import RestoreRequest, restore
from restore_runtime.netns import global_addresses, hostname_of, rebind_map
from tests.conftest import requires_criu
from tests.helpers import ask, start_counter

A, B = "10.231.1.2", "10.231.2.2"


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def two_namespaces():
    tag = uuid.uuid4().hex[:6]
    made: list[tuple[str, str]] = []
    try:
        for i, addr in ((1, A), (2, B)):
            ns, host_if, ns_if = f"snaptest-{tag}-{i}", f"st{tag}h{i}", f"st{tag}n{i}"
            ip("netns", "add", ns)
            made.append((ns, host_if))
            ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
            ip("link", "set", ns_if, "netns", ns)
            ip("addr", "add", f"10.231.{i}.1/24", "dev", host_if)
            ip("link", "set", host_if, "up")
            ip("-n", ns, "addr", "add", f"{addr}/24", "dev", ns_if)
            ip("-n", ns, "link", "set", ns_if, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield [ns for ns, _ in made]
    finally:
        for ns, host_if in made:
            subprocess.run(["ip", "link", "del", host_if], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@requires_criu
@pytest.mark.root
def test_server_moves_from_address_a_to_b(tmp_path, two_namespaces, cleanup_pids):
    ns1, ns2 = two_namespaces
    assert global_addresses(ns2) == [B]
    pid, port = start_counter(tmp_path, host=A, netns=ns1)
    cleanup_pids.append(pid)
    assert ask(A, port)["addr"] == f"{A}:{port}"
    assert ask(A, port)["count"] == "2"

    art = tmp_path / "art"
    res = checkpoint(CheckpointRequest(pid=pid, output=art))
    assert res.manifest.network.pod_ips == [A]
    assert res.manifest.network.external_netns

    report = restore(RestoreRequest(artifact=art, netns=ns2))
    cleanup_pids.append(report.pid)
    assert report.pod_ip == B
    reply = ask(B, port)
    assert reply["addr"] == f"{B}:{port}", "listening socket came back on the new address"
    assert reply["count"] == "3", "in-memory state survived the move"
    # the artifact still records A and still verifies: rebinding worked on a private copy
    sockets = inet_sockets(art / "criu")
    assert any(s["src"] == A and s["src_port"] == port for s in sockets)


def test_address_codec_round_trips():
    for addr in ("10.1.2.3", "0.0.0.0", "fd00::1234", "::"):
        fam = images.AF_INET6 if ":" in addr else images.AF_INET
        assert decode_addr(images.encode_addr(addr), fam) == addr
    # the layout CRIU uses: network-order bytes read as little-endian u32 words
    assert images.encode_addr("127.0.0.1") == [16777343]


def test_rebind_map_pairs_per_family():
    assert rebind_map(["10.0.0.1", "fd00::1"], ["fd00::2", "10.0.0.2"]) == {
        "10.0.0.1": "10.0.0.2",
        "fd00::1": "fd00::2",
    }
    assert rebind_map(["10.0.0.1"], ["10.0.0.1"]) == {}
    assert rebind_map(["10.0.0.1"], []) == {}


def inet_sockets(images_dir) -> list[dict]:
    """The inet sockets of a dump, decoded: family, src address and port."""
    out = []
    for e in images.load_files(images_dir)["entries"]:
        isk = e.get("isk")
        if not isk or isk.get("family") not in (socket.AF_INET, socket.AF_INET6):
            continue
        fam = isk["family"]
        out.append(
            {"src": decode_addr(isk.get("src_addr", [0]), fam), "src_port": isk.get("src_port")}
        )
    return out


def decode_addr(words: list[int], family: int) -> str:
    """An address as CRIU's images hold it (little-endian 32-bit words), read back."""
    if family == socket.AF_INET:
        return str(ipaddress.IPv4Address(struct.pack("<I", *words[:1])))
    return str(ipaddress.IPv6Address(struct.pack("<4I", *words[:4])))


@pytest.mark.root
def test_the_host_name_is_read_from_the_uts_namespace_the_container_joins():
    """A pod's container joins its sandbox's UTS namespace: the name is read there (a
    process this test starts in a namespace of its own), else taken from the spec."""
    p = subprocess.Popen(
        ["unshare", "--uts", "sh", "-c", "hostname pod-b-7f6f8 && echo ok && exec sleep 60"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ok"
        joins = {"linux": {"namespaces": [{"type": "uts", "path": f"/proc/{p.pid}/ns/uts"}]}}
        assert hostname_of(joins) == "pod-b-7f6f8"
        assert socket.gethostname() != "pod-b-7f6f8", "only the reading thread moved"
    finally:
        p.kill()
        p.wait()
    own = {"hostname": "ctr-1", "linux": {"namespaces": [{"type": "uts"}]}}
    assert hostname_of(own) == "ctr-1"
    assert hostname_of({"hostname": "x", "linux": {"namespaces": [{"type": "pid"}]}}) is None


@requires_criu
@pytest.mark.root
def test_the_dump_locks_the_network_and_the_restore_does_not(
    tmp_path, two_namespaces, cleanup_pids, monkeypatch
):
    """CRIU's network lock: the dump keeps it (the source's live connections are shielded
    while CRIU reads them), the restore skips it (no connection comes back, --tcp-close; the
    lock would block the whole pod's traffic). Seen through iptables-restore wrappers put
    first on CRIU's PATH, which log each run and hand it to the real tool."""
    ns1, ns2 = two_namespaces
    runs, wrappers = tmp_path / "iptables-runs", tmp_path / "bin"
    wrappers.mkdir()
    for tool in ("iptables-restore", "ip6tables-restore"):
        real = shutil.which(tool)
        if real is None:
            pytest.skip(f"{tool} is not installed (CRIU locks the network with it)")
        wrapper = wrappers / tool
        wrapper.write_text(f'#!/bin/sh\necho {tool} >> {runs}\nexec {real} "$@"\n')
        wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrappers}:{os.environ['PATH']}")
    pid, port = start_counter(tmp_path, host=A, netns=ns1)
    cleanup_pids.append(pid)
    assert ask(A, port)["count"] == "1"

    art = tmp_path / "art"
    checkpoint(CheckpointRequest(pid=pid, output=art))
    assert runs.read_text().count("iptables-restore") >= 2, "the dump locked and unlocked"
    runs.unlink()
    report = restore(RestoreRequest(artifact=art, netns=ns2))
    cleanup_pids.append(report.pid)
    assert not runs.exists(), f"the restore ran iptables: {runs.read_text().split()}"
    assert ask(B, port)["count"] == "2", "the restored server serves on the new address"
