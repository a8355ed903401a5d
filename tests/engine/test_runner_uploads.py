"""The runner side of values sent by reference: `content.write` parts, then `…Ref`.

A result or output too large for one frame (a shell command's escaped output) is
written first in parts of at most 512 KiB, each acknowledged with its digest, and the
message then names it. The fake server of `test_runner_content` answers over a real
socketpair.
"""

from __future__ import annotations

import base64
import hashlib
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from pi_workflows.engine.runner import (
    CONTENT_PART_BYTES,
    MAX_OUTPUT_BYTES,
    OutputTooLarge,
    Refused,
)
from pi_workflows.wire.canonical import dumps
from pi_workflows.wire.runner import MAX_UPLOAD_BYTES
from tests.engine.test_runner_content import connect

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    runner_end, server_end = socket.socketpair()
    runner_end.settimeout(20)
    try:
        yield runner_end, server_end
    finally:
        runner_end.close()
        server_end.close()


def _stores(message: dict[str, Any]) -> dict[str, Any]:
    """A server that stores every part and answers with its digest."""
    if message["kind"] == "content.write":
        part = base64.b64decode(message["payload"]["data"])
        return {"outcome": "accepted", "result": {"digest": _digest(part)}}
    return {"outcome": "accepted", "revision": 5}


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_a_result_too_large_for_a_frame_is_written_in_parts_and_named(pair: Any) -> None:
    result = {"stdout": "\x00" * 200_000, "exitCode": 0}  # 1.2 MB of JSON
    data = dumps(result)
    channel, server = connect(pair, b"", _stores)
    settled = {"idempotencyKey": "k", "outcome": "succeeded", "result": result}
    channel.send("effect.settle", settled, "attempt-1")
    writes = [m for m in server.received if m["kind"] == "content.write"]
    parts = [base64.b64decode(m["payload"]["data"]) for m in writes]
    assert all(len(part) == CONTENT_PART_BYTES for part in parts[:-1])
    assert b"".join(parts) == data
    settle = server.received[-1]
    assert settle["kind"] == "effect.settle" and "result" not in settle["payload"]
    assert settle["payload"]["resultRef"] == {
        "mediaType": "application/json",
        "byteCount": len(data),
        "digest": _digest(data),
        "parts": [_digest(part) for part in parts],
    }
    # The same value named again (node finished, run finished) is not written again.
    channel.send("node.finished", {"nodePath": "noise", "output": result}, "attempt-1")
    assert len([m for m in server.received if m["kind"] == "content.write"]) == len(writes)
    finished = server.received[-1]["payload"]
    assert finished["outputRef"] == settle["payload"]["resultRef"]


def test_a_value_that_fits_goes_inline(pair: Any) -> None:
    channel, server = connect(pair, b"", _stores)
    output = {"text": "x" * (MAX_OUTPUT_BYTES - 100)}
    channel.send("node.finished", {"nodePath": "n", "output": output}, "attempt-1")
    assert [m["kind"] for m in server.received] == ["node.finished"]
    assert server.received[0]["payload"]["output"] == output


def test_a_part_stored_under_another_digest_stops_the_runner(pair: Any) -> None:
    def wrong(message: dict[str, Any]) -> dict[str, Any]:
        if message["kind"] == "content.write":
            return {"outcome": "accepted", "result": {"digest": _digest(b"other")}}
        return {"outcome": "accepted"}

    channel, _server = connect(pair, b"", wrong)
    with pytest.raises(Refused, match=r"content\.write"):
        channel.send("run.finished", {"status": "completed", "output": "\x01" * 300_000})


def test_a_refused_part_stops_the_runner(pair: Any) -> None:
    def refuses(message: dict[str, Any]) -> dict[str, Any]:
        error = {"code": "contentRejected", "message": "no"}
        return {"outcome": "rejected", "error": error}

    channel, _server = connect(pair, b"", refuses)
    with pytest.raises(Refused, match="contentRejected"):
        channel.send("run.finished", {"status": "completed", "output": "\x01" * 300_000})


def test_more_than_a_reference_holds_is_refused_before_anything_is_sent(pair: Any) -> None:
    channel, server = connect(pair, b"", _stores)
    with pytest.raises(OutputTooLarge):
        channel.send("run.finished", {"status": "completed", "output": "y" * MAX_UPLOAD_BYTES})
    assert server.received == []
