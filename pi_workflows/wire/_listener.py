"""The server side of the client socket: hello, framing, validation, bounded writes.

Implements client-protocol.md § Transports and § Subscriptions and reconnection.
One asyncio loop in its own thread owns every connection, so no actor ever blocks
on a socket. Bad input closes only the offending connection; a slow reader holds
at most one pending event per subscription and never delays anyone else.

Hostile clients (issue 11): the listener accepts by itself instead of through
`asyncio.start_unix_server`, so that it can hold a connection cap, a first-frame
deadline and one reserved descriptor. A connection it turns away gets a `hello` and
one `unavailable` event naming why, then is closed; rejections are logged as one
summary line per interval, not one line each.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import itertools
import logging
import os
import resource
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

from pi_workflows.errors import PiWorkflowsError
from pi_workflows.wire.framing import AsyncFrameReader, FrameDecoder, FrameError, encode_frame
from pi_workflows.wire.protocol import (
    CLIENT_SCHEMA,
    ProtocolViolation,
    RequestMessage,
    client_message_from_wire,
    unknown_operation,
)

__all__ = [
    "DEFAULT_FIRST_FRAME_S",
    "DEFAULT_MAX_CONNECTIONS",
    "FIRST_FRAME_ENV",
    "MAX_CONNECTIONS_ENV",
    "ChannelHandler",
    "ClientListener",
    "Connection",
    "ConnectionHandler",
    "ConnectionLimits",
    "ConnectionLimitsError",
    "LoopAddress",
    "offer_event_frames",
    "raise_descriptor_limit",
    "unavailable_event",
]

log = logging.getLogger(__name__)
loop_log = logging.getLogger(f"{__name__}.loop")
"""asyncio's own errors on the listener loop (rate-limited by the server's log setup)."""

MAX_IN_FLIGHT_REQUESTS = 64
"""Requests one connection may have unanswered; beyond it the server stops reading it."""

CLOSE_TIMEOUT_S = 5.0

DEFAULT_MAX_CONNECTIONS = 512
"""Open client connections at most; also at most half the descriptor limit."""
MAX_CONNECTIONS_ENV = "PI_WORKFLOWS_MAX_CONNECTIONS"
DEFAULT_FIRST_FRAME_S = 10.0
"""Seconds a new connection has to send its first complete frame."""
FIRST_FRAME_ENV = "PI_WORKFLOWS_FIRST_FRAME_SECONDS"
REJECTION_SUMMARY_S = 10.0
"""At most one `connection.rejected` summary line per this many seconds."""
LISTEN_BACKLOG = 1024
"""Connections the kernel queues before a client's connect fails with EAGAIN."""
ACCEPT_BATCH = 64
"""Connections accepted per readiness event, so a flood cannot starve the loop."""
ACCEPT_PAUSE_S = 0.1
"""Pause in accepting when not even the reserved descriptor could be reopened."""
UNLIMITED_DESCRIPTORS = 1_048_576
"""Soft limit asked for when the hard limit is unlimited (Linux refuses more)."""
_OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

REFUSED_AT_CAP = (
    "tooManyConnections",
    "the workflow server is at its connection limit; close unused clients and retry",
)
EVICTED_AT_CAP = (
    "tooManyConnections",
    "the workflow server is at its connection limit and closed this connection, "
    "which had sent no request; retry",
)
FIRST_FRAME_LATE = (
    "firstFrameTimeout",
    "the connection sent no request within the first-frame deadline; reconnect to retry",
)


