"""A real `ClientListener` in a child process, for tests that change process limits.

Usage: python -m tests.wire.listener_child SOCKET LOGS MODE [NOFILE]
  MODE `serve`: answer each request `accepted`; with NOFILE, lower the soft descriptor
      limit to it once listening (the connection cap stays far above it).
  MODE `errors`: also raise 500 errors in callbacks on the listener's loop.
Prints `ready` once listening; stops (flushing its logs) when stdin closes.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path
from typing import Any

from pi_workflows import __version__
from pi_workflows.server._logging import configure_server_logging, detach_server_logging
from pi_workflows.wire._listener import ClientListener, Connection, ConnectionLimits
from pi_workflows.wire.protocol import CLIENT_SCHEMA, RequestMessage


class Accepting:
    """Answers every request `accepted`, on the loop."""

    def on_connect(self, connection: Connection) -> None:
        return None

    def on_request(self, connection: Connection, request: RequestMessage) -> None:
        answer: dict[str, Any] = {
            "schema": CLIENT_SCHEMA,
            "type": "response",
            "requestId": request["requestId"],
            "outcome": "accepted",
        }
        connection.respond(answer)

    def on_disconnect(self, connection: Connection) -> None:
        return None


def _boom() -> None:
    raise ValueError("secret-marker payload bytes")


def main() -> None:
    socket_path, logs, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    handler = configure_server_logging(logs)
    listener = ClientListener(
        socket_path,
        Accepting(),
        __version__,
        lambda exc: None,
        limits=ConnectionLimits(max_connections=100_000),
        descriptor_limit=1_000_000,
    )
    listener.start()
    if len(sys.argv) > 4:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[4]), hard))
    if mode == "errors":
        for _ in range(500):
            listener._loop.call_soon_threadsafe(_boom)
    print("ready", flush=True)
    sys.stdin.read()
    listener.stop()
    detach_server_logging(handler)


if __name__ == "__main__":
    main()
