"""A TCP connection's receive buffer starts small and grows only as its messages need:
control links stay at the first size (a controller holds a thousand of them), a message
larger than the buffer, or a frame header longer than it, makes it grow, and every byte
arrives intact whatever the read sizes."""

from __future__ import annotations

import os

import pytest
from tianji.transports._framing import (
    _BUFFER_SIZE,
    _FIRST_BUFFER_SIZE,
    PREAMBLE,
    FrameParser,
    encode_prefix,
)


def feed(parser: FrameParser, data: bytes, read: int) -> None:
    """Hand ``data`` to the parser as the event loop would, at most ``read`` bytes a read
    (each read also bounded by the room the parser offers)."""
    at = 0
    while at < len(data):
        room = parser.get_buffer()
        assert len(room) > 0, f"the parser offers no room with {len(data) - at} bytes to come"
        n = min(len(room), read, len(data) - at)
        room[:n] = data[at : at + n]
        parser.buffer_updated(n)
        at += n


def message(*frames: bytes) -> bytes:
    return encode_prefix([len(f) for f in frames]) + b"".join(frames)


def parsed(parser: FrameParser) -> list[list[bytes]]:
    got = [[bytes(f) for f in frames] for frames, _ in parser.messages]
    parser.messages.clear()
    return got


def new_parser() -> FrameParser:
    return FrameParser(max_frame_bytes=1 << 30, max_frames=4096)


def test_small_messages_keep_the_first_buffer() -> None:
    parser = new_parser()
    small = [message(os.urandom(n), b"x") for n in (10, 300, 2000, 5000)] * 50
    feed(parser, PREAMBLE + b"".join(small), read=1 << 20)
    assert len(parsed(parser)) == len(small)
    assert len(parser._buf) == _FIRST_BUFFER_SIZE


@pytest.mark.parametrize("read", [1, 777, 4096, 1 << 20], ids=lambda r: f"read{r}")
def test_messages_larger_than_the_buffer_grow_it_and_arrive_intact(read: int) -> None:
    parser = new_parser()
    frames = [
        (os.urandom(40_000),),  # one frame larger than the first buffer, kept in it
        (os.urandom(60_000), os.urandom(30)),  # just under the size received in place
        (os.urandom(200_000),),  # received in place (its own buffer)
        tuple(os.urandom(3) for _ in range(2500)),  # a frame header of 20,004 bytes
        (b"tail",),
    ]
    if read == 1:
        frames = frames[:2] + frames[4:]  # byte by byte: the large ones take too long
    feed(parser, PREAMBLE + b"".join(message(*f) for f in frames), read)
    assert parsed(parser) == [list(f) for f in frames]
    assert _FIRST_BUFFER_SIZE < len(parser._buf) <= _BUFFER_SIZE
