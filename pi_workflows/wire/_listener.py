"""The server side of the client socket: hello, framing, validation, bounded writes.

Implements client-protocol.md § Transports and § Subscriptions and reconnection.
One asyncio loop in its own thread owns every connection, so no actor ever blocks
on a socket. Bad input closes only the offending connection; a slow reader holds
at most one pending event per subscription and never delays anyone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pi_workflows.errors import PiWorkflowsError
from pi_workflows.wire.framing import AsyncFrameReader, FrameError, encode_frame
from pi_workflows.wire.protocol import (
    CLIENT_SCHEMA,
    ProtocolViolation,
    RequestMessage,
    client_message_from_wire,
)

__all__ = ["ChannelHandler", "ClientListener", "Connection", "ConnectionHandler"]

log = logging.getLogger(__name__)

MAX_IN_FLIGHT_REQUESTS = 64
"""Requests one connection may have unanswered; beyond it the server stops reading it."""

CLOSE_TIMEOUT_S = 5.0


class ConnectionHandler(Protocol):
    """What the listener calls; every method runs on the listener's loop and must not block."""

    def on_connect(self, connection: Connection) -> None:
        """A client connected and was sent its hello."""

    def on_request(self, connection: Connection, request: RequestMessage) -> None:
        """A valid request arrived; answer later with `connection.respond`."""

    def on_disconnect(self, connection: Connection) -> None:
        """The connection is gone (closed by either side)."""


class ChannelHandler(Protocol):
    """Receives a private child channel's messages on the listener's loop; must not block."""

    def on_message(self, channel: Connection, message: dict[str, Any]) -> None:
        """One decoded canonical JSON object arrived (the handler checks its schema)."""

    def on_close(self, channel: Connection) -> None:
        """The channel closed or broke framing; it is gone."""


@dataclass(eq=False)
class Connection:
    """One client connection. `respond` and `offer_event` are safe from any thread.

    Internal to the server; handlers keep it only as an opaque address.
    """

    connection_id: str
    _loop: asyncio.AbstractEventLoop
    _writer: asyncio.StreamWriter
    _slots: asyncio.Semaphore = field(
        default_factory=lambda: asyncio.Semaphore(MAX_IN_FLIGHT_REQUESTS)
    )
    _outbox: deque[bytes] = field(default_factory=deque)
    _events: dict[str, bytes] = field(default_factory=dict)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _writing: bool = False
    _loop_thread_id: int = 0
    closed: bool = False

    def respond(self, response: Mapping[str, Any]) -> None:
        """Queue a response; it is written in order, after any earlier response."""
        self._on_loop(self._queue_response, encode_frame(response))

    def send(self, message: Mapping[str, Any]) -> None:
        """Queue a message on a child channel (no request slot is released)."""
        self._on_loop(self._queue_frame, encode_frame(message))

    def _on_loop(self, callback: Callable[[bytes], None], frame: bytes) -> None:
        if self._loop_thread_id == threading.get_ident():
            callback(frame)  # already on the loop: no self-pipe wake-up needed
        else:
            self._loop.call_soon_threadsafe(callback, frame)

    def offer_event(self, subscription_id: str, event: dict[str, Any]) -> None:
        """Offer the newest event of a subscription, replacing one not yet written.

        This is the coalescing rule: a blocked connection holds at most one pending
        event per subscription, however often the subscription publishes.
        """
        frame = encode_frame(event)
        self._loop.call_soon_threadsafe(self._queue_event, subscription_id, frame)

    def is_drained(self) -> bool:
        """True when nothing is queued or being written: the next snapshot may be built."""
        return not (
            self._outbox
            or self._events
            or self._writing
            or self._writer.transport.get_write_buffer_size() > 0
        )

    def close(self) -> None:
        """Close this connection from any thread."""
        self._loop.call_soon_threadsafe(self._close_now)

    def _queue_response(self, frame: bytes) -> None:
        if self.closed:
            return
        self._outbox.append(frame)
        self._slots.release()
        self._flush_or_wake()

    def _queue_frame(self, frame: bytes) -> None:
        if self.closed:
            return
        self._outbox.append(frame)
        self._flush_or_wake()

    def _flush_or_wake(self) -> None:
        # Fast path: with nothing buffered in the transport, write at once; the
        # transport sends what the socket takes and the writer task drains the rest.
        while self._outbox and not self._writing and not self._events:
            if self._writer.transport.get_write_buffer_size() > 0:
                break
            self._writer.write(self._outbox.popleft())
        if self._outbox or self._events or self._writer.transport.get_write_buffer_size() > 0:
            self._wake.set()

    def _queue_event(self, subscription_id: str, frame: bytes) -> None:
        if self.closed:
            return
        self._events[subscription_id] = frame
        self._wake.set()

    def _close_now(self) -> None:
        if not self.closed:
            self.closed = True
            self._wake.set()
            self._writer.close()

    async def _write_loop(self) -> None:
        while not self.closed:
            await self._wake.wait()
            self._wake.clear()
            while not self.closed:
                if self._outbox:
                    frame: bytes | None = self._outbox.popleft()
                elif self._events:
                    frame = self._events.pop(next(iter(self._events)))
                else:
                    frame = None
                self._writing = True
                try:
                    if frame is not None:
                        self._writer.write(frame)
                    await self._writer.drain()
                finally:
                    self._writing = False
                if frame is None:
                    break


