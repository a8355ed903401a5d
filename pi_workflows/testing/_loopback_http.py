"""What the HTTP fakes share: a threaded server on 127.0.0.1 (ephemeral port), its start
and stop, request bodies, JSON answers, and waits on what was recorded.

`FakeProvider` (the model provider) and `FakeTelegram` (the Bot API) build on it; each
keeps its own routes and scripting. Nothing here logs: requests carry keys and tokens.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self, TypeVar

__all__ = ["LoopbackServer", "QuietHandler"]

LOOPBACK_HOSTS = ("127.0.0.1", "localhost")
STOP_JOIN_S = 10.0

T = TypeVar("T")


class QuietHandler(BaseHTTPRequestHandler):
    """A keep-alive request handler that never logs and answers JSON."""

    protocol_version = "HTTP/1.1"  # keep-alive (and chunked streams), as the real APIs
    # Headers and body go out in two writes; without TCP_NODELAY each answer waits for
    # the client's delayed ACK (~40 ms), which would swamp every latency measured.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        """Never log: request lines and headers may hold a key or a token."""

    def read_body(self) -> bytes:
        """The request body (`Content-Length` bytes; none without it)."""
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length else b""

    def send_json(self, status: int, body: Mapping[str, Any]) -> bool:
        """Answer `status` with `body` as JSON; False when the client went away meanwhile
        (the connection ends)."""
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
            return False
        return True


class LoopbackServer:
    """A real HTTP server on 127.0.0.1 (ephemeral port), served from a background thread.

    Use it as a context manager, or call `start` and `stop`. A subclass passes its
    handler class; `_lock` (a condition) guards its state and is notified on every
    change a wait may be for, and `_stopping` is set under it by `stop`.
    """

    def __init__(
        self, handler_class: type[BaseHTTPRequestHandler], *, host: str, name: str, what: str
    ) -> None:
        """`name` names the serving thread; `what` the fake, in the error for a host that
        is not loopback."""
        if host not in LOOPBACK_HOSTS:
            raise ValueError(f"{what} listens on loopback only")
        self._name = name
        self._lock = threading.Condition()
        self._stopping = False
        self._httpd = ThreadingHTTPServer((host, 0), handler_class)
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    def start(self) -> Self:
        """Serve in a background thread; returns self."""
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=self._name,
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving (once): wake what handlers block on, close the socket."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            self._lock.notify_all()
        self._wake_handlers()
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=STOP_JOIN_S)
        self._closed()

    def _wake_handlers(self) -> None:
        """Release requests held by a script (after `_stopping` is set)."""

    def _closed(self) -> None:
        """Free what the handlers needed, once the server is closed."""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def _wait(self, condition: Callable[[], T | None], timeout: float) -> T | None:
        """Wait under `_lock` until `condition()` is truthy; its value, or None when
        `timeout` seconds pass first. Re-checked whenever `_lock` is notified."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                value = condition()
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._lock.wait(left)
