"""A raw subscriber for the subscription tests: one Unix socket, events kept in order.

`WorkflowClient` skips events that arrive before a response; a subscriber must not, so
this one reads every frame itself, answers its own requests by request ID and queues
the events it reads on the way.
"""

from __future__ import annotations

import socket
import time
from collections import deque
from pathlib import Path
from typing import Any

from pi_workflows.wire.framing import SocketFrameReader, encode_frame
from pi_workflows.wire.view_patch import apply_patch

__all__ = ["Watcher", "wait_for"]

WAIT_S = 20.0


class Watcher:
    """One client connection that subscribes and reads events."""

    def __init__(self, socket_path: Path, *, receive_buffer: int | None = None) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if receive_buffer is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(WAIT_S)
        self.sock.connect(str(socket_path))
        self.reader = SocketFrameReader(self.sock)
        hello = self.reader.read_message()
        assert hello is not None and hello["type"] == "hello"
        self.connection_id = str(hello.get("connectionId", ""))
        self.events: deque[dict[str, Any]] = deque()
        self._count = 0

    def send(self, operation: str, payload: dict[str, Any], **envelope: Any) -> str:
        """Send a request without waiting; its request ID."""
        self._count += 1
        request_id = f"w-{self._count}"
        request = {
            "schema": "pi-workflows.client.v1",
            "type": "request",
            "requestId": request_id,
            "clientId": "watcher",
            "operation": operation,
            "idempotencyKey": f"watch-{id(self)}-{self._count}",
            "payload": payload,
            **envelope,
        }
        self.sock.sendall(encode_frame(request))
        return request_id

    def request(self, operation: str, payload: dict[str, Any], **envelope: Any) -> dict[str, Any]:
        """Send a request and return its response; events read meanwhile are kept."""
        request_id = self.send(operation, payload, **envelope)
        while True:
            message = self._read()
            if message["type"] == "response" and message["requestId"] == request_id:
                return message
            if message["type"] == "event":
                self.events.append(message)

    def subscribe(self, payload: dict[str, Any], **envelope: Any) -> str:
        answer = self.request("view.subscribe", payload, **envelope)
        assert answer["outcome"] == "accepted", answer
        assert answer["receipt"]["kind"] == payload["kind"]
        return str(answer["receipt"]["subscriptionId"])

    def event(self) -> dict[str, Any]:
        """The next event (queued first, then read)."""
        if self.events:
            return self.events.popleft()
        while True:
            message = self._read()
            if message["type"] == "event":
                return message

    def _read(self) -> dict[str, Any]:
        message = self.reader.read_message()
        assert message is not None, "the server closed the connection"
        return message

    def close(self) -> None:
        self.sock.close()


class HeldView:
    """What a client holds of one run subscription: the view it rebuilt from events."""

    def __init__(self) -> None:
        self.view: dict[str, Any] | None = None
        self.kinds: list[str] = []

    @property
    def revision(self) -> int:
        assert self.view is not None
        return int(self.view["revision"])

    def apply(self, event: dict[str, Any]) -> None:
        """A snapshot replaces the view; a patch applies only to its exact base."""
        self.kinds.append(event["kind"])
        if event["kind"] == "runSnapshot":
            self.view = event["payload"]
        else:
            assert event["kind"] == "runPatch", event["kind"]
            assert self.view is not None, "a patch before any snapshot"
            assert event["payload"]["baseRevision"] == self.revision, (
                "a patch from a revision this client does not hold"
            )
            self.view = apply_patch(self.view, event["payload"]["operations"])
        assert self.revision == event["revision"]


def wait_for(condition: Any, what: str, timeout: float = WAIT_S) -> None:
    """Poll `condition()` until it is true (a bound, never a delay)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)
