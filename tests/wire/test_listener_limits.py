"""The listener at the process's descriptor limit, and asyncio's own errors.

Real parts: a `ClientListener` in a child process whose soft RLIMIT_NOFILE is lowered
once it listens, raw Unix-socket clients, and the rotated JSON log it writes.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pi_workflows.wire.framing import SocketFrameReader, encode_frame
from pi_workflows.wire.protocol import CLIENT_SCHEMA

pytestmark = pytest.mark.timeout(120)

CHILD_NOFILE = 64
CONNECTIONS = 200


@contextlib.contextmanager
def listener_child(short_tmp: Path, mode: str, *limit: int) -> Iterator[Path]:
    """Start the child listener; yield its socket; stop it (stdin closed) and reap it."""
    logs = short_tmp / "logs"
    logs.mkdir(mode=0o700)
    path = short_tmp / "host.sock"
    command = [sys.executable, "-m", "tests.wire.listener_child", str(path), str(logs), mode]
    child = subprocess.Popen(
        [*command, *(str(n) for n in limit)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        yield path
        assert child.stdin is not None
        child.stdin.close()
        assert child.wait(30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    assert child.stderr is not None
    stderr = child.stderr.read()
    assert "Traceback" not in stderr, "errors go to the rotated log, not stderr"


def log_lines(short_tmp: Path) -> list[dict[str, Any]]:
    text = (short_tmp / "logs" / "server.log").read_text()
    return [json.loads(line) for line in text.splitlines()]


def first_messages(sock: socket.socket) -> list[dict[str, Any]]:
    """Every message the listener sent before going quiet or closing (at most two)."""
    reader = SocketFrameReader(sock)
    messages: list[dict[str, Any]] = []
    first = reader.read_message()
    assert first is not None and first["type"] == "hello", "every connection gets its hello"
    messages.append(first)
    refusal = reader.peek_buffered()  # a refusal is written with its hello, at once
    if refusal is not None:
        messages.append(refusal)
        reader.read_message()
        assert reader.read_message() is None, "a refused connection is closed"
    return messages


def served_after_refusals(path: Path, timeout: float = 30) -> int:
    """Connect until a connection is admitted and answers a request; count the refusals."""
    deadline = time.monotonic() + timeout
    refusals = 0
    while True:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(20)
            client.connect(str(path))
            if len(first_messages(client)) == 1:
                client.sendall(request("after"))
                answer = SocketFrameReader(client).read_message()
                assert answer is not None and answer["outcome"] == "accepted"
                return refusals
        refusals += 1
        assert time.monotonic() < deadline, "the listener never admitted a client again"
        threading.Event().wait(0.05)


def request(key: str) -> bytes:
    return encode_frame(
        {
            "schema": CLIENT_SCHEMA,
            "type": "request",
            "requestId": key,
            "clientId": "test",
            "operation": "server.status",
            "idempotencyKey": key,
            "payload": {},
        }
    )


def test_at_the_descriptor_limit_each_extra_connection_is_refused_with_an_error(
    short_tmp: Path,
) -> None:
    refused = 0
    with listener_child(short_tmp, "serve", CHILD_NOFILE) as path:
        held: list[socket.socket] = []
        try:
            for _ in range(CONNECTIONS):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(20)
                sock.connect(str(path))
                held.append(sock)
                messages = first_messages(sock)
                if len(messages) == 2:
                    refused += 1
                    event = messages[1]
                    assert event["type"] == "event" and event["kind"] == "unavailable"
                    assert event["subscriptionId"] == messages[0]["connectionId"]
                    assert event["payload"]["code"] == "tooManyConnections"
            # Every connection past the descriptor limit was accepted and refused with
            # the error, not left waiting in the backlog (nor the listener spinning).
            assert refused >= CONNECTIONS - CHILD_NOFILE
        finally:
            for sock in held:
                sock.close()
        # With the held connections gone (once the listener has seen them close), a new
        # client is admitted and served again.
        refused += served_after_refusals(path)
    summaries = [
        line for line in log_lines(short_tmp) if line.get("action") == "connection.rejected"
    ]
    counted = sum(line["count"] for line in summaries)
    assert counted == refused, "every refusal is counted in the summaries"
    assert all("descriptorLimit=" in line["reason"] for line in summaries)
    assert len(summaries) <= 3, "one summary line per interval, not one per connection"
    assert not [
        line for line in log_lines(short_tmp) if line.get("action") == "listener.loop_error"
    ]


def test_asyncio_errors_go_to_the_rotated_log_rate_limited_and_without_content(
    short_tmp: Path,
) -> None:
    with listener_child(short_tmp, "errors"):
        pass
    lines = log_lines(short_tmp)
    errors = [line for line in lines if line.get("action") == "listener.loop_error"]
    assert 1 <= len(errors) <= 20, "500 loop errors, at most 20 lines a minute"
    assert all(line["reason"] == "ValueError" for line in errors)
    text = (short_tmp / "logs" / "server.log").read_text()
    assert "secret-marker" not in text, "an exception's text or a callback's repr is not logged"
