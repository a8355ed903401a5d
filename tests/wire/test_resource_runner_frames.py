"""`resource-runner.v1`'s request frames: each record round-trips through its decoder, and
a malformed request is one `ProtocolViolation` (the pass fails; the server never does)."""

from __future__ import annotations

from typing import Any

import pytest

from pi_workflows.wire.protocol import ProtocolViolation
from pi_workflows.wire.resource_runner import (
    ChildRunAnswered,
    ChildRunRequested,
    EffectAnswered,
    EffectRequested,
    PassStart,
    decode_child_frame,
    decode_server_answer,
)

pytestmark = pytest.mark.timeout(10)


def test_requests_and_answers_round_trip() -> None:
    child = ChildRunRequested("review/1", "double", "sha256:x", {"ok": True})
    assert decode_child_frame(child.to_wire()) == child
    effect = EffectRequested("settle", "note/1", outcome="applied", result={"a": 1}, observed=True)
    assert decode_child_frame(effect.to_wire()) == effect
    answered = ChildRunAnswered("run-1", "completed", {"doubled": 42})
    assert decode_server_answer(answered.to_wire()) == answered
    state = EffectAnswered("observe", "applying")
    assert decode_server_answer(state.to_wire()) == state
    start = PassStart("m", "/p/m.py", "sha256:s", "rec-1", {}, 1000, "/p", "/agent")
    assert PassStart.from_wire(start.to_wire()) == start


@pytest.mark.parametrize(
    "frame",
    [
        {"kind": "resourceRunner.ensureChild", "payload": {"requestKey": "k", "workflow": "w"}},
        {
            "kind": "resourceRunner.ensureChild",
            "payload": {"requestKey": "", "workflow": "w", "inputFingerprint": "f", "resolved": {}},
        },
        {"kind": "resourceRunner.effect", "payload": {"op": "delete", "key": "k"}},
        {"kind": "resourceRunner.effect", "payload": {"op": "settle", "key": "k"}},
        {"kind": "resourceRunner.effect", "payload": {"op": "reserve", "key": "k"}},
        {"kind": "resourceRunner.effect", "payload": {"op": "retry", "key": "k" * 201}},
        {"kind": "resourceRunner.childRun", "payload": {}},
    ],
)
def test_a_malformed_request_is_a_protocol_violation(frame: dict[str, Any]) -> None:
    with pytest.raises(ProtocolViolation):
        decode_child_frame(frame)