class ConnectionLimitsError(PiWorkflowsError):
    """A connection limit setting is not a positive number."""


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """How many client connections the listener keeps, and how long a silent one lives.

    The cap in force is `min(max_connections, descriptor limit // 2)`: the other half
    of the descriptors is for the database, logs, runners and their channels.
    """

    max_connections: int = DEFAULT_MAX_CONNECTIONS
    first_frame_s: float = DEFAULT_FIRST_FRAME_S

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ConnectionLimitsError("max_connections must be at least 1")
        if not self.first_frame_s > 0:
            raise ConnectionLimitsError("the first-frame deadline must be positive")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ConnectionLimits:
        """`PI_WORKFLOWS_MAX_CONNECTIONS` and `PI_WORKFLOWS_FIRST_FRAME_SECONDS`, or defaults.

        Raises:
            ConnectionLimitsError: a variable is set but not a positive number.
        """
        env = os.environ if environ is None else environ
        return cls(
            max_connections=int(_positive(env, MAX_CONNECTIONS_ENV, DEFAULT_MAX_CONNECTIONS, int)),
            first_frame_s=_positive(env, FIRST_FRAME_ENV, DEFAULT_FIRST_FRAME_S, float),
        )

    def cap(self, descriptor_limit: int) -> int:
        """The connection cap in force under a soft descriptor limit."""
        return max(1, min(self.max_connections, descriptor_limit // 2))


def _positive(
    env: Mapping[str, str], name: str, default: float, parse: Callable[[str], float]
) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = parse(raw)
    except ValueError:
        value = 0
    if not value > 0:
        raise ConnectionLimitsError(f"{name} must be a positive number, not {raw!r}")
    return value


def raise_descriptor_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; return the soft limit in force.

    The server holds one descriptor per connection, runner channel and log; the soft
    limit (often 1024) is the one that runs out, and only the hard limit is a policy.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = UNLIMITED_DESCRIPTORS if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    return UNLIMITED_DESCRIPTORS if soft == resource.RLIM_INFINITY else soft


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
    _reading: asyncio.BaseTransport | None = None
    """A child channel's reading half, on a descriptor of its own (`_ChannelReading`)."""
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
        if self.closed or self._writer.transport.is_closing():
            return  # closed, or a child channel's writing half failed: the child is gone
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
            if self._reading is not None:
                self._reading.close()

    def _refuse_now(self, refusal: tuple[str, str]) -> None:
        """Write what is queued (the hello), one `unavailable` event, then close (on the loop).

        Pending events are dropped. A peer that does not read cannot keep the
        descriptor: with bytes still unsent, the transport is aborted, not drained.
        """
        if self.closed:
            return
        while self._outbox:
            self._writer.write(self._outbox.popleft())
        self._writer.write(encode_frame(unavailable_event(self.connection_id, refusal)))
        self.closed = True
        self._wake.set()
        if self._writer.transport.get_write_buffer_size() > 0:
            self._writer.transport.abort()
        else:
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


class _ChannelReading(asyncio.Protocol):
    """A child channel's reading half: each frame goes to the handler as it is read.

    A child's frames are its proposals (a runner's last one may be a `node.finished`),
    so none may be lost because the child died. Frames are handed over in
    `data_received`, never left in a buffer that a later read error (ECONNRESET: the
    child died with a reply unread) would discard, and this half has a descriptor of
    its own, so a failed write of a reply never closes it. `ended` is set once, at end
    of file, a read error, bad framing or the channel's close.
    """

    def __init__(
        self, channel: Connection, handler: ChannelHandler, ended: asyncio.Future[None]
    ) -> None:
        self._channel = channel
        self._handler = handler
        self._decoder = FrameDecoder()
        self._transport: asyncio.BaseTransport | None = None
        self.ended = ended

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            for message in self._decoder.iter_feed(data):
                if self._channel.closed:
                    return
                self._handler.on_message(self._channel, message)
        except (FrameError, PiWorkflowsError) as exc:
            self._reject(exc)

    def eof_received(self) -> bool:
        try:
            self._decoder.finish()
        except FrameError as exc:
            self._reject(exc)
        return False  # the transport closes: connection_lost ends the reading

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ended.done():
            self.ended.set_result(None)

    def _reject(self, exc: Exception) -> None:
        log.warning(
            "closing a child channel after bad framing",
            extra={"action": "channel.rejected", "reason": type(exc).__name__},
        )
        if self._transport is not None:
            self._transport.close()


class _WritingHalf(asyncio.StreamReaderProtocol):
    """A child channel's writing half: it never reads (`_ChannelReading` does)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert isinstance(transport, asyncio.ReadTransport)
        transport.pause_reading()  # before the transport first watches for input


async def _open_writing_half(
    loop: asyncio.AbstractEventLoop, sock: socket.socket
) -> asyncio.StreamWriter:
    unread = asyncio.StreamReader(loop=loop)  # only carries a write error to `drain`
    protocol = _WritingHalf(unread, loop=loop)
    transport, _ = await loop.create_unix_connection(lambda: protocol, sock=sock)
    return asyncio.StreamWriter(transport, protocol, unread, loop)


@dataclass(eq=False, slots=True)
class _Slot:
    """One admitted connection's place under the cap; released once.

    A slot is silent (evictable) from the moment it is admitted, before its task has
    built the `Connection`: under a burst of accepts the tasks lag behind, and a
    cap full of not-yet-served slots must not turn a new client away.
    """

    client: socket.socket
    held: bool = True
    started: bool = False
    """Its task has handed `client` to asyncio: only the transport may close it now."""
    connection: Connection | None = None
    evicted: bool = False
    """Evicted before its connection existed: refuse it as soon as it does."""


class _Rejections:
    """Counts turned-away connections by reason and logs one summary per interval.

    A flood of bad clients writes one line per REJECTION_SUMMARY_S, not one per
    connection, so it cannot push the useful history out of the rotated log.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._counts: collections.Counter[str] = collections.Counter()
        self._since = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None
        self.total = 0
        """Every rejection since start (tests and status read it)."""

    def note(self, reason: str) -> None:
        self._counts[reason] += 1
        self.total += 1
        if self._timer is None:
            self._since = time.monotonic()
            self._timer = self._loop.call_later(REJECTION_SUMMARY_S, self.flush)

    def flush(self) -> None:
        """Log the summary of what was counted since the last one (on the loop)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._counts:
            return
        count = sum(self._counts.values())
        reasons = ",".join(f"{name}={n}" for name, n in sorted(self._counts.items()))
        elapsed = time.monotonic() - self._since
        log.warning(
            "%d client connections rejected in %.0f s (%s)",
            count,
            elapsed,
            reasons,
            extra={"action": "connection.rejected", "count": count, "reason": reasons},
        )
        self._counts.clear()


class LoopAddress:
    """An address on the listener's loop: what is told here is handled there, in order.

    The router's answers come back this way, as messages, so no router code ever runs
    on an actor's thread (a raise there would stop the actor).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, receive: Callable[[Any], None]) -> None:
        self._loop = loop
        self._receive = receive

    def tell(self, message: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: the server is stopping
            self._loop.call_soon_threadsafe(self._receive, message)


class ClientListener:
    """Accepts client connections on a Unix socket, in a thread of its own.

    **Limits:** at most `limits.cap(descriptor limit)` open client connections; one
    that sends no complete frame within `limits.first_frame_s` is closed. At the cap,
    a new connection replaces the oldest one that has sent nothing yet, or else is
    turned away. One descriptor is kept in reserve so that even at the process's
    descriptor limit an over-limit connection is accepted and closed with an error,
    and the listening socket never spins on EMFILE.

    **Blocking:** `start` returns once the socket accepts; `stop` waits at most
    CLOSE_TIMEOUT_S for connections to close.
    """

    def __init__(
        self,
        socket_path: Path,
        handler: ConnectionHandler | None,
        package_version: str,
        on_crash: Callable[[BaseException], None],
        *,
        limits: ConnectionLimits | None = None,
        descriptor_limit: int | None = None,
    ) -> None:
        self._path = socket_path
        self._handler = handler
        self._version = package_version
        self._on_crash = on_crash
        self.limits = limits or ConnectionLimits()
        if descriptor_limit is None:
            descriptor_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            if descriptor_limit == resource.RLIM_INFINITY:
                descriptor_limit = UNLIMITED_DESCRIPTORS
        self.max_connections = self.limits.cap(descriptor_limit)
        """The connection cap in force."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="client-listener", daemon=True)
        self._sock: socket.socket | None = None
        self._reserve: int | None = None
        self._bound: tuple[int, int] | None = None
        """(device, inode) of the socket file this listener bound."""
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._ids = itertools.count(1)
        self._connections: set[Connection] = set()
        self._admitted = 0
        self._closing_late = False
        """An evicted connection's transport still holds its descriptor (closed next pass)."""
        self._silent: dict[_Slot, None] = {}
        """Admitted slots whose connection has not sent a complete frame yet, oldest first."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._channels: set[Connection] = set()
        """Child channels being served (closed at shutdown, like client connections)."""
        self.rejections = _Rejections(self._loop)

    def address(self, receive: Callable[[Any], None]) -> LoopAddress:
        """An address whose messages `receive` handles on this listener's loop."""
        return LoopAddress(self._loop, receive)

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
        self._loop.set_exception_handler(_log_loop_error)
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
            self._close_sockets()
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
        # One descriptor per direction: asyncio closes a transport whose write fails, and
        # the reply to a pipelined frame may go to a child that has just written its next
        # frame and died (EPIPE). That frame is still in the socket, and must be read.
        writer = await _open_writing_half(self._loop, sock.dup())
        channel = Connection(name, self._loop, writer, _loop_thread_id=threading.get_ident())
        reading = _ChannelReading(channel, handler, self._loop.create_future())
        channel._reading, _ = await self._loop.create_unix_connection(lambda: reading, sock=sock)
        task = self._loop.create_task(self._serve_channel(channel, reading, handler))
        self._channels.add(channel)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return channel

    async def _serve_channel(
        self, channel: Connection, reading: _ChannelReading, handler: ChannelHandler
    ) -> None:
        writer_task = self._loop.create_task(channel._write_loop())
        try:
            await reading.ended
        finally:
            self._channels.discard(channel)
            channel._close_now()
            writer_task.cancel()
            with contextlib.suppress(BaseException):
                await writer_task
            try:
                handler.on_close(channel)
            except Exception:
                log.exception("channel close handler failed", extra={"action": "listener.error"})

    async def _listen(self) -> None:
        self._sock = bind_private_socket(self._path)
        bound = self._path.stat()
        self._bound = (bound.st_dev, bound.st_ino)
        self._reserve = _open_reserve()
        self._loop.add_reader(self._sock.fileno(), self._on_acceptable)

    # --- accepting -----------------------------------------------------------------------

    def _on_acceptable(self) -> None:
        """Accept what is waiting (a bounded batch); never raise, never spin."""
        sock = self._sock
        if sock is None:
            return
        self._closing_late = False  # a new loop pass: earlier evictions have closed
        for _ in range(ACCEPT_BATCH):
            if self._closing_late:
                # An evicted transport closes its socket on the next loop pass; end the
                # batch so that descriptor is free before the next accept needs one.
                return
            try:
                client, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno not in _OUT_OF_DESCRIPTORS:
                    self.rejections.note("acceptError")
                    self._pause_accepting()
                    return
                refused = self._refuse_with_reserve(sock)
                if refused is None:
                    return  # nothing was waiting after all
                if not refused:
                    self.rejections.note("descriptorLimit")
                    self._pause_accepting()  # not even the reserve: wait, do not spin
                    return
                continue
            self._admit(client)

    def _refuse_with_reserve(self, sock: socket.socket) -> bool | None:
        """At the descriptor limit: free the reserve, accept one, refuse it, take it back.

        Returns:
            True when one connection was refused; None when none was waiting; False
            when there was no reserve to free (something else took the descriptor).
        """
        if self._reserve is None:
            self._reserve = _open_reserve()
            if self._reserve is None:
                return False
        os.close(self._reserve)
        self._reserve = None
        try:
            client: socket.socket | None = sock.accept()[0]
        except OSError:
            client = None
        if client is not None:
            self._refuse_socket(client, "descriptorLimit")  # closes it: the slot is free
        self._reserve = _open_reserve()
        return None if client is None else True

    def _pause_accepting(self) -> None:
        sock = self._sock
        if sock is None:
            return
        self._loop.remove_reader(sock.fileno())
        self._loop.call_later(ACCEPT_PAUSE_S, self._resume_accepting)

    def _resume_accepting(self) -> None:
        if self._sock is not None:
            self._loop.add_reader(self._sock.fileno(), self._on_acceptable)

    def _admit(self, client: socket.socket) -> None:
        if self._admitted >= self.max_connections and not self._evict_oldest_silent():
            self._refuse_socket(client, "connectionLimit")
            return
        self._admitted += 1
        slot = _Slot(client)
        self._silent[slot] = None
        task = self._loop.create_task(self._serve_socket(client, slot))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _evict_oldest_silent(self) -> bool:
        """Close the oldest connection that has sent nothing, to admit a new one."""
        if not self._silent:
            return False
        slot = next(iter(self._silent))
        del self._silent[slot]
        self._release(slot)
        slot.evicted = True
        if not slot.started:
            # Its task has not run: refuse and close the socket now, so a burst of
            # accepts cannot hold the descriptors of slots evicted before serving.
            self._refuse_socket(slot.client, "evictedSilent", EVICTED_AT_CAP)
            return True
        if slot.connection is not None:
            slot.connection._refuse_now(EVICTED_AT_CAP)
        # else its task refuses it once the connection exists
        self._closing_late = True
        self.rejections.note("evictedSilent")
        return True

    def _release(self, slot: _Slot) -> None:
        if slot.held:
            slot.held = False
            self._admitted -= 1

    def _refuse_socket(
        self, client: socket.socket, reason: str, refusal: tuple[str, str] = REFUSED_AT_CAP
    ) -> None:
        """Send a hello and one `unavailable` event to a connection never served; close it."""
        connection_id = f"connection-{next(self._ids)}"
        frames = encode_frame(self._hello(connection_id)) + encode_frame(
            unavailable_event(connection_id, refusal)
        )
        try:
            client.setblocking(False)
            client.send(frames)  # one small write into an empty buffer; never waits
        except OSError:
            pass
        finally:
            client.close()
        self.rejections.note(reason)

    async def _serve_socket(self, client: socket.socket, slot: _Slot) -> None:
        if slot.evicted:
            return  # refused and closed at its eviction, before this task ran
        slot.started = True
        try:
            try:
                reader, writer = await asyncio.open_unix_connection(sock=client)
            except OSError:
                client.close()
                return
            await self._serve(reader, writer, slot)
        finally:
            self._silent.pop(slot, None)
            self._release(slot)

    # --- stopping ------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        if self._sock is not None:
            self._loop.remove_reader(self._sock.fileno())
        self._close_sockets()
        for connection in [*self._connections, *self._channels]:
            connection._close_now()  # a child channel's owner hears `on_close`
        with contextlib.suppress(FileNotFoundError):
            there = self._path.stat()
            # Only our own file: a server that lost its lease to another (after a stall)
            # must not remove the socket its successor bound at the same path.
            if (there.st_dev, there.st_ino) == self._bound:
                self._path.unlink()
        self.rejections.flush()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=CLOSE_TIMEOUT_S)

    def _close_sockets(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None

    # --- one connection ------------------------------------------------------------------

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slot: _Slot
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        connection = Connection(
            f"connection-{next(self._ids)}",
            self._loop,
            writer,
            _loop_thread_id=threading.get_ident(),
        )
        self._connections.add(connection)
        slot.connection = connection
        writer_task = self._loop.create_task(connection._write_loop())
        try:
            connection._outbox.append(encode_frame(self._hello(connection.connection_id)))
            connection._wake.set()
            if slot.evicted:
                connection._refuse_now(EVICTED_AT_CAP)
            self._require_handler().on_connect(connection)
            await self._read_requests(connection, slot, AsyncFrameReader(reader))
        except (ConnectionError, OSError):
            pass  # the peer went away; nothing to answer
        finally:
            self._silent.pop(slot, None)
            connection._close_now()
            writer_task.cancel()
            with contextlib.suppress(BaseException):
                await writer_task
            self._connections.discard(connection)
            try:
                self._require_handler().on_disconnect(connection)
            except Exception:
                log.exception("disconnect handler failed", extra={"action": "listener.error"})

    def _hello(self, connection_id: str) -> dict[str, Any]:
        return {
            "schema": CLIENT_SCHEMA,
            "type": "hello",
            "connectionId": connection_id,
            "packageVersion": self._version,
        }

    async def _first_message(
        self, connection: Connection, slot: _Slot, frames: AsyncFrameReader
    ) -> dict[str, Any] | None:
        """The first frame, within the deadline; a late connection is refused and closed."""
        try:
            async with asyncio.timeout(self.limits.first_frame_s):
                return await frames.read_message()
        except TimeoutError:
            if not connection.closed:  # an evicted connection was counted already
                connection._refuse_now(FIRST_FRAME_LATE)
                self.rejections.note("firstFrameTimeout")
            return None
        finally:
            self._silent.pop(slot, None)

    async def _read_requests(
        self, connection: Connection, slot: _Slot, frames: AsyncFrameReader
    ) -> None:
        first = True
        while not connection.closed:
            await connection._slots.acquire()  # backpressure: stop reading a flooding peer
            try:
                if first:
                    first = False
                    message = await self._first_message(connection, slot, frames)
                else:
                    message = await frames.read_message()
            except (FrameError, PiWorkflowsError) as exc:
                self.rejections.note(type(exc).__name__)
                return
            if message is None:
                return
            try:
                checked = client_message_from_wire(message)
            except ProtocolViolation as exc:
                if unknown_operation(message) is None:
                    self.rejections.note(f"schema.{exc.keyword or 'invalid'}")
                    return
                # A well-formed request for an operation outside the vocabulary: the
                # router answers it `rejected` with the name; the connection stays.
                checked = cast(RequestMessage, message)
            if checked["type"] != "request":
                self.rejections.note("notARequest")
                return
            try:
                self._require_handler().on_request(connection, checked)
            except Exception:
                log.exception("request handler failed", extra={"action": "listener.error"})
                return


def offer_event_frames(
    offers: Sequence[tuple[Connection, str, bytes]],
    handed_over: Callable[[], None] | None = None,
) -> None:
    """Offer many subscriptions' framed events in one hand-over to the loop (any thread).

    Each replaces that subscription's unwritten event, as `Connection.offer_event` does.
    `handed_over` runs on the loop once every frame is queued: from then on a drained
    connection (`is_drained`) has written them, so the caller knows what the client got.
    """
    if not offers:
        return
    loop = offers[0][0]._loop

    def queue_all() -> None:
        for connection, subscription_id, frame in offers:
            connection._queue_event(subscription_id, frame)
        if handed_over is not None:
            handed_over()

    with contextlib.suppress(RuntimeError):  # the loop closed: the server is stopping
        loop.call_soon_threadsafe(queue_all)


def unavailable_event(connection_id: str, refusal: tuple[str, str]) -> dict[str, Any]:
    """The connection-level `unavailable` event: why the server is closing this connection.

    It is scoped to the connection (its `subscriptionId` is the connection ID from the
    hello), so a client tells it apart from a subscription's events.
    """
    code, message = refusal
    return {
        "schema": CLIENT_SCHEMA,
        "type": "event",
        "subscriptionId": connection_id,
        "kind": "unavailable",
        "revision": 0,
        "payload": {"code": code, "message": message},
    }


def _open_reserve() -> int | None:
    """One spare descriptor, closed only to accept and refuse at the descriptor limit."""
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def _log_loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """asyncio's exception handler: one safe line to the rotated log, never a traceback.

    Only the text before any repr (a callback's arguments could hold client bytes) and
    the exception's class are kept.
    """
    message = str(context.get("message", "asyncio error"))
    for mark in "(<{[:":
        message = message.split(mark, 1)[0]
    exc = context.get("exception")
    loop_log.error(
        "listener loop: %s",
        message.strip()[:120] or "asyncio error",
        extra={
            "action": "listener.loop_error",
            "reason": type(exc).__name__ if isinstance(exc, BaseException) else None,
        },
    )


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
    sock.listen(LISTEN_BACKLOG)
    sock.setblocking(False)
    return sock
