"""Newline-delimited canonical JSON framing with a hard 1 MiB message limit.

Implements client-protocol.md § Transports and workflow-server.md § Process
supervision (the child channels share the same framing and an independent limit).
One frame is one canonical JSON object followed by the byte `\\n`. The decoder is
sans-IO; thin readers adapt it to blocking sockets and asyncio streams.
"""

from __future__ import annotations

import socket
from collections import deque
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from pi_workflows.errors import PiWorkflowsError
from pi_workflows.wire.canonical import CanonicalJSONError, dumps, loads

if TYPE_CHECKING:  # asyncio loads with the server, not with the client
    import asyncio

__all__ = [
    "MAX_FRAME_BYTES",
    "READ_CHUNK_BYTES",
    "AsyncFrameReader",
    "FrameDecoder",
    "FrameError",
    "FrameTooLargeError",
    "MalformedFrameError",
    "SocketFrameReader",
    "TruncatedFrameError",
    "encode_frame",
]

MAX_FRAME_BYTES = 1_048_576
"""Largest message in bytes, excluding its newline."""

READ_CHUNK_BYTES = 65_536
"""Bytes asked of the transport per read; bounds the buffer at limit + one chunk."""

_NEWLINE = b"\n"


class FrameError(PiWorkflowsError):
    """The peer broke the framing contract; its owner closes that one connection."""


class FrameTooLargeError(FrameError):
    """A message exceeds MAX_FRAME_BYTES; the rest of it is never read into memory."""


class MalformedFrameError(FrameError):
    """A frame is not one canonical JSON object."""


class TruncatedFrameError(FrameError):
    """The connection ended in the middle of a frame."""


def encode_frame(message: Mapping[str, Any]) -> bytes:
    """Return the canonical bytes of `message` followed by a newline.

    Raises:
        FrameTooLargeError: the encoded message exceeds MAX_FRAME_BYTES; send a
            content reference instead.
        NotSerializableError: the message has no canonical JSON form.
    """
    if not isinstance(message, Mapping):
        raise MalformedFrameError("a frame must carry a JSON object")
    body = dumps(dict(message))
    if len(body) > MAX_FRAME_BYTES:
        raise FrameTooLargeError(
            f"message of {len(body)} bytes exceeds the {MAX_FRAME_BYTES}-byte frame limit"
        )
    return body + _NEWLINE


def decode_frame(body: bytes, max_frame_bytes: int = MAX_FRAME_BYTES) -> dict[str, Any]:
    """Decode one frame body (without its newline) into a JSON object."""
    if len(body) > max_frame_bytes:
        raise FrameTooLargeError(f"frame exceeds the {max_frame_bytes}-byte limit")
    try:
        value = loads(body)
    except CanonicalJSONError as exc:
        raise MalformedFrameError(f"frame is not canonical JSON: {exc}") from None
    if not isinstance(value, dict):
        raise MalformedFrameError("a frame must carry a JSON object")
    return value


class FrameDecoder:
    """Splits a byte stream into decoded frames without buffering past the limit.

    **Failure:** after the first error every later call raises the same error, so
    an owner that keeps feeding cannot accidentally accept bytes after a bad frame.
    """

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._max = max_frame_bytes
        self._buffer = bytearray()
        self._error: FrameError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete frame."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        """Add bytes and return every frame they complete, in order.

        Frames that precede a bad one are returned first; the error is then raised
        by the next call (or by `check`).

        Raises:
            FrameError: a frame is too large or malformed.
        """
        frames: list[dict[str, Any]] = []
        try:
            frames.extend(self.iter_feed(data))
        except FrameError:
            if not frames:
                raise
        return frames

    def check(self) -> None:
        """Raise the recorded error, if any; readers call it before blocking on more bytes."""
        self._raise_if_failed()

    def iter_feed(self, data: bytes) -> Iterator[dict[str, Any]]:
        """Like `feed`, yielding frames one by one so a consumer can stop early."""
        self._raise_if_failed()
        self._buffer += data
        start = 0
        while True:
            end = self._buffer.find(_NEWLINE, start)
            if end < 0:
                break
            body = bytes(self._buffer[start:end])
            start = end + 1
            yield self._decode_or_fail(body)
        del self._buffer[:start]
        if len(self._buffer) > self._max:
            self._fail(
                FrameTooLargeError(f"frame exceeds the {self._max}-byte limit before its newline")
            )

    def finish(self) -> None:
        """Declare end of stream.

        Raises:
            TruncatedFrameError: the stream ended inside a frame.
        """
        self._raise_if_failed()
        if self._buffer:
            self._fail(TruncatedFrameError("connection closed in the middle of a frame"))

    def _decode_or_fail(self, body: bytes) -> dict[str, Any]:
        try:
            return decode_frame(body, self._max)
        except FrameError as exc:
            self._fail(exc)
        except Exception as exc:  # noqa: BLE001 - any decoder failure ends the connection
            self._fail(MalformedFrameError(f"frame could not be decoded: {type(exc).__name__}"))

    def _fail(self, error: FrameError) -> NoReturn:
        self._error = error
        self._buffer.clear()
        raise error

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error


class SocketFrameReader:
    """Reads frames from a blocking socket (timeouts are the socket's own)."""

    def __init__(self, sock: socket.socket, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._sock = sock
        self._decoder = FrameDecoder(max_frame_bytes)
        self._ready: deque[dict[str, Any]] = deque()

    def read_message(self) -> dict[str, Any] | None:
        """Return the next message, or None at a clean end of stream.

        Raises:
            FrameError: the peer broke framing; close the connection.
            OSError: the socket failed or timed out.
        """
        while not self._ready:
            self._decoder.check()
            data = self._sock.recv(READ_CHUNK_BYTES)
            if not data:
                self._decoder.finish()
                return None
            self._ready.extend(self._decoder.feed(data))
        return self._ready.popleft()

    def peek_buffered(self) -> dict[str, Any] | None:
        """The next message already received, without reading the socket (None if none)."""
        return self._ready[0] if self._ready else None


class AsyncFrameReader:
    """Reads frames from an asyncio stream."""

    def __init__(
        self, stream: asyncio.StreamReader, max_frame_bytes: int = MAX_FRAME_BYTES
    ) -> None:
        self._stream = stream
        self._decoder = FrameDecoder(max_frame_bytes)
        self._ready: deque[dict[str, Any]] = deque()

    async def read_message(self) -> dict[str, Any] | None:
        """Return the next message, or None at a clean end of stream.

        Raises:
            FrameError: the peer broke framing; close the connection.
        """
        while not self._ready:
            self._decoder.check()
            data = await self._stream.read(READ_CHUNK_BYTES)
            if not data:
                self._decoder.finish()
                return None
            self._ready.extend(self._decoder.feed(data))
        return self._ready.popleft()
