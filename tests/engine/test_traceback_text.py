"""The traceback a failed node sends with `node.failed` (runner.v1 `error.traceback`): the
workflow's frames, whole; one over 16 KiB goes with the whole error by reference."""

from __future__ import annotations

import pytest

from pi_workflows.engine._failures import node_error, traceback_text
from pi_workflows.engine._values import values_by_reference
from pi_workflows.wire import protocol
from pi_workflows.wire.canonical import loads
from pi_workflows.wire.runner import UPLOAD_PART_BYTES, NodeFailed, RunnerMessage, UploadRef

pytestmark = pytest.mark.timeout(10)


def _caught(function: object) -> BaseException:
    try:
        function()  # type: ignore[operator]
    except Exception as exc:
        return exc
    raise AssertionError("no exception")


def _inner() -> None:
    raise KeyError("missing")


def _outer() -> None:
    try:
        _inner()
    except KeyError as exc:
        raise RuntimeError("wrapped") from exc


def test_a_chained_failure_keeps_both_tracebacks_and_its_own_frames() -> None:
    text = traceback_text(_caught(_outer))
    assert "in _inner" in text and "in _outer" in text
    assert "KeyError: 'missing'" in text
    assert "The above exception was the direct cause" in text
    assert text.rstrip().endswith("RuntimeError: wrapped")


def test_a_huge_traceback_is_whole_and_goes_by_reference_as_the_schema_says() -> None:
    def huge() -> None:
        raise ValueError("start " + "é" * 20_000 + " end")

    exc = _caught(huge)
    text = traceback_text(exc)
    assert "in huge" in text, "the frames are kept, not only the tail"
    assert "start " + "é" * 20_000 + " end" in text and text.rstrip().endswith(" end")
    uploads: list[bytes] = []

    def upload(data: bytes) -> UploadRef:
        uploads.append(data)
        parts = -(-len(data) // UPLOAD_PART_BYTES)
        return UploadRef(
            byte_count=len(data), digest="sha256:" + "0" * 64, parts=("sha256:" + "1" * 64,) * parts
        )

    failed = values_by_reference(NodeFailed(node_path="huge", error=node_error(exc)), 2**26, upload)
    assert len(uploads) == 1 and loads(uploads[0])["traceback"] == text
    message = RunnerMessage(
        run_id="run-1",
        generation=1,
        runner_epoch="e-1",
        message_id="m-1",
        expected_revision=3,
        attempt_id="a-1",
        body=failed,
    )
    protocol.validate("runner.v1", loads(message.encode()))
    assert RunnerMessage.from_wire(message.to_wire()) == message
