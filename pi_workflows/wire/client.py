"""`WorkflowClient`: the one way every client talks to the server. It never opens SQLite.

Implements client-protocol.md § Envelope and § Commands and uncertain results:
fresh request IDs per transport attempt, stable idempotency keys, one reconnect
and retry after a lost connection that adopts the stored receipt. It speaks over the
server's Unix socket, or over a `piw serve` relay URL (§ Transports) the same way.
"""

from __future__ import annotations

import itertools
import socket
import subprocess
import sys
import time
import typing
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from pi_workflows._version import __version__
from pi_workflows.errors import PiWorkflowsError
from pi_workflows.wire import hydrate
from pi_workflows.wire._websocket import (
    RelayOpenError,
    RelayTransport,
    RelayURLError,
    check_relay_url,
)
from pi_workflows.wire.framing import FrameError, SocketFrameReader, encode_frame
from pi_workflows.wire.protocol import (
    CLIENT_SCHEMA,
    ProtocolViolation,
    ResponseMessage,
    client_message_from_wire,
    unknown_operation,
    validate,
)
from pi_workflows.wire.run_list import PAGE_ITEMS as RUN_LIST_PAGE_ITEMS
from pi_workflows.wire.run_list import RunList, collect_run_list

if typing.TYPE_CHECKING:  # `live` imports this module
    from pi_workflows.wire.live import LiveViews
    from pi_workflows.wire.views import RunView

__all__ = [
    "DEFAULT_REQUEST_TIMEOUT_S",
    "HostUnavailableError",
    "InvalidRequestError",
    "PackageMismatchError",
    "RelayURLError",
    "RequestFailedError",
    "WorkflowClient",
    "socket_path_for",
]

DEFAULT_REQUEST_TIMEOUT_S = 30.0
SERVER_START_TIMEOUT_S = 15.0
CONNECT_RETRY_S = 0.005
"""First pause before connecting again when the server's accept queue is full."""


class HostUnavailableError(PiWorkflowsError):
    """`hostUnavailable`: the client cannot reach or start the server."""

    retryable = True
    server_answered = False
    """True when a live server answered and refused the connection (at its cap)."""


class PackageMismatchError(PiWorkflowsError):
    """The server speaks another protocol or runs another package version."""


class InvalidRequestError(PiWorkflowsError):
    """The request's envelope would be invalid (`pi-workflows.client.v1`); nothing was sent.

    Raised before connecting, so a bad argument (an empty or over-long run ID, say)
    never reaches the server, which would close the connection on it. `field` names
    the envelope field (`runId`, `idempotencyKey`, ...), or is empty.
    """

    def __init__(self, operation: str, violation: ProtocolViolation) -> None:
        location = violation.location.lstrip("/")
        top = location.split("/", 1)[0]
        if top == "payload" and location != top:
            subject = f"the payload at /{location}"
        else:
            subject = _FIELD_WORDS.get(top, "the request envelope")
        detail = str(violation).rsplit(": ", 1)[-1]
        rule = _FIELD_RULES.get(top, "")
        shown = operation if len(operation) <= 64 else operation[:64] + "..."
        super().__init__(
            f"{subject} is invalid ({detail}{rule}); the {shown!r} request was not sent"
        )
        self.field = top
        self.operation = operation


_ID_RULE = "; an ID is 1 to 256 characters without control characters"
_FIELD_WORDS = {
    "runId": "the run ID",
    "clientId": "the client ID",
    "idempotencyKey": "the idempotency key",
    "requestId": "the request ID (made from the client ID)",
    "operation": "the operation name",
    "expectedRevision": "the expected revision",
    "payload": "the payload",
}
_FIELD_RULES = {
    "runId": _ID_RULE,
    "clientId": _ID_RULE,
    "idempotencyKey": _ID_RULE,
    "requestId": _ID_RULE,
    "operation": "; an operation is dotted lowerCamelCase, such as run.get",
    "expectedRevision": "; a revision is an integer from 0 to 2**53 - 1",
}


class RequestFailedError(PiWorkflowsError):
    """The server answered with an outcome other than accepted or adopted."""

    def __init__(self, response: ResponseMessage) -> None:
        error = response.get("error")
        message = error["message"] if error else response["outcome"]
        super().__init__(message)
        self.outcome = response["outcome"]
        self.code = error["code"] if error else response["outcome"]
        self.response = response


