"""The bounded traceback a failed node sends with `node.failed` (runner.v1 `error.traceback`)."""

from __future__ import annotations

import pytest

from pi_workflows.engine.runner import MAX_TRACEBACK_BYTES, _traceback_text
from pi_workflows.wire import protocol

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
    text = _traceback_text(_caught(_outer))
    assert "in _inner" in text and "in _outer" in text
    assert "KeyError: 'missing'" in text
    assert "The above exception was the direct cause" in text
    assert text.rstrip().endswith("RuntimeError: wrapped")


def test_a_huge_traceback_keeps_its_tail_within_16_kib_and_fits_the_schema() -> None:
    def huge() -> None:
        raise ValueError("start " + "é" * 20_000 + " end")

    text = _traceback_text(_caught(huge))
    assert len(text.encode("utf-8")) <= MAX_TRACEBACK_BYTES
    assert text.startswith("…") and text.rstrip().endswith(" end")
    protocol.validate(
        "runner.v1",
        {
            "schema": "pi-workflows.worker-launch.v1",
            "kind": "node.failed",
            "messageId": "m-1",
            "runId": "run-1",
            "runnerEpoch": "e-1",
            "generation": 1,
            "expectedRevision": 3,
            "attemptId": "a-1",
            "payload": {
                "nodePath": "huge",
                "error": {"code": "nodeFailed", "message": "ValueError", "traceback": text},
            },
        },
    )
