"""`piw serve`: a loopback WebSocket relay to the workflow server's Unix socket.

Implements client-protocol.md § Transports (the remote transport at `/ws`): each
WebSocket gets its own server-socket connection, their lifecycles are coupled, and one
canonical JSON object per text frame is forwarded unchanged. The relay keeps no state,
reads no database and multiplexes nothing; it only checks the framing, as the socket does.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.http11 import Request, Response

from pi_workflows.wire import (
    LOOPBACK_HOSTS,
    MAX_FRAME_BYTES,
    CanonicalJSONError,
    is_loopback,
    loads,
    normalize_host,
)

__all__ = [
    "DEFAULT_BIND",
    "LOOPBACK_HOSTS",
    "WS_PATH",
    "BindAddress",
    "NonLoopbackBindError",
    "parse_bind",
    "run_relay",
]

DEFAULT_BIND = "127.0.0.1:9377"
WS_PATH = "/ws"
"""The only hosts the relay binds: remote viewers come through an SSH tunnel."""

NO_SERVER_REASON = "the workflow server is not running; start it with `pi-workflows server start`"
SERVER_CLOSED_REASON = "the workflow server closed the connection"
BINARY_REASON = "binary frames are refused: send one canonical JSON object per text frame"
TOO_LARGE_REASON = f"a frame is larger than {MAX_FRAME_BYTES} bytes"
NOT_CANONICAL_REASON = "a frame is not canonical JSON of one object"
SERVER_FRAMING_REASON = "the workflow server sent a frame the relay cannot forward"


class NonLoopbackBindError(ValueError):
    """`--bind` names an address other than 127.0.0.1, ::1 or localhost."""


@dataclass(frozen=True, slots=True)
class BindAddress:
    """Where the relay listens: a loopback host and a TCP port (0: any free port)."""

    host: str
    port: int

    def url(self, port: int | None = None) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"ws://{host}:{self.port if port is None else port}{WS_PATH}"


def parse_bind(text: str) -> BindAddress:
    """`127.0.0.1:9377`, `[::1]:9377` or `localhost:9377` → a `BindAddress`.

    Raises:
        NonLoopbackBindError: the host is not loopback, or the port is not 0-65535.
    """
    host, separator, port_text = text.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not separator or not port_text.isdigit() or int(port_text) > 65535:
        raise NonLoopbackBindError(f"--bind takes HOST:PORT (such as {DEFAULT_BIND})")
    if not is_loopback(host):
        raise NonLoopbackBindError(
            "--bind accepts only a loopback address (127.0.0.1, ::1 or localhost); "
            "to view from another machine, forward the port with `ssh -L`"
        )
    return BindAddress(normalize_host(host), int(port_text))


def _refuse_other_paths(connection: ServerConnection, request: Request) -> Response | None:
    """Only `/ws` is a relay endpoint: any other path gets a 404 handshake answer."""
    if request.path.split("?", 1)[0] == WS_PATH:
        return None
    return connection.respond(HTTPStatus.NOT_FOUND, f"the relay serves only {WS_PATH}\n")


def _checked_frame(message: str | bytes) -> bytes | tuple[CloseCode, str]:
    """The socket frame for one WebSocket message, or the close code and reason it earns."""
    if isinstance(message, bytes):
        return CloseCode.UNSUPPORTED_DATA, BINARY_REASON
    body = message.encode("utf-8")  # websockets checked it is valid UTF-8
    if len(body) > MAX_FRAME_BYTES:
        return CloseCode.MESSAGE_TOO_BIG, TOO_LARGE_REASON
    try:
        value = loads(body)
    except CanonicalJSONError:
        return CloseCode.INVALID_DATA, NOT_CANONICAL_REASON
    if not isinstance(value, dict):
        return CloseCode.INVALID_DATA, NOT_CANONICAL_REASON
    return body + b"\n"


async def _to_server(websocket: ServerConnection, writer: asyncio.StreamWriter) -> None:
    """WebSocket → socket, one checked frame at a time; a bad frame closes this WebSocket."""
    async for message in websocket:
        frame = _checked_frame(message)
        if isinstance(frame, tuple):
            await websocket.close(*frame)
            return
        writer.write(frame)
        await writer.drain()  # backpressure: a slow server slows this one WebSocket


async def _to_websocket(websocket: ServerConnection, reader: asyncio.StreamReader) -> None:
    """Socket → WebSocket, each newline-framed message as one text frame, unchanged."""
    while True:
        try:
            line = await reader.readuntil(b"\n")
        except (asyncio.IncompleteReadError, OSError):  # end of file, or reset by a kill
            await websocket.close(CloseCode.GOING_AWAY, SERVER_CLOSED_REASON)
            return
        except asyncio.LimitOverrunError:
            await websocket.close(CloseCode.INTERNAL_ERROR, SERVER_FRAMING_REASON)
            return
        await websocket.send(line[:-1].decode("utf-8"))


async def _relay_one(websocket: ServerConnection, socket_path: Path) -> None:
    """Couple one WebSocket with one new server connection until either side ends."""
    try:
        reader, writer = await asyncio.open_unix_connection(
            str(socket_path), limit=MAX_FRAME_BYTES + 1
        )
    except OSError:
        await websocket.close(CloseCode.TRY_AGAIN_LATER, NO_SERVER_REASON)
        return
    pumps = {
        asyncio.create_task(_to_server(websocket, writer)),
        asyncio.create_task(_to_websocket(websocket, reader)),
    }
    try:
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        await _close_quietly(websocket)


async def _close_quietly(websocket: ServerConnection) -> None:
    """Close the WebSocket when no pump did (the server reset the socket, say)."""
    with contextlib.suppress(ConnectionClosed, OSError):
        await websocket.close(CloseCode.GOING_AWAY, SERVER_CLOSED_REASON)


def _handler(socket_path: Path) -> Callable[[ServerConnection], Awaitable[None]]:
    async def handle(websocket: ServerConnection) -> None:
        await _relay_one(websocket, socket_path)

    return handle


async def serve_until_stopped(
    bind: BindAddress, socket_path: Path, ready: Callable[[str], None]
) -> None:
    """Listen on `bind`, report the URL through `ready`, relay until SIGTERM or SIGINT."""
    stop = asyncio.get_running_loop().create_future()
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set_result, None)
    async with serve(
        _handler(socket_path),
        bind.host,
        bind.port,
        process_request=_refuse_other_paths,
        max_size=MAX_FRAME_BYTES,  # larger text frames end with 1009 before they are read
        compression=None,
    ) as server:
        ready(bind.url(_bound_port(server)))
        await stop


def _bound_port(server: Server) -> int:
    return int(server.sockets[0].getsockname()[1])


def run_relay(bind: BindAddress, socket_path: Path, ready: Callable[[str], None]) -> None:
    """Run the relay in this thread until SIGTERM or SIGINT (blocking)."""
    asyncio.run(serve_until_stopped(bind, socket_path, ready))
