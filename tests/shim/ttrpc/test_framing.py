"""ttrpc framing (pure): header layout, incremental decoding, oversize frames skipped."""

from __future__ import annotations

import pytest

from shim.ttrpc import framing


def test_header_layout_is_big_endian_10_bytes():
    raw = framing.encode(7, framing.MessageType.REQUEST, b"abc", flags=framing.FLAG_REMOTE_OPEN)
    assert raw == b"\x00\x00\x00\x03\x00\x00\x00\x07\x01\x02abc"


def test_decoder_handles_byte_by_byte_and_batched_input():
    raw = framing.encode(1, 1, b"hello") + framing.encode(3, 2, b"") + framing.encode(5, 1, b"x")
    d = framing.Decoder()
    frames = [f for b in raw for f in d.feed(bytes([b]))]
    assert [(f.stream_id, f.type, f.data) for f in frames] == [
        (1, 1, b"hello"),
        (3, 2, b""),
        (5, 1, b"x"),
    ]
    assert [f.data for f in framing.Decoder().feed(raw)] == [b"hello", b"", b"x"]


def test_oversize_frame_is_skipped_without_buffering_and_stream_stays_in_sync():
    big = framing.MAX_MESSAGE + 1
    header = framing.HEADER.pack(big, 9, 1, 0)
    d = framing.Decoder()
    out = d.feed(header)
    assert len(out) == 1 and out[0].oversize and out[0].stream_id == 9
    for _ in range(big // 65536):
        assert d.feed(b"\0" * 65536) == []
    rest = big - (big // 65536) * 65536
    out = d.feed(b"\0" * rest + framing.encode(11, 1, b"next"))
    assert [(f.stream_id, f.data) for f in out] == [(11, b"next")]
    assert len(d._buf) == 0


def test_encoding_refuses_oversize():
    with pytest.raises(framing.FrameTooLarge):
        framing.encode(1, 1, b"\0" * (framing.MAX_MESSAGE + 1))
