"""Framing: one canonical JSON object per `\\n`, at most 1 MiB, errors close one connection."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pi_workflows.wire.canonical import dumps
from pi_workflows.wire.framing import (
    MAX_FRAME_BYTES,
    READ_CHUNK_BYTES,
    AsyncFrameReader,
    FrameDecoder,
    FrameError,
    FrameTooLargeError,
    MalformedFrameError,
    SocketFrameReader,
    TruncatedFrameError,
    encode_frame,
)


def test_frames_split_only_on_newline_byte() -> None:
    message = {"text": "line\u2028separator\u2029and\rcarriage", "n": 1}
    frame = encode_frame(message)
    assert frame.endswith(b"\n") and frame.count(b"\n") == 1
    decoder = FrameDecoder()
    assert decoder.feed(frame[:7]) == []
    assert decoder.feed(frame[7:] + frame) == [message, message]
    assert decoder.buffered == 0


def test_frame_of_exactly_the_limit_is_accepted() -> None:
    padding = MAX_FRAME_BYTES - len(dumps({"p": ""}))
    message = {"p": "x" * padding}
    frame = encode_frame(message)
    assert len(frame) == MAX_FRAME_BYTES + 1
    assert FrameDecoder().feed(frame) == [message]


def test_encoding_a_message_over_the_limit_is_refused() -> None:
    with pytest.raises(FrameTooLargeError):
        encode_frame({"p": "x" * MAX_FRAME_BYTES})


def test_oversized_frame_fails_before_its_newline_arrives() -> None:
    decoder = FrameDecoder()
    decoder.feed(b'{"p":"')
    with pytest.raises(FrameTooLargeError):
        for _ in range(MAX_FRAME_BYTES // READ_CHUNK_BYTES + 2):
            decoder.feed(b"x" * READ_CHUNK_BYTES)
    assert decoder.buffered == 0


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b'{"b":1,"a":2}\n', MalformedFrameError),
        (b'{"a": 1}\n', MalformedFrameError),
        (b"[1,2]\n", MalformedFrameError),
        (b"\n", MalformedFrameError),
        (b'{"a":1}\r\n', MalformedFrameError),
        (b'{"a":"\xff"}\n', MalformedFrameError),
        (b'{"a":1,"a":1}\n', MalformedFrameError),
        (b'{"a":1.0}\n', MalformedFrameError),
    ],
)
def test_malformed_frames_raise_frame_errors(data: bytes, error: type[FrameError]) -> None:
    with pytest.raises(error):
        FrameDecoder().feed(data)


def test_decoder_stays_failed_after_an_error() -> None:
    decoder = FrameDecoder()
    with pytest.raises(MalformedFrameError):
        decoder.feed(b"not json\n")
    with pytest.raises(MalformedFrameError):
        decoder.feed(b'{"a":1}\n')


def test_end_of_stream_inside_a_frame_is_truncation() -> None:
    decoder = FrameDecoder()
    decoder.feed(b'{"a":')
    with pytest.raises(TruncatedFrameError):
        decoder.finish()


@pytest.mark.timeout(30)
def test_socket_reader_stops_an_endless_frame_without_reading_it_all() -> None:
    ours, theirs = socket.socketpair()
    ours.settimeout(10)
    sent = {"bytes": 0}
    stop = threading.Event()

    def flood() -> None:
        chunk = b"y" * READ_CHUNK_BYTES
        try:
            theirs.sendall(b'{"p":"')
            while not stop.is_set() and sent["bytes"] < 64 * MAX_FRAME_BYTES:
                theirs.sendall(chunk)
                sent["bytes"] += len(chunk)
        except OSError:
            pass  # the reader closed the connection, as it should

    writer = threading.Thread(target=flood, daemon=True)
    writer.start()
    try:
        reader = SocketFrameReader(ours)
        with pytest.raises(FrameTooLargeError):
            reader.read_message()
    finally:
        stop.set()
        ours.close()
        writer.join(10)
        theirs.close()
    assert sent["bytes"] < 64 * MAX_FRAME_BYTES


def test_socket_reader_reads_messages_then_clean_end() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.settimeout(5)
        theirs.sendall(encode_frame({"a": 1}) + encode_frame({"b": [2]}))
        theirs.shutdown(socket.SHUT_WR)
        reader = SocketFrameReader(ours)
        assert reader.read_message() == {"a": 1}
        assert reader.read_message() == {"b": [2]}
        assert reader.read_message() is None


@pytest.mark.timeout(10)
def test_async_reader_reads_messages_and_rejects_bad_ones() -> None:
    async def scenario() -> list[Any]:
        stream = asyncio.StreamReader()
        stream.feed_data(encode_frame({"a": 1}) + b'{"z":1,"a":0}\n')
        stream.feed_eof()
        reader = AsyncFrameReader(stream)
        first = await reader.read_message()
        with pytest.raises(MalformedFrameError):
            await reader.read_message()
        return [first]

    assert asyncio.run(scenario()) == [{"a": 1}]


adversarial_pieces = st.sampled_from(
    [
        b"\n",
        b"{",
        b"}",
        b'"',
        b"\\",
        b"\xff",
        b"\xed\xa0\x80",
        b'{"a":1}',
        b'{"a":1}\n',
        b"\xe2\x80\xa8",
        b"1e400",
        b"[" * 50,
        b"x" * 4096,
        b"\r\n",
        b"\x00",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=200) | adversarial_pieces, max_size=40), st.integers(1, 64))
def test_random_bytes_never_crash_the_decoder_or_grow_it(pieces: list[bytes], limit: int) -> None:
    decoder = FrameDecoder(max_frame_bytes=limit * 16)
    try:
        for piece in pieces:
            for message in decoder.feed(piece):
                assert isinstance(message, dict)
            assert decoder.buffered <= limit * 16
        decoder.finish()
    except FrameError:
        assert decoder.buffered == 0


def test_deeply_nested_frame_fails_closed() -> None:
    decoder = FrameDecoder()
    with pytest.raises(MalformedFrameError):
        decoder.feed(b'{"a":' + b"[" * 900 + b"]" * 900 + b"}\n")
    assert decoder.buffered == 0
    with pytest.raises(MalformedFrameError):
        decoder.feed(b'{"a":1}\n')
