"""The client's transport over a `piw serve` relay: one WebSocket, one canonical JSON
object per text frame.

Implements client-protocol.md § Transports (the remote transport at `/ws`) for Python
clients. `RelayTransport` offers what a Unix socket and its `SocketFrameReader` offer the
client (send frames, read one message within a timeout, peek, close), so the socket's hot
path stays as it is. Only loopback URLs are accepted: another machine's relay is reached
through an SSH tunnel.
"""

from __future__ import annotations

import ipaddress
from collections import deque
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from pi_workflows.errors import PiWorkflowsError
from pi_workflows.wire.framing import MAX_FRAME_BYTES, FrameError, decode_frame

if TYPE_CHECKING:  # websockets loads only when a relay URL is opened
    from websockets.frames import Close
    from websockets.sync.client import ClientConnection

__all__ = [
    "LOOPBACK_HOSTS",
    "RelayOpenError",
    "RelayTransport",
    "RelayURLError",
    "check_relay_url",
    "is_loopback",
    "normalize_host",
]

LOOPBACK_HOSTS: Final = frozenset({"127.0.0.1", "::1", "localhost"})
"""The hosts a relay URL may name (`piw serve` binds only these)."""
CLOSE_TIMEOUT_S: Final = 2.0
"""How long `close` waits for the relay's closing handshake."""
TRY_AGAIN_LATER: Final = 1013
"""The close code of a relay with no server behind it."""


class RelayURLError(PiWorkflowsError, ValueError):
    """A relay URL that is not `ws://` to a loopback host."""


class RelayOpenError(ConnectionError):
    """The relay could not be reached, or it closed the WebSocket before the hello."""


def check_relay_url(url: str) -> str:
    """Return `url` if it is `ws://HOST:PORT/...` with a loopback HOST.

    Raises:
        RelayURLError: another scheme, a missing port, or a non-loopback host.
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise RelayURLError("the relay URL is malformed; use ws://127.0.0.1:PORT/ws") from None
    if parts.scheme != "ws" or port is None or parts.hostname is None:
        raise RelayURLError(
            "the relay URL must be ws://HOST:PORT/ws (such as ws://127.0.0.1:9377/ws)"
        )
    if not is_loopback(parts.hostname):
        raise RelayURLError(
            "the relay URL must name a loopback host (127.0.0.1, ::1 or localhost); "
            "to reach another machine's relay, forward its port with `ssh -L`"
        )
    return url


def is_loopback(host: str) -> bool:
    """True for 127.0.0.1, ::1 (however written) and localhost: the only hosts a relay
    listens on or a client connects to."""
    return normalize_host(host) in LOOPBACK_HOSTS


def normalize_host(host: str) -> str:
    """`0:0::1` → `::1`; names stay as written (only `localhost` is accepted)."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.lower()


class RelayTransport:
    """One WebSocket to a relay, shaped like a socket and its frame reader.

    **Failure:** a closed WebSocket reads as the end of stream (None) and fails sends
    with `ConnectionResetError`, as a closed socket does; a timeout raises `TimeoutError`.
    """

    def __init__(self, connection: ClientConnection, timeout: float) -> None:
        self._ws = connection
        self._timeout: float | None = timeout
        self._ready: deque[dict[str, Any]] = deque()
        self._failed: FrameError | None = None
        """A bad frame met by `peek_buffered`, raised by the next read."""
        self.closed_with: Close | None = None
        """The relay's close frame, once the WebSocket has ended."""

    @classmethod
    def open(cls, url: str, timeout: float) -> RelayTransport:
        """Open the WebSocket (the handshake within `timeout` seconds).

        Raises:
            RelayOpenError: no relay answers, or it refused the handshake.
        """
        from websockets.exceptions import (  # noqa: PLC0415 (loads only for a relay URL)
            InvalidHandshake,
            InvalidStatus,
            InvalidURI,
        )
        from websockets.sync.client import connect  # noqa: PLC0415

        try:
            connection = connect(
                url,
                open_timeout=timeout,
                close_timeout=CLOSE_TIMEOUT_S,
                max_size=MAX_FRAME_BYTES,
                compression=None,  # the relay offers none; canonical JSON is small anyway
                proxy=None,  # loopback only: an HTTP proxy of the environment never applies
            )
        except InvalidStatus as exc:
            status = exc.response.status_code
            raise RelayOpenError(
                f"{url} is not a relay endpoint (HTTP {status}); `piw serve` serves ws://HOST:PORT/ws"
            ) from None
        except (InvalidHandshake, InvalidURI) as exc:
            raise RelayOpenError(
                f"{url} did not answer as a WebSocket relay ({type(exc).__name__})"
            ) from None
        except OSError as exc:  # refused, reset, or the handshake timed out
            raise RelayOpenError(
                f"no relay answers at {url} ({type(exc).__name__}); start `piw serve` "
                "there (through `ssh -L` for another machine)"
            ) from None
        # websockets 17.1 and later want a direct connection entered as a context
        # manager (it warns otherwise); `close` is its exit.
        return cls(connection.__enter__(), timeout)

    # --- the socket's side -----------------------------------------------------------

    def sendall(self, data: bytes) -> None:
        """Send each newline-ended frame of `data` as one text frame."""
        from websockets.exceptions import ConnectionClosed  # noqa: PLC0415 (loaded by open)

        try:
            for body in data.rstrip(b"\n").split(b"\n"):
                self._ws.send(body, text=True)
        except ConnectionClosed as exc:
            self.closed_with = exc.rcvd
            raise ConnectionResetError("the relay closed the WebSocket") from None

    def settimeout(self, seconds: float | None) -> None:
        """Bound the next reads (None: wait without a bound)."""
        self._timeout = seconds

    def close(self) -> None:
        """Close the WebSocket (the relay closes its server connection with it)."""
        self._ws.close()

    # --- the reader's side -----------------------------------------------------------

    def read_message(self) -> dict[str, Any] | None:
        """The next message, or None once the WebSocket has closed.

        Raises:
            FrameError: a frame is not one canonical JSON object.
            TimeoutError: nothing arrived within the timeout.
        """
        if self._ready:
            return self._ready.popleft()
        if self._failed is not None:
            raise self._failed
        return self._receive(self._timeout)

    def peek_buffered(self) -> dict[str, Any] | None:
        """The next message already received, without waiting (None if none)."""
        if not self._ready:
            if self._failed is not None:
                return None
            try:
                message = self._receive(0)
            except TimeoutError:
                return None
            except FrameError as exc:
                self._failed = exc
                return None
            if message is None:
                return None
            self._ready.append(message)
        return self._ready[0]

    def _receive(self, timeout: float | None) -> dict[str, Any] | None:
        from websockets.exceptions import ConnectionClosed  # noqa: PLC0415 (loaded by open)

        try:
            body = self._ws.recv(timeout=timeout, decode=False)
        except ConnectionClosed as exc:
            self.closed_with = exc.rcvd
            return None
        assert isinstance(body, bytes)  # decode=False: text frames arrive as bytes
        return decode_frame(body)

    def refusal_text(self, url: str) -> str:
        """Why the relay closed the WebSocket before the server's hello."""
        close = self.closed_with
        reason = "" if close is None else close.reason[:300]
        if close is not None and close.code == TRY_AGAIN_LATER:
            return (
                f"the workflow server behind the relay at {url} is not running, and a relay "
                "cannot start one: run `pi-workflows server start` where the relay runs"
            )
        return f"the relay at {url} closed the connection before the server's hello ({reason})"