class ClientListener:
    """Accepts client connections on a Unix socket, in a thread of its own.

    **Blocking:** `start` returns once the socket accepts; `stop` waits at most
    CLOSE_TIMEOUT_S for connections to close.
    """

    def __init__(
        self,
        socket_path: Path,
        handler: ConnectionHandler | None,
        package_version: str,
        on_crash: Callable[[BaseException], None],
    ) -> None:
        self._path = socket_path
        self._handler = handler
        self._version = package_version
        self._on_crash = on_crash
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="client-listener", daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._ids = itertools.count(1)
        self._connections: set[Connection] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def route_to(self, handler: ConnectionHandler) -> None:
        """Set the connection handler (before `start`, when it is built after the listener)."""
        self._handler = handler

    @property
    def connection_count(self) -> int:
        """Open connections (read without locking; a snapshot for status and idle checks)."""
        return len(self._connections)

    def _require_handler(self) -> ConnectionHandler:
        assert self._handler is not None, "route_to before start"
        return self._handler

    def start(self) -> None:
        """Bind the socket (replacing a stale file) and begin accepting connections."""
        self._thread.start()
        self._ready.wait(CLOSE_TIMEOUT_S)
        if self._start_error is not None:
            raise self._start_error

    def stop(self) -> None:
        """Stop accepting, close every connection and remove the socket file."""
        if not self._thread.is_alive():
            return
        future = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        with contextlib.suppress(Exception):
            future.result(CLOSE_TIMEOUT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CLOSE_TIMEOUT_S)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._listen())
        except BaseException as exc:  # noqa: BLE001 - reported to the starter
            self._start_error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            self._loop.run_forever()
        except BaseException as exc:
            log.exception("client listener stopped", extra={"action": "listener.crash"})
            self._on_crash(exc)
        finally:
            self._loop.close()

    def attach_channel(self, sock: socket.socket, handler: ChannelHandler, name: str) -> Connection:
        """Serve a private child channel (a runner's socketpair end) on this loop.

        **Blocking:** waits at most CLOSE_TIMEOUT_S for the loop to adopt the socket.
        """
        sock.setblocking(False)
        future = asyncio.run_coroutine_threadsafe(self._attach(sock, handler, name), self._loop)
        return future.result(CLOSE_TIMEOUT_S)

    def attach_channel_nowait(
        self, sock: socket.socket, handler: ChannelHandler, name: str
    ) -> None:
        """Like `attach_channel`, without waiting (for actors, which must not block)."""
        sock.setblocking(False)
        asyncio.run_coroutine_threadsafe(self._attach(sock, handler, name), self._loop)

    def end_channel_input_nowait(self, sock: socket.socket) -> bool:
        """Make a child channel end after the frames already written to it (any thread).

        For a child known to be dead: its channel still delivers every complete frame
        the child wrote, and then reaches end of file (its handler's `on_close`), even
        if another process still holds the child's end. Nothing is read after that.

        Returns:
            False when the listener has stopped: nothing will read the channel again.
        """

        def shut_reads() -> None:  # on the loop, the one thread that closes the socket
            if sock.fileno() >= 0:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RD)

        if not self._thread.is_alive():
            return False
        try:
            self._loop.call_soon_threadsafe(shut_reads)
        except RuntimeError:  # the loop closed meanwhile
            return False
        return True

    async def _attach(self, sock: socket.socket, handler: ChannelHandler, name: str) -> Connection:
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        channel = Connection(name, self._loop, writer, _loop_thread_id=threading.get_ident())
        task = self._loop.create_task(self._serve_channel(channel, reader, handler))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return channel

    async def _serve_channel(
        self, channel: Connection, reader: asyncio.StreamReader, handler: ChannelHandler
    ) -> None:
        writer_task = self._loop.create_task(channel._write_loop())
        frames = AsyncFrameReader(reader)
        try:
            while not channel.closed:
                message = await frames.read_message()
                if message is None:
                    break
                handler.on_message(channel, message)
        except (FrameError, PiWorkflowsError) as exc:
            log.warning(
                "closing a child channel after bad framing",
                extra={"action": "channel.rejected", "reason": type(exc).__name__},
            )
        except (ConnectionError, OSError):
            pass
        finally:
            channel._close_now()
            writer_task.cancel()
            with contextlib.suppress(BaseException):
                await writer_task
            try:
                handler.on_close(channel)
            except Exception:
                log.exception("channel close handler failed", extra={"action": "listener.error"})

    async def _listen(self) -> None:
        sock = bind_private_socket(self._path)
        self._server = await asyncio.start_unix_server(self._serve, sock=sock)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            connection._close_now()
        with contextlib.suppress(FileNotFoundError):
            self._path.unlink()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=CLOSE_TIMEOUT_S)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        connection = Connection(
            f"connection-{next(self._ids)}",
            self._loop,
            writer,
            _loop_thread_id=threading.get_ident(),
        )
        self._connections.add(connection)
        writer_task = self._loop.create_task(connection._write_loop())
        try:
            connection._outbox.append(encode_frame(self._hello(connection)))
            connection._wake.set()
            self._require_handler().on_connect(connection)
            await self._read_requests(connection, AsyncFrameReader(reader))
        except (ConnectionError, OSError):
            pass  # the peer went away; nothing to answer
        finally:
            connection._close_now()
            writer_task.cancel()
            with contextlib.suppress(BaseException):
                await writer_task
            self._connections.discard(connection)
            self._tasks.discard(task)
            try:
                self._require_handler().on_disconnect(connection)
            except Exception:
                log.exception("disconnect handler failed", extra={"action": "listener.error"})

    def _hello(self, connection: Connection) -> dict[str, Any]:
        return {
            "schema": CLIENT_SCHEMA,
            "type": "hello",
            "connectionId": connection.connection_id,
            "packageVersion": self._version,
        }

    async def _read_requests(self, connection: Connection, frames: AsyncFrameReader) -> None:
        while not connection.closed:
            await connection._slots.acquire()  # backpressure: stop reading a flooding peer
            try:
                message = await frames.read_message()
            except (FrameError, PiWorkflowsError) as exc:
                log.info(
                    "closing connection after bad framing",
                    extra={"action": "connection.rejected", "reason": type(exc).__name__},
                )
                return
            if message is None:
                return
            try:
                checked = client_message_from_wire(message)
            except ProtocolViolation as exc:
                log.info(
                    "closing connection after a protocol violation",
                    extra={"action": "connection.rejected", "reason": exc.keyword or "schema"},
                )
                return
            if checked["type"] != "request":
                log.info(
                    "closing connection: clients may only send requests",
                    extra={"action": "connection.rejected", "reason": "type"},
                )
                return
            try:
                self._require_handler().on_request(connection, checked)
            except Exception:
                log.exception("request handler failed", extra={"action": "listener.error"})
                return


def bind_private_socket(path: Path) -> socket.socket:
    """Bind a listening Unix socket at `path` with mode 0600, replacing a stale file.

    The caller must already hold the server lock, which proves no live server owns
    the old socket file.
    """
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # the file is born 0600; no window where it is wider
    try:
        sock.bind(str(path))
    finally:
        os.umask(old_umask)
    path.chmod(0o600)
    sock.listen(128)
    sock.setblocking(False)
    return sock
