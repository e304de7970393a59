"""ttrpc message frames, as pure functions: a 10-byte header (data length u32, stream id u32,
message type u8, flags u8, all big-endian) then the data. Frames over MAX_MESSAGE are not
buffered: the decoder skips their data and reports them, so one bad frame cannot exhaust
memory or desynchronise the stream."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

HEADER = struct.Struct(">IIBB")
HEADER_SIZE = HEADER.size  # 10
MAX_MESSAGE = 4 << 20

FLAG_REMOTE_CLOSED = 0x1
FLAG_REMOTE_OPEN = 0x2


class MessageType(IntEnum):
    REQUEST = 1
    RESPONSE = 2
    DATA = 3


class FrameTooLarge(ValueError):
    pass


@dataclass(frozen=True)
class Frame:
    stream_id: int
    type: int
    flags: int
    data: bytes
    #: the frame's data exceeded MAX_MESSAGE and was skipped (``data`` is empty)
    oversize: bool = False


def encode(stream_id: int, type_: int, data: bytes, flags: int = 0) -> bytes:
    if len(data) > MAX_MESSAGE:
        raise FrameTooLarge(f"message of {len(data)} bytes exceeds {MAX_MESSAGE}")
    return HEADER.pack(len(data), stream_id, type_, flags) + data


class Decoder:
    """Incremental decoder: feed bytes as they arrive, get complete frames back."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._skip = 0  # bytes of an oversize frame still to discard

    def feed(self, data: bytes) -> list[Frame]:
        self._buf += data
        frames: list[Frame] = []
        while True:
            if self._skip:
                n = min(self._skip, len(self._buf))
                del self._buf[:n]
                self._skip -= n
                if self._skip:
                    return frames
            if len(self._buf) < HEADER_SIZE:
                return frames
            length, stream_id, type_, flags = HEADER.unpack_from(self._buf)
            if length > MAX_MESSAGE:
                del self._buf[:HEADER_SIZE]
                self._skip = length
                frames.append(Frame(stream_id, type_, flags, b"", oversize=True))
                continue
            if len(self._buf) < HEADER_SIZE + length:
                return frames
            body = bytes(self._buf[HEADER_SIZE : HEADER_SIZE + length])
            del self._buf[: HEADER_SIZE + length]
            frames.append(Frame(stream_id, type_, flags, body))
