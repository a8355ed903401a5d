"""The runner side of referenced values: bounded reads, verification, bounded failures.

A fake server thread answers the runner's `Channel` over a real socketpair, so each
test can hand the runner a broken part, a wrong digest or malformed JSON and check that
the runner fails that one operation cleanly.
"""

from __future__ import annotations

import base64
import hashlib
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest

from pi_workflows.engine._channel import Channel, RunnerStopped
from pi_workflows.engine._values import (
    CONTENT_PART_BYTES,
    MAX_CONTENT_BYTES,
    ContentFailed,
    OutputTooLarge,
    checked_output,
)
from pi_workflows.wire.canonical import dumps
from pi_workflows.wire.framing import SocketFrameReader
from pi_workflows.wire.protocol import LAUNCH_SCHEMA, encode_runner_message
from pi_workflows.wire.runner import (
    MAX_VALUE_ENV,
    ContentRef,
    EffectReserve,
    RunnerAddress,
)

pytestmark = pytest.mark.timeout(30)

ADDRESS = RunnerAddress("run-1", 1, "runner-e1")

Answer = Callable[[dict[str, Any]], dict[str, Any]]
"""Given a runner message, the reply fields to send (outcome, result, error, ...)."""


def ref_of(data: bytes, **fields: Any) -> dict[str, Any]:
    ref = {
        "mediaType": "application/json",
        "byteCount": len(data),
        "digest": "sha256:" + hashlib.sha256(data).hexdigest(),
    }
    return {**ref, **fields}


class FakeServer:
    """Answers a runner's messages on the other end of a socketpair, in a thread."""

    def __init__(self, sock: socket.socket, content: bytes, answer: Answer | None = None) -> None:
        self.sock = sock
        self.content = content
        self.answer = answer or self.serve_part
        self.received: list[dict[str, Any]] = []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def serve_part(self, message: dict[str, Any]) -> dict[str, Any]:
        if message["kind"] != "content.read":
            return {"outcome": "accepted", "revision": 9}
        payload = message["payload"]
        offset, length = payload["offset"], payload["length"]
        if offset >= len(self.content):
            return {
                "outcome": "rejected",
                "error": {"code": "contentUnavailable", "message": "badRange"},
            }
        part = self.content[offset : offset + length]
        return {"outcome": "accepted", "result": {"offset": offset, "data": b64(part)}}

    def send(self, frame: dict[str, Any]) -> None:
        self.sock.sendall(encode_runner_message(frame, sender="server") + b"\n")

    def run(self) -> None:
        reader = SocketFrameReader(self.sock)
        while True:
            try:
                message = reader.read_message()
            except OSError:
                return
            if message is None:
                return
            self.received.append(message)
            reply = {
                "schema": LAUNCH_SCHEMA,
                "kind": "reply",
                "runId": message["runId"],
                "generation": message["generation"],
                "runnerEpoch": message["runnerEpoch"],
                "replyTo": message["messageId"],
                **self.answer(message),
            }
            self.send(reply)

    def reads(self) -> list[dict[str, Any]]:
        return [m["payload"] for m in self.received if m["kind"] == "content.read"]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    runner_end, server_end = socket.socketpair()
    runner_end.settimeout(20)
    try:
        yield runner_end, server_end
    finally:
        runner_end.close()
        server_end.close()


def connect(
    pair: tuple[socket.socket, socket.socket], content: bytes, answer: Answer | None = None
) -> tuple[Channel, FakeServer]:
    runner_end, server_end = pair
    server = FakeServer(server_end, content, answer)
    server.thread.start()
    return Channel(runner_end, ADDRESS), server


def failure(channel: Channel, ref: dict[str, Any]) -> ContentFailed:
    with pytest.raises(ContentFailed) as caught:
        channel.read_content(msgspec.convert(ref, ContentRef))
    assert len(str(caught.value)) <= 4000
    return caught.value


def test_a_large_value_is_read_in_bounded_contiguous_parts(pair: Any) -> None:
    value = {"outputs": {"a": "a" * 700_000, "b": "b" * 700_000}}
    data = dumps(value)
    channel, server = connect(pair, data)
    assert channel.read_content(msgspec.convert(ref_of(data), ContentRef)) == value
    reads = server.reads()
    assert [r["offset"] for r in reads] == [0, CONTENT_PART_BYTES, 2 * CONTENT_PART_BYTES]
    assert all(r["length"] <= CONTENT_PART_BYTES for r in reads)
    assert sum(r["length"] for r in reads) == len(data)


def test_a_wrong_digest_is_refused_after_the_last_part(pair: Any) -> None:
    data = dumps({"x": "y" * 1000})
    channel, _ = connect(pair, data)
    ref = ref_of(data, digest="sha256:" + hashlib.sha256(b"other").hexdigest())
    assert failure(channel, ref).code == "digestMismatch"


def test_a_bad_range_or_missing_content_is_refused(pair: Any) -> None:
    data = dumps({"x": 1})

    def missing(message: dict[str, Any]) -> dict[str, Any]:
        error = {"code": "contentUnavailable", "message": "content is unavailable: notFound"}
        return {"outcome": "notFound", "error": error}

    channel, _ = connect(pair, data, missing)
    failed = failure(channel, ref_of(data))
    assert failed.code == "contentUnavailable"
    assert "notFound" in str(failed)


