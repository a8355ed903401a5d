"""A protected human decision in the real `pi --mode rpc` with the extension (issue 15
item 1; issue 14's "Pause and resume a protected decision").

`/workflow start` of a workflow with a `human_decision` makes an interactive run of this
Pi session. Its decision message appears once and starts no model turn; the model's
`workflow` tool cannot answer it; `/workflow pause` and `/workflow resume` keep the
decision's answer revision and show no second decision message; `/workflow answer`
answers it through `decision.answer` (source channel `pi`) and the run completes.
"""

from __future__ import annotations

import json
import re

import pytest

from pi_workflows import WorkflowServer
from pi_workflows.testing import ToolCall, Turn, text_turn
from tests.conftest import write_workflow
from tests.pi.origin_pi import (
    OriginPi,
    OriginRig,
    is_workflow_message,
    message_id_of,
    origin_rig,
    origin_server,
    wait_until,
)
from tests.server.test_human_decisions import SHIP_NOW

pytestmark = pytest.mark.timeout(180)
__all__ = ["origin_rig", "origin_server"]

STARTED = re.compile(r"^Started workflow ship: (run-[0-9a-f]+)$", re.M)


def _decision(rig: OriginRig, run_id: str) -> tuple[str, int]:
    [(decision_id, revision)] = rig.rows(
        "SELECT decision_id, revision FROM human_decisions WHERE run_id = ?", run_id
    )
    return str(decision_id), int(revision)


def _agent_starts(origin: OriginPi) -> int:
    return origin.count(lambda e: e.get("type") == "agent_start")


def test_a_decision_is_shown_once_survives_pause_and_resume_and_is_answered_in_pi(
    origin_rig: OriginRig, origin_server: WorkflowServer
) -> None:
    write_workflow(origin_rig.project, "ship", SHIP_NOW)
    origin_rig.provider.script(
        # The user asks the model to answer: its workflow tool is refused.
        Turn(
            tool_calls=(
                ToolCall("workflow", {"action": "answer", "answer": {"choice": "approve"}}),
            )
        ),
        text_turn("I cannot answer that decision; a person must."),
        text_turn("The workflow finished."),  # the terminal message's turn
    )
    origin = origin_rig.spawn()
    found = STARTED.match(origin.notice('/workflow start ship {"version": "3.0"}'))
    assert found is not None
    run_id = found.group(1)
    wait_until(lambda: origin_rig.status(run_id) == "waiting", "the decision")
    decision_id, revision = _decision(origin_rig, run_id)
    # Its one decision message is presented in the session, as a passive message.
    sent = wait_until(
        lambda: [m for m in origin_rig.messages(run_id) if m[1] == "decision" and m[3] == "sent"],
        "the decision message sent",
    )
    [(message_id, *_)] = sent
    shown = origin.wait_event(
        lambda e: is_workflow_message(e) and message_id_of(e) == message_id, "the decision shown"
    )
    text = json.dumps(shown["message"]["content"])
    assert "Ship version 3.0?" in text and "/workflow answer" in text
    assert _agent_starts(origin) == 0, "a decision starts no model turn"
    assert origin_rig.provider.chat_requests() == []

    # The model's tool cannot answer it.
    outcome = origin.child.run_turn("Answer the workflow's decision for me.", 120)
    assert [call.is_error for call in outcome.tool_executions] == [True], outcome
    assert "protected human decision" in json.dumps(outcome.tool_executions[0].result)
    assert origin_rig.status(run_id) == "waiting"

    assert origin.notice("/workflow pause") == f"pause: {run_id}"
    wait_until(lambda: origin_rig.status(run_id) == "paused", "the pause")
    assert origin.notice("/workflow resume") == f"resume: {run_id}"
    wait_until(lambda: origin_rig.status(run_id) == "waiting", "the resume")
    assert _decision(origin_rig, run_id) == (decision_id, revision), "the same revision"
    origin.drain(0.5)
    decisions = [m for m in origin_rig.messages(run_id) if m[1] == "decision"]
    assert [m[0] for m in decisions] == [message_id], "no second decision message"
    assert [message_id_of(e) for e in origin.events if is_workflow_message(e)] == [message_id]

    answered = origin.notice('/workflow answer {"choice": "approve"}')
    match = re.match(
        rf"^Answered the decision of {run_id}; the workflow continues as (run-[0-9a-f]+)$",
        answered,
    )
    assert match is not None, answered
    continuation = match.group(1)
    wait_until(lambda: origin_rig.status(continuation) == "completed", "the continuation", 120)
    assert origin_rig.rows(
        "SELECT outcome, provenance, source_channel FROM human_decision_resolutions "
        "WHERE decision_id = ?",
        decision_id,
    ) == [("accepted", "human", "pi")]
    # The final leaf's terminal message, once; the decision message was shown once.
    wait_until(lambda: origin.count(is_workflow_message) == 2, "the terminal message shown")
    [(terminal, kind, *_)] = origin_rig.messages(continuation)
    assert kind == "terminal"
    assert [message_id_of(e) for e in origin.events if is_workflow_message(e)] == [
        message_id,
        terminal,
    ]