def socket_path_for(state_dir: Path) -> Path:
    """Return the server socket of a state folder: `<state dir>/host/host.sock`."""
    return state_dir / "host" / "host.sock"


@dataclass
class WorkflowClient:
    """A connection to the workflow server for one client identity.

    Args:
        state_dir: the workflow state folder, `<agent dir>/workflows`.
        client_id: Stable client identity used in receipts; random when omitted.
        autostart: Start the server through `pi-workflows server start` when it is
            not running.
        timeout: Seconds to wait for one response.
        connect_on_enter: `with client:` connects at once (False: at the first
            request, so an invalid first request starts no server).
        url: a `piw serve` relay (`ws://127.0.0.1:PORT/ws`, loopback only) to talk
            through instead of the state folder's socket; `autostart` never applies
            to it (a relay cannot start a server).

    **Blocking:** every method blocks the calling thread, at most `timeout` seconds
    per attempt. Not thread-safe: use one client per thread.
    """

    state_dir: Path
    client_id: str = field(default_factory=lambda: f"client-{uuid.uuid4().hex[:12]}")
    autostart: bool = True
    timeout: float = DEFAULT_REQUEST_TIMEOUT_S
    connect_on_enter: bool = True
    url: str | None = None
    connection_id: str | None = None
    connections: int = 0
    """Connections opened so far; a change means the server forgot this client's
    subscriptions (connection IDs are per server, so they can repeat)."""
    event_sink: Callable[[dict[str, Any]], None] | None = None
    """Receives the events read while waiting for a response (dropped when None);
    `LiveViews` keeps them, so a subscription's events are never lost to a request."""
    # A relay's transport stands in for both the socket and its reader.
    _sock: socket.socket | RelayTransport | None = None
    _reader: SocketFrameReader | RelayTransport | None = None
    _counter: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _waiter: LiveViews | None = field(default=None, init=False, repr=False)
    """The subscriptions `wait` follows, on a connection of their own (made at the
    first `wait`, closed with this client)."""

    def __post_init__(self) -> None:
        if self.url is not None:
            check_relay_url(self.url)  # refused before anything is sent

    @property
    def is_connected(self) -> bool:
        """True while a connection is open (it may still be lost at the next read)."""
        return self._sock is not None

    @property
    def socket_path(self) -> Path:
        """The server socket this client uses."""
        return socket_path_for(self.state_dir)

    def connect(self) -> None:
        """Connect (starting the server when allowed) and check its hello.

        Raises:
            HostUnavailableError: no server answers and none could be started (over a
                relay: the relay or its server does not answer; none is ever started).
            PackageMismatchError: the server runs another protocol or version.
        """
        if self._sock is not None:
            return
        if self.url is not None:
            self._open_relay(self.url)
            return
        try:
            self._open()
        except _RefusedError:
            raise  # a server answered: starting one would not help
        except (OSError, HostUnavailableError):
            if not self.autostart:
                raise HostUnavailableError(
                    "the workflow server is not running; start it with `pi-workflows server start`"
                ) from None
            start_server(self.state_dir)
            self._open()

    def close(self) -> None:
        """Close the connection (a later request reconnects), and `wait`'s."""
        if self._waiter is not None:
            waiter, self._waiter = self._waiter, None
            waiter.close()
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
                self._reader = None

    def __enter__(self) -> WorkflowClient:
        if self.connect_on_enter:
            self.connect()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def request(
        self,
        operation: str,
        payload: Mapping[str, Any] | None = None,
        *,
        run_id: str | None = None,
        expected_revision: int | None = None,
        idempotency_key: str | None = None,
    ) -> ResponseMessage:
        """Send one operation and return its response, whatever the outcome.

        **Idempotency:** one key for all attempts; after a lost connection the
        client reconnects once and retries with a new request ID and the same key,
        so a command the server already committed is adopted, not repeated.

        Raises:
            InvalidRequestError: the envelope would be invalid; nothing was sent and no
                server was started.
            HostUnavailableError: the server could not be reached twice in a row.
        """
        key = f"{self.client_id}-{uuid.uuid4().hex}" if idempotency_key is None else idempotency_key
        request: dict[str, Any] = {
            "schema": CLIENT_SCHEMA,
            "type": "request",
            "clientId": self.client_id,
            "operation": operation,
            "idempotencyKey": key,
            "payload": dict(payload or {}),
        }
        if run_id is not None:
            request["runId"] = run_id
        if expected_revision is not None:
            request["expectedRevision"] = expected_revision
        first = self._attempt(request)
        for attempt in (1, 2):
            try:
                self.connect()
                return self._round_trip(first if attempt == 1 else self._attempt(request))
            except (OSError, FrameError, _ConnectionLostError) as exc:
                self.close()
                if attempt == 2 and isinstance(exc, _ConnectionRefusedError):
                    raise HostUnavailableError(str(exc)) from None
                if attempt == 2:
                    raise HostUnavailableError(
                        f"lost the connection to the workflow server ({type(exc).__name__}); "
                        "check `pi-workflows server status`"
                    ) from None
        raise AssertionError("unreachable")

    def call(
        self,
        operation: str,
        payload: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> ResponseMessage:
        """Like `request`, but raise `RequestFailedError` unless accepted or adopted."""
        response = self.request(operation, payload, **options)
        if response["outcome"] not in ("accepted", "adopted"):
            raise RequestFailedError(response)
        return response

    def live(self, **options: Any) -> LiveViews:
        """A `LiveViews` for this client's state folder and identity (its own
        connection): `for view in client.live().watch_run(run_id): ...`. `options` go
        to `LiveViews` (`reconnect_timeout`, `timeout`, `autostart`, `url`)."""
        from pi_workflows.wire.live import LiveViews  # noqa: PLC0415 (it imports this module)

        defaults: dict[str, Any] = {
            "client_id": f"{self.client_id}-live",
            "autostart": self.autostart,
            "timeout": self.timeout,
            "url": self.url,
        }
        return LiveViews(self.state_dir, **{**defaults, **options})

    def wait(
        self,
        run_id: str,
        *,
        timeout: float | None = None,
        reconnect_timeout: float | None = None,
    ) -> RunView:
        """Wait until the run settles and return its settled `pi-workflows.run-view.v1`.

        Settled: terminal (completed, failed, timed_out, cancelled) or needing someone
        (waiting, paused, ambiguous, parked for a reason only an operator clears;
        `views.is_settled`). It follows the run's subscription (`view.subscribe`), never
        polls `run.get`: it returns as soon as the server commits the settling change.
        A run already settled returns at once. A lost server is reconnected (never
        started) and the subscription resumed from the revision held, for at most
        `reconnect_timeout` seconds of outage (default: `LiveViews`'s, 120 s). The
        subscription has a connection of its own, opened at the first wait and kept
        for the next until `close()`.

        Raises:
            RunNotFoundError: there is no such run (`pi_workflows.RunNotFoundError`).
            ViewUnavailableError: the run was pruned while it was waited for.
            WatchTimeoutError: `timeout` seconds passed first; the run goes on.
            HostUnavailableError: no server could be reached (or started, with
                `autostart`), or it stayed unreachable for `reconnect_timeout` seconds.
        """
        if self._waiter is None:
            self._waiter = self.live()
        if reconnect_timeout is not None:
            self._waiter.reconnect_timeout = reconnect_timeout
        return self._waiter.wait_run(run_id, timeout=timeout)

    def list_runs(
        self,
        *,
        status: Sequence[str] | None = None,
        workflow: str | None = None,
        project: str | None = None,
        since_ms: int | None = None,
        until_ms: int | None = None,
        limit: int | None = None,
        page_items: int = RUN_LIST_PAGE_ITEMS,
        on_page: Callable[[Mapping[str, Any]], None] | None = None,
    ) -> RunList:
        """The run list (newest first) from `run.list` pages of one revision.

        Filters: display `status` (any of), `workflow` name, exact `project` path,
        creation time in `[since_ms, until_ms)`; at most `limit` runs. See
        `collect_run_list` (pi_workflows/wire/run_list.py).
        """
        return collect_run_list(
            self,
            status=status,
            workflow=workflow,
            project=project,
            since_ms=since_ms,
            until_ms=until_ms,
            limit=limit,
            page_items=page_items,
            on_page=on_page,
        )

    def run_page(
        self,
        run_id: str,
        name: str,
        *,
        revision: int,
        cursor: str | None = None,
        attempt_id: str | None = None,
    ) -> hydrate.RunPage:
        """One `view.page` window (`pi-workflows.run-page.v1`) of a run's `trace`,
        `transitions` or `graphSteps`; apply it only if its `cursor` and `revision`
        match the request and the view you hold."""
        payload: dict[str, Any] = {"list": name, "revision": revision}
        if cursor is not None:
            payload["cursor"] = cursor
        if attempt_id is not None:
            payload["attemptId"] = attempt_id
        return cast(hydrate.RunPage, self.call("view.page", payload, run_id=run_id)["receipt"])

    def run_content(self, run_id: str, ref: Mapping[str, Any]) -> bytes:
        """The complete bytes of a content reference of a run view, verified
        (wire/hydrate.py `load_content`; raises `ContentVerificationError`)."""
        return hydrate.load_content(self, run_id, ref)

    def hydrated_run_view(self, run_id: str) -> dict[str, Any]:
        """The run view with every trace page of one revision and every referenced
        value loaded and verified (wire/hydrate.py `hydrate_run_view`)."""
        return hydrate.hydrate_run_view(self, run_id)

    def send_raw(self, data: bytes) -> None:
        """Write bytes as they are (tests use it to send malformed frames)."""
        self.connect()
        assert self._sock is not None
        self._sock.sendall(data)

    def set_read_timeout(self, seconds: float | None) -> None:
        """Bound the next reads (None: the client's request timeout)."""
        if self._sock is not None:
            self._sock.settimeout(self.timeout if seconds is None else max(seconds, 0.001))

    def read_message(self) -> dict[str, Any] | None:
        """Read the next message of any type (events included); None at end of stream."""
        assert self._reader is not None, "connect first"
        return self._reader.read_message()

    def _attempt(self, request: dict[str, Any]) -> dict[str, Any]:
        """One transport attempt of `request`: a fresh request ID, checked before sending.

        The server closes a connection on an invalid envelope; checking here turns that
        into an `InvalidRequestError` naming the field (the request is the caller's own).
        """
        request_id = f"{self.client_id}-r{next(self._counter)}-{uuid.uuid4().hex[:8]}"
        attempt = {**request, "requestId": request_id}
        try:
            validate("client.v1", attempt)
        except ProtocolViolation as exc:
            if unknown_operation(attempt) is None:
                raise InvalidRequestError(str(request["operation"]), exc) from None
            # Only the name is unknown: the server answers it `rejected` and keeps the
            # connection, which tells the caller more than a local refusal would.
        return attempt

    def _round_trip(self, request: dict[str, Any]) -> ResponseMessage:
        assert self._sock is not None and self._reader is not None
        request_id = request["requestId"]
        self._sock.sendall(encode_frame(request))
        while True:
            message = self._reader.read_message()
            if message is None:
                raise _ConnectionLostError
            checked = client_message_from_wire(message)
            if checked["type"] == "response" and checked["requestId"] == request_id:
                return checked
            if _is_refusal(checked, self.connection_id):
                raise _ConnectionRefusedError(_refusal_text(checked))
            if checked["type"] == "event" and self.event_sink is not None:
                self.event_sink(dict(checked))
            # stale responses of an abandoned attempt are not ours to settle

    def _open(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            _connect(sock, str(self.socket_path), self.timeout)
            reader = SocketFrameReader(sock)
            hello = reader.read_message()
        except OSError:
            sock.close()
            raise
        except FrameError as exc:
            sock.close()
            raise HostUnavailableError(f"the server sent a bad hello: {exc}") from None
        if hello is None:
            sock.close()
            raise HostUnavailableError("the server closed the connection before its hello")
        self._adopt(sock, reader, hello)

    def _open_relay(self, url: str) -> None:
        """Open a WebSocket to the relay and check the server's hello through it.

        Every failure is a `HostUnavailableError` saying what to do: the caller cannot
        start a server behind a relay.
        """
        try:
            transport = RelayTransport.open(url, self.timeout)
        except RelayOpenError as exc:
            raise HostUnavailableError(str(exc)) from None
        try:
            hello = transport.read_message()
        except (OSError, FrameError) as exc:
            transport.close()
            raise HostUnavailableError(
                f"the relay at {url} sent no hello from the server ({type(exc).__name__})"
            ) from None
        if hello is None:
            transport.close()
            raise HostUnavailableError(transport.refusal_text(url))
        self._adopt(transport, transport, hello)

    def _adopt(
        self,
        sock: socket.socket | RelayTransport,
        reader: SocketFrameReader | RelayTransport,
        hello: dict[str, Any],
    ) -> None:
        """Check the hello and any refusal after it; keep the connection if neither fails."""
        self._check_hello(sock, hello)
        refusal = reader.peek_buffered()  # a refused connection gets hello + refusal at once
        if refusal is not None and _is_refusal(refusal, self.connection_id):
            sock.close()
            raise _RefusedError(_refusal_text(refusal))
        self._sock = sock
        self._reader = reader
        self.connections += 1

    def _check_hello(self, sock: socket.socket | RelayTransport, hello: dict[str, Any]) -> None:
        try:
            checked = client_message_from_wire(hello)
        except ProtocolViolation:
            sock.close()
            raise PackageMismatchError(
                "the workflow server speaks another protocol; install matching "
                "pi-workflows packages"
            ) from None
        if checked["type"] != "hello":
            sock.close()
            raise PackageMismatchError("the workflow server did not start with a hello")
        if checked["packageVersion"] != __version__:
            sock.close()
            raise PackageMismatchError(
                f"the workflow server runs pi-workflows {checked['packageVersion']}, this "
                f"client is {__version__}; stop it with `pi-workflows server stop` and "
                "install matching packages"
            )
        self.connection_id = checked["connectionId"]


def _connect(sock: socket.socket, path: str, timeout: float) -> None:
    """Connect, waiting while the server's accept queue is full.

    A Unix socket with a timeout fails at once with EAGAIN when the listener's backlog
    is full (a burst of connections); that is a busy server, not a missing one.
    """
    deadline = time.monotonic() + timeout
    pause = CONNECT_RETRY_S
    while True:
        try:
            sock.connect(path)
            return
        except BlockingIOError:
            if time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)  # the client's own thread; nothing else waits on it
            pause = min(pause * 2, 0.1)


class _ConnectionLostError(Exception):
    """The server closed the connection before answering."""


class _ConnectionRefusedError(_ConnectionLostError):
    """The server said why it closes this connection (an `unavailable` event)."""


class _RefusedError(HostUnavailableError):
    """The server refused the connection right after its hello (at its connection cap)."""

    server_answered = True


def _is_refusal(message: Mapping[str, Any], connection_id: str | None) -> bool:
    """The connection-level `unavailable` event: its subscription ID is the connection's."""
    return (
        message.get("type") == "event"
        and message.get("kind") == "unavailable"
        and message.get("subscriptionId") == connection_id
    )


def _refusal_text(message: Mapping[str, Any]) -> str:
    payload = message.get("payload")
    text = payload.get("message") if isinstance(payload, dict) else None
    code = payload.get("code") if isinstance(payload, dict) else None
    return f"the workflow server refused the connection ({code}): {str(text)[:300]}"


def start_server(state_dir: Path, timeout: float = SERVER_START_TIMEOUT_S) -> None:
    """Run `pi-workflows server start` for `state_dir`; it returns after the ready handshake.

    Raises:
        HostUnavailableError: the server did not become ready in time.
    """
    command = [
        sys.executable,
        "-m",
        "pi_workflows.cli",
        "--state-dir",
        str(state_dir),
        "server",
        "start",
    ]
    try:
        result = subprocess.run(
            command, capture_output=True, timeout=timeout, check=False, text=True
        )
    except subprocess.TimeoutExpired:
        raise HostUnavailableError(
            f"the workflow server did not start within {timeout:.0f} s"
        ) from None
    if result.returncode != 0:
        detail = (result.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise HostUnavailableError(f"could not start the workflow server: {detail}")