def test_a_reference_longer_than_the_content_is_refused(pair: Any) -> None:
    data = dumps({"x": "y" * 10})
    channel, _ = connect(pair, data)
    # The stored value ends before the byte count: the first part comes back short.
    failed = failure(channel, ref_of(data, byteCount=len(data) + CONTENT_PART_BYTES))
    assert failed.code == "wrongLength"


def test_a_read_the_server_refuses_as_a_bad_range_is_refused(pair: Any) -> None:
    data = dumps({"x": "y" * 10})

    def bad_range(message: dict[str, Any]) -> dict[str, Any]:
        error = {"code": "contentUnavailable", "message": "content is unavailable: badRange"}
        return {"outcome": "rejected", "error": error}

    channel, _ = connect(pair, data, bad_range)
    refused = failure(channel, ref_of(data))
    assert refused.code == "contentUnavailable"
    assert "badRange" in str(refused)


def test_a_part_of_the_wrong_length_is_refused(pair: Any) -> None:
    data = dumps({"x": "y" * 2000})

    def short(message: dict[str, Any]) -> dict[str, Any]:
        offset = message["payload"]["offset"]
        return {"outcome": "accepted", "result": {"offset": offset, "data": b64(data[:10])}}

    channel, _ = connect(pair, data, short)
    assert failure(channel, ref_of(data)).code == "wrongLength"


def test_a_part_for_another_offset_or_not_base64_is_refused(pair: Any) -> None:
    data = dumps({"x": "y" * 2000})
    answers: Iterator[dict[str, Any]] = iter(
        [
            {"outcome": "accepted", "result": {"offset": 5, "data": b64(data)}},
            {"outcome": "accepted", "result": {"offset": 0, "data": "%%% not base64 %%%"}},
            {"outcome": "accepted"},
        ]
    )
    channel, _ = connect(pair, data, lambda message: next(answers))
    for _ in range(3):
        assert failure(channel, ref_of(data)).code == "badPart"


def test_malformed_json_with_a_matching_digest_is_refused(pair: Any) -> None:
    data = b'{"outputs": {"a": tru'
    channel, _ = connect(pair, data)
    assert failure(channel, ref_of(data)).code == "malformedJson"


def test_json_that_is_not_canonical_is_refused(pair: Any) -> None:
    spaced = b'{"a": 1}'  # JSON, but not the canonical form the server stores
    channel, _ = connect(pair, spaced)
    assert failure(channel, ref_of(spaced)).code == "malformedJson"


def test_an_invalid_media_type_or_oversized_reference_is_refused_unread(pair: Any) -> None:
    data = dumps({"x": 1})
    channel, server = connect(pair, data)
    assert failure(channel, ref_of(data, mediaType="text/plain")).code == "invalidMediaType"
    assert failure(channel, ref_of(data, byteCount=MAX_CONTENT_BYTES + 1)).code == (
        "contentTooLarge"
    )
    assert server.reads() == []


def _command(state_field: dict[str, Any]) -> dict[str, Any]:
    return {
        "schema": LAUNCH_SCHEMA,
        "kind": "command",
        "runId": "run-1",
        "generation": 1,
        "runnerEpoch": "runner-e1",
        "expectedRevision": 4,
        "messageId": "command-runner-e1",
        "command": "resume",
        "payload": state_field,
    }


def test_a_state_by_reference_becomes_the_commands_state(pair: Any) -> None:
    state = {"input": {"n": 1}, "outputs": {"a": "a" * 1_200_000}}
    data = dumps(state)
    channel, server = connect(pair, data)
    server.send(_command({"stateRef": ref_of(data)}))
    _command_record, run_state = channel.wait_command()
    assert msgspec.to_builtins(run_state) == state
    assert channel.revision == 4


def test_an_unreadable_state_parks_the_run_and_stops_the_runner_cleanly(pair: Any) -> None:
    data = dumps({"input": {}, "outputs": {}})
    channel, server = connect(pair, data)
    wrong = ref_of(data, digest="sha256:" + "0" * 64)
    server.send(_command({"stateRef": wrong}))
    with pytest.raises(RunnerStopped):
        channel.wait_command()
    parked = [m for m in server.received if m["kind"] == "run.parked"]
    assert len(parked) == 1
    assert parked[0]["payload"]["reason"] == "contentUnavailable"
    assert "digestMismatch" in parked[0]["payload"]["detail"]


def test_a_reply_result_by_reference_is_read_into_the_reply(pair: Any) -> None:
    result = {"decision": "adopt", "effect": {"result": "r" * 1_100_000}}
    data = dumps(result)

    def answer(message: dict[str, Any]) -> dict[str, Any]:
        if message["kind"] == "effect.reserve":
            return {"outcome": "accepted", "revision": 7, "resultRef": ref_of(data)}
        return FakeServer.serve_part(server, message)

    channel, server = connect(pair, data, answer)
    request = EffectReserve(effect_type="x", idempotency_key="k", request={})
    reply = channel.send(request, "attempt-1")
    assert reply.result == result
    assert "resultRef" not in reply.to_wire()
    assert channel.revision == 7


def test_node_outputs_over_the_value_cap_are_refused_naming_it() -> None:
    cap = 1024 * 1024
    assert checked_output({"a": "x" * 1000}, cap) == dumps({"a": "x" * 1000})
    with pytest.raises(OutputTooLarge, match="bytes of JSON") as caught:
        checked_output({"a": "x" * cap}, cap)
    assert str(cap) in str(caught.value) and MAX_VALUE_ENV in str(caught.value)
