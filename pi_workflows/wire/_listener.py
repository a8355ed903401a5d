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

__all__ = ["ClientListener", "Connection", "ConnectionHandler"]

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
    closed: bool = False

    def respond(self, response: Mapping[str, Any]) -> None:
        """Queue a response; it is written in order, after any earlier response."""
        frame = encode_frame(response)
        self._loop.call_soon_threadsafe(self._queue_response, frame)

    def offer_event(self, subscription_id: str, event: dict[str, Any]) -> None:
        """Offer the newest event of a subscription, replacing one not yet written.

        This is the coalescing rule: a blocked connection holds at most one pending
        event per subscription, however often the subscription publishes.
        """
        frame = encode_frame(event)
        self._loop.call_soon_threadsafe(self._queue_event, subscription_id, frame)

    def is_drained(self) -> bool:
        """True when nothing is queued or being written: the next snapshot may be built."""
        return not (self._outbox or self._events or self._writing)

    def close(self) -> None:
        """Close this connection from any thread."""
        self._loop.call_soon_threadsafe(self._close_now)

    def _queue_response(self, frame: bytes) -> None:
        if self.closed:
            return
        self._outbox.append(frame)
        self._slots.release()
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
            while (self._outbox or self._events) and not self.closed:
                if self._outbox:
                    frame = self._outbox.popleft()
                else:
                    key = next(iter(self._events))
                    frame = self._events.pop(key)
                self._writing = True
                try:
                    self._writer.write(frame)
                    await self._writer.drain()
                finally:
                    self._writing = False


class ClientListener:
    """Accepts client connections on a Unix socket, in a thread of its own.

    **Blocking:** `start` returns once the socket accepts; `stop` waits at most
    CLOSE_TIMEOUT_S for connections to close.
    """

    def __init__(
        self,
        socket_path: Path,
        handler: ConnectionHandler,
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

    @property
    def connection_count(self) -> int:
        """Open connections (read without locking; a snapshot for status and idle checks)."""
        return len(self._connections)

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
        connection = Connection(f"connection-{next(self._ids)}", self._loop, writer)
        self._connections.add(connection)
        writer_task = self._loop.create_task(connection._write_loop())
        try:
            connection._outbox.append(encode_frame(self._hello(connection)))
            connection._wake.set()
            self._handler.on_connect(connection)
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
                self._handler.on_disconnect(connection)
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
                self._handler.on_request(connection, checked)
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
