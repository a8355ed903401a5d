"""The runner side of values sent by reference: `content.write` parts, then `…Ref`.

A result or output too large for one frame (a shell command's escaped output) is
written first in parts of at most 512 KiB, each acknowledged with its digest, and the
message then names it; so is an error whose message or traceback is over 16 KiB. A
value over the value cap is refused before anything is sent. The fake server of
`test_runner_content` answers over a real socketpair.
"""

from __future__ import annotations

import base64
import hashlib
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from pi_workflows.engine._channel import Refused
from pi_workflows.engine._values import CONTENT_PART_BYTES, OutputTooLarge, ValueTooLarge
from pi_workflows.wire.canonical import dumps, loads
from pi_workflows.wire.runner import (
    INLINE_VALUE_BYTES,
    MAX_VALUE_ENV,
    EffectReserve,
    EffectSettle,
    NodeFailed,
    NodeFinished,
    RunFinished,
    RunnerError,
)
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
    settled = EffectSettle(idempotency_key="k", outcome="succeeded", result=result)
    channel.send(settled, "attempt-1")
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
    channel.send(NodeFinished(node_path="noise", output=result), "attempt-1")
    assert len([m for m in server.received if m["kind"] == "content.write"]) == len(writes)
    finished = server.received[-1]["payload"]
    assert finished["outputRef"] == settle["payload"]["resultRef"]


def test_a_value_that_fits_goes_inline(pair: Any) -> None:
    channel, server = connect(pair, b"", _stores)
    output = {"text": "x" * (INLINE_VALUE_BYTES - 100)}
    channel.send(NodeFinished(node_path="n", output=output), "attempt-1")
    assert [m["kind"] for m in server.received] == ["node.finished"]
    assert server.received[0]["payload"]["output"] == output


def test_a_part_stored_under_another_digest_stops_the_runner(pair: Any) -> None:
    def wrong(message: dict[str, Any]) -> dict[str, Any]:
        if message["kind"] == "content.write":
            return {"outcome": "accepted", "result": {"digest": _digest(b"other")}}
        return {"outcome": "accepted"}

    channel, _server = connect(pair, b"", wrong)
    with pytest.raises(Refused, match=r"content\.write"):
        channel.send(RunFinished(status="completed", output="\x01" * 300_000))


def test_a_refused_part_stops_the_runner(pair: Any) -> None:
    def refuses(message: dict[str, Any]) -> dict[str, Any]:
        error = {"code": "contentRejected", "message": "no"}
        return {"outcome": "rejected", "error": error}

    channel, _server = connect(pair, b"", refuses)
    with pytest.raises(Refused, match="contentRejected"):
        channel.send(RunFinished(status="completed", output="\x01" * 300_000))


def test_more_than_the_value_cap_is_refused_before_anything_is_sent(pair: Any) -> None:
    channel, server = connect(pair, b"", _stores)
    channel.max_value_bytes = 2 * 1024 * 1024
    with pytest.raises(OutputTooLarge) as caught:
        channel.send(RunFinished(status="completed", output="y" * channel.max_value_bytes))
    assert str(channel.max_value_bytes) in str(caught.value)
    assert MAX_VALUE_ENV in str(caught.value)
    request = EffectReserve(effect_type="x", idempotency_key="k", request=["z" * 3_000_000])
    with pytest.raises(ValueTooLarge, match=MAX_VALUE_ENV):
        channel.send(request, "attempt-1")
    assert server.received == []


def test_a_value_larger_than_a_frame_and_within_the_cap_goes_by_reference(pair: Any) -> None:
    channel, server = connect(pair, b"", _stores)
    output = {"text": "o" * 3 * 1024 * 1024}  # 3 MiB: four frames' worth
    channel.send(NodeFinished(node_path="big", output=output), "attempt-1")
    writes = [m for m in server.received if m["kind"] == "content.write"]
    assert len(writes) == 7  # 512 KiB parts
    parts = [base64.b64decode(m["payload"]["data"]) for m in writes]
    assert loads(b"".join(parts)) == output
    finished = server.received[-1]
    assert finished["kind"] == "node.finished" and "output" not in finished["payload"]
    assert finished["payload"]["outputRef"]["byteCount"] == len(dumps(output))


def test_a_long_error_goes_whole_by_reference(pair: Any) -> None:
    channel, server = connect(pair, b"", _stores)
    message = "ValueError: " + "m" * 200 * 1024
    error = RunnerError(code="nodeFailed", message=message, traceback="tb\n" + message)
    channel.send(NodeFailed(node_path="boom", error=error), "attempt-1")
    writes = [m for m in server.received if m["kind"] == "content.write"]
    whole = loads(b"".join(base64.b64decode(m["payload"]["data"]) for m in writes))
    assert whole == {"code": "nodeFailed", "message": message, "traceback": "tb\n" + message}
    failed = server.received[-1]["payload"]
    assert "error" not in failed and failed["errorRef"]["byteCount"] == len(dumps(whole))
    # A short one stays inline.
    short = RunnerError(code="nodeFailed", message="ValueError: no")
    channel.send(NodeFailed(node_path="boom", error=short), "attempt-1")
    assert server.received[-1]["payload"]["error"] == {
        "code": "nodeFailed",
        "message": "ValueError: no",
    }


def test_an_error_over_the_cap_is_cut_to_fit_it_and_says_so(pair: Any) -> None:
    channel, server = connect(pair, b"", _stores)
    channel.max_value_bytes = 1024 * 1024
    message = "ValueError: " + "m" * 3 * 1024 * 1024
    channel.send(
        NodeFailed(node_path="boom", error=RunnerError(code="nodeFailed", message=message)), "a-1"
    )
    writes = [m for m in server.received if m["kind"] == "content.write"]
    data = b"".join(base64.b64decode(m["payload"]["data"]) for m in writes)
    assert len(data) <= channel.max_value_bytes
    cut = loads(data)["message"]
    assert cut.startswith("ValueError: mmm") and MAX_VALUE_ENV in cut
