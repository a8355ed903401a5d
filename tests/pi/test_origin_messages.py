"""Workflow messages in the real `pi --mode rpc` with the extension (issue 14, item 4 and
the "How it must behave" list): `/workflow start` makes an interactive run of this Pi
session, its step message appears once in the session, each turn is reported with its
exact IDs, and the unproductive-turn rule presents reminders and then fails the step.
"""

from __future__ import annotations

import json
import re

import pytest

from pi_workflows import WorkflowServer
from pi_workflows.testing import Stall, ToolCall, Turn, text_turn, workflow_submit_turn
from tests.conftest import write_workflow
from tests.pi.agents import attempt_of
from tests.pi.origin_pi import (
    OriginPi,
    OriginRig,
    is_workflow_message,
    message_id_of,
    origin_rig,
    origin_server,
    wait_until,
)

pytestmark = pytest.mark.timeout(180)
__all__ = ["origin_rig", "origin_server"]

STARTED = re.compile(r"^Started workflow ask: (run-[0-9a-f]+)$", re.M)

CHECKED = """
from pi_workflows import agent, compute, define_workflow


def check(output, ctx):
    if output["summary"] == "bad":
        raise ValueError("the summary must say what changed")
    return {"summary": output["summary"].upper()}


workflow = define_workflow(
    name="ask",
    start_at="ask",
    nodes={
        "ask": agent(
            prompt=lambda ctx: "Summarise the diff",
            output_schema={"type": "object", "properties": {"summary": {"type": "string"}},
                           "required": ["summary"]},
            validate=check,
            timeout=600,
        ),
        "after": compute(lambda ctx: {"seen": ctx.outputs["ask"]["summary"]}),
    },
    edges=[{"from": "ask", "to": "after"}],
)
"""


def _start(origin: OriginPi, text: str = "/workflow start ask") -> str:
    found = STARTED.match(origin.notice(text))
    assert found is not None
    return found.group(1)


def test_a_step_started_from_pi_is_presented_once_submitted_by_the_model_and_completes(
    origin_rig: OriginRig, origin_server: WorkflowServer
) -> None:
    write_workflow(origin_rig.project, "ask", CHECKED)
    origin_rig.provider.script(
        lambda body: workflow_submit_turn("ask", attempt_of(body), {"summary": "bad"}),
        lambda body: workflow_submit_turn("ask", attempt_of(body), {"summary": "tests pass"}),
        text_turn("The workflow finished."),
    )
    origin = origin_rig.spawn()
    run_id = _start(origin)
    wait_until(lambda: origin_rig.status(run_id) == "completed", "the run to complete", 120)
    view = origin_rig.view(run_id)
    assert "TESTS PASS" in json.dumps(view["result"]), "the validated value went on"
    # The step message appeared once, and its one turn ended after the accepted submit.
    messages = origin_rig.messages(run_id)
    assert [(kind, reason, state) for _, kind, reason, state, _ in messages[:1]] == [
        ("step", "initial", "sent")
    ]
    assert [m for m in messages if m[1] == "step" and m[2] != "initial"] == []
    origin.drain()
    shown = [message_id_of(e) for e in origin.events if is_workflow_message(e)]
    assert shown.count(messages[0][0]) == 1
    # One turn on the step. The run may complete before pi's turn end arrives: the
    # terminal transaction then ends the open turn as `lost` and the late end adopts it.
    wait_until(
        lambda: [s for _, m, s in origin_rig.turns(run_id) if m == messages[0][0] and s != "open"],
        "the step turn's end",
    )
    [(_, status)] = [(m, s) for _, m, s in origin_rig.turns(run_id) if m == messages[0][0]]
    assert status in {"completed", "lost"}
    # The model saw the validation error and corrected itself in the same turn.
    requests = origin_rig.provider.chat_requests()
    assert "the summary must say what changed" in json.dumps(requests[1].body)
    # The terminal message appears once, with its one turn.
    terminal = wait_until(
        lambda: [m for m in origin_rig.messages(run_id) if m[1] == "terminal" and m[3] == "sent"],
        "the terminal message sent",
    )
    assert len(terminal) == 1
    wait_until(lambda: origin.count(is_workflow_message) == 2, "the terminal message shown")
    assert [message_id_of(e) for e in origin.events if is_workflow_message(e)] == [
        messages[0][0],
        terminal[0][0],
    ]
    final = wait_until(lambda: origin_rig.provider.chat_requests()[2:], "the terminal turn")
    assert "finished: completed" in json.dumps(final[0].body)
    [(status, accepted)] = origin_rig.rows(
        "SELECT status, accepted_submission_id IS NOT NULL FROM interactive_requests "
        "WHERE run_id = ?",
        run_id,
    )
    assert accepted == 1, status


def test_unproductive_turns_get_two_reminders_then_the_step_fails(
    origin_rig: OriginRig, origin_server: WorkflowServer
) -> None:
    origin_rig.provider.script(
        text_turn("Thinking."), text_turn("Still."), text_turn("Hm."), text_turn("It failed.")
    )
    origin = origin_rig.spawn()
    run_id = _start(origin)
    # The run is this Pi session's: interactive, bound to pi's own session ID.
    session = origin_rig.origin_session(run_id)
    failed = wait_until(lambda: origin_rig.status(run_id) == "failed", "the step to fail", 120)
    assert failed
    # The failed run's terminal message comes last; its one turn ends too.
    wait_until(
        lambda: [t for t in origin_rig.turns(run_id) if t[2] != "open"][3:], "the terminal turn"
    )
    messages = origin_rig.messages(run_id)
    assert [(kind, reason, state) for _, kind, reason, state, _ in messages] == [
        ("step", "initial", "sent"),
        ("step", "reminder", "sent"),
        ("step", "reminder", "sent"),
        ("terminal", None, "sent"),
    ]
    # Each message appeared in the session exactly once, as the entry the server adopted.
    origin.drain()
    shown = [message_id_of(e) for e in origin.events if is_workflow_message(e)]
    assert shown == [message_id for message_id, *_ in messages]
    assert all(entry is not None for *_, entry in messages)
    # One model turn per message, each reported and settled as completed.
    turns = origin_rig.turns(run_id)
    assert [(message, status) for _, message, status in turns] == [
        (message_id, "completed") for message_id, *_ in messages
    ]
    requests = origin_rig.provider.chat_requests()
    assert len(requests) == 4
    assert "Summarise the diff" in json.dumps(requests[0].body)
    assert "finished: failed" in json.dumps(requests[3].body)
    [(count,)] = origin_rig.rows(
        "SELECT unproductive_turn_ends FROM interactive_requests WHERE run_id = ?", run_id
    )
    assert count == 3
    header = json.loads(origin_rig.session.read_text().splitlines()[0])
    assert session == header["id"], "the origin session is pi's own session ID"


GATED = """
from pi_workflows import agent, checkpoint, define_workflow

workflow = define_workflow(
    name="gated",
    start_at="gate",
    nodes={
        "gate": checkpoint(summary="Go on?", input_schema={
            "type": "object", "required": ["go"], "properties": {"go": {"type": "boolean"}}}),
        "ask": agent(
            prompt=lambda ctx: "Summarise after " + str(ctx.outputs["gate"]["go"]),
            output_schema={"type": "object", "properties": {"summary": {"type": "string"}},
                           "required": ["summary"]},
            timeout=600,
        ),
    },
    edges=[{"from": "gate", "to": "ask"}],
)
"""


def test_the_model_answers_an_ordinary_checkpoint_and_submits_the_continuations_step(
    origin_rig: OriginRig, origin_server: WorkflowServer
) -> None:
    write_workflow(origin_rig.project, "gated", GATED)
    origin_rig.provider.script(
        Turn(tool_calls=(ToolCall("workflow", {"action": "answer", "answer": {"go": "yes"}}),)),
        Turn(tool_calls=(ToolCall("workflow", {"action": "answer", "answer": {"go": True}}),)),
        lambda body: workflow_submit_turn("ask", attempt_of(body), {"summary": "went on"}),
        text_turn("Finished."),
    )
    origin = origin_rig.spawn()
    found = re.match(
        r"^Started workflow gated: (run-[0-9a-f]+)$", origin.notice("/workflow start gated"), re.M
    )
    assert found is not None
    parent = found.group(1)
    wait_until(lambda: origin_rig.status(parent) == "waiting", "the checkpoint")
    # An ordinary checkpoint: the model answers it with the tool (a wrong answer first).
    outcome = origin.child.run_turn("Answer the workflow's checkpoint.", 120)
    assert [call.is_error for call in outcome.tool_executions] == [True, False], outcome
    [(continuation,)] = origin_rig.rows(
        "SELECT run_id FROM runs WHERE run_id != ? ORDER BY rowid", parent
    )
    assert origin_rig.status(parent) == "completed"
    # The continuation is interactive in the same origin session; its step comes here.
    assert origin_rig.origin_session(continuation) == origin_rig.origin_session(parent)
    wait_until(lambda: origin_rig.status(continuation) == "completed", "the continuation", 120)
    assert "Summarise after True" in json.dumps(origin_rig.provider.chat_requests()[2].body)
    # Only the final leaf gets a terminal message: the parent settled by its continuation
    # has none. The session showed each message once.
    wait_until(lambda: origin.count(is_workflow_message) == 2, "the terminal message shown")
    [(message, kind, reason, state, _), (terminal, *_)] = origin_rig.messages(continuation)
    assert (kind, reason, state) == ("step", "initial", "sent")
    assert origin_rig.messages(parent) == []
    assert [message_id_of(e) for e in origin.events if is_workflow_message(e)] == [
        message,
        terminal,
    ]


def test_a_step_message_pending_while_pi_is_busy_waits_and_is_sent_once(
    origin_rig: OriginRig, origin_server: WorkflowServer
) -> None:
    origin_rig.provider.script(Stall("Let me think"), text_turn("Done."))
    origin = origin_rig.spawn()
    origin.child.send({"type": "prompt", "message": "Think about it"})
    origin.wait_event(lambda e: e.get("type") == "message_update", "the user's turn streaming")
    run_id = _start(origin)  # an extension command runs even while pi streams
    [(message, *_)] = wait_until(
        lambda: [m for m in origin_rig.messages(run_id) if m[3] == "pending"], "a pending step"
    )
    # Pi is busy: the message stays pending and nothing is sent.
    polls = origin_rig.rows("SELECT count(*) FROM host_commands")
    wait_until(
        lambda: origin_rig.session_view(origin_rig.origin_session(run_id))["messages"]["count"],
        "the session view to name it",
    )
    assert origin.count(is_workflow_message) == 0
    assert origin_rig.messages(run_id)[0][3] == "pending"
    origin.rpc({"type": "abort"})  # the user's own turn ends: pi is idle
    wait_until(lambda: origin_rig.messages(run_id)[0][3] == "sent", "the step sent")
    wait_until(lambda: [t for t in origin_rig.turns(run_id) if t[2] != "open"], "its turn's end")
    origin.drain()
    shown = [message_id_of(e) for e in origin.events if is_workflow_message(e)]
    assert shown[:1] == [message] and shown.count(message) == 1  # a reminder may follow
    # One turn on it; the ordinary turn was never reported as workflow work (a later
    # turn, if any, is a reminder's), and polling wrote no command.
    turns = origin_rig.turns(run_id)
    assert [(m, s) for _, m, s in turns][:1] == [(message, "completed")]
    assert [t for t in turns if t[1] == message] == turns[:1]
    assert origin_rig.rows("SELECT count(*) FROM host_commands") == polls


def test_workflow_clear_removes_the_retained_terminal_run_and_changes_no_workflow_state(
    origin_rig: OriginRig, origin_server: WorkflowServer
) -> None:
    write_workflow(origin_rig.project, "ask", CHECKED)
    origin_rig.provider.script(
        lambda body: workflow_submit_turn("ask", attempt_of(body), {"summary": "ok"}),
        text_turn("Finished."),
    )
    origin = origin_rig.spawn()
    run_id = _start(origin)
    session = origin_rig.origin_session(run_id)
    wait_until(lambda: origin_rig.status(run_id) == "completed", "the run to complete", 120)
    [(terminal, *_)] = wait_until(
        lambda: [m for m in origin_rig.messages(run_id) if m[1] == "terminal" and m[3] == "sent"],
        "the terminal message sent",
    )
    wait_until(
        lambda: [s for _, m, s in origin_rig.turns(run_id) if m == terminal and s != "open"],
        "the terminal message's first turn to end",
    )
    # Its first turn ended just now: the session view still shows the finished run.
    kept = origin_rig.session_view(session)
    assert kept["activeRun"]["runId"] == run_id
    assert kept["activeRun"]["display"]["status"] == "completed"
    before = origin_rig.rows("SELECT status, revision FROM runs WHERE run_id = ?", run_id)
    assert origin.notice("/workflow clear") == f"Cleared {run_id} from this session's view."
    assert origin_rig.session_view(session)["activeRun"] is None
    assert origin.notice("/workflow clear") == "Nothing to clear: no finished run is shown."
    assert origin_rig.rows("SELECT status, revision FROM runs WHERE run_id = ?", run_id) == before


BIG = """
from pi_workflows import agent, define_workflow

workflow = define_workflow(
    name="big",
    start_at="ask",
    nodes={
        "ask": agent(
            prompt=lambda ctx: "Summarise this: " + "word " * 6000,
            output_schema={"type": "object", "properties": {"summary": {"type": "string"}},
                           "required": ["summary"]},
            timeout=600,
        ),
    },
    edges=[],
)
"""


def test_a_step_message_over_16_kib_is_loaded_by_reference_and_presented_whole(
    origin_rig: OriginRig, origin_server: WorkflowServer
) -> None:
    write_workflow(origin_rig.project, "big", BIG)
    origin_rig.provider.script(
        lambda body: workflow_submit_turn("ask", attempt_of(body), {"summary": "words"}),
        text_turn("Finished."),
    )
    origin = origin_rig.spawn()
    found = re.match(
        r"^Started workflow big: (run-[0-9a-f]+)$", origin.notice("/workflow start big"), re.M
    )
    assert found is not None
    run_id = found.group(1)
    wait_until(lambda: origin_rig.status(run_id) == "completed", "the run to complete", 120)
    event = origin.wait_event(is_workflow_message, "the step message")
    content = event["message"]["content"]
    assert len(content.encode()) > 16 * 1024, "the whole prompt, not a preview"
    assert content.count("word ") == 6000 and "Workflow step contract" in content


def test_follow_ups_are_delivered_in_order_after_the_terminal_turn(
    origin_rig: OriginRig, origin_server: WorkflowServer
) -> None:
    write_workflow(origin_rig.project, "ask", CHECKED)
    origin_rig.provider.script(
        Stall("Working"),
        lambda body: workflow_submit_turn("ask", attempt_of(body), {"summary": "ok"}),
        text_turn("Finished."),
        text_turn("First follow-up done."),
        text_turn("Second follow-up done."),
    )
    origin = origin_rig.spawn()
    run_id = _start(origin)
    origin.wait_event(lambda e: e.get("type") == "message_update", "the step's turn streaming")
    for text in ("Now write the changelog.", "Then tag the release."):
        queued = origin.notice(f"/workflow followup {text}")
        assert queued.startswith(f"Follow-up queued for {run_id}"), queued
    origin.rpc({"type": "abort"})  # paused; resume presents the step again
    wait_until(lambda: origin_rig.status(run_id) == "paused", "the pause")
    assert origin.notice("/workflow resume") == f"resume: {run_id}"
    wait_until(lambda: origin.count(is_workflow_message) == 5, "every message shown", 120)
    kinds = {m[0]: m[1] for m in origin_rig.messages(run_id)}
    shown = [message_id_of(e) for e in origin.events if is_workflow_message(e)]
    assert [kinds[m] for m in shown] == ["step", "step", "terminal", "follow_up", "follow_up"]
    texts = [e["message"]["content"] for e in origin.events if is_workflow_message(e)][3:]
    assert texts == ["Now write the changelog.", "Then tag the release."]

    # Each follow-up was presented only after the turn before it ended.
    def settled() -> bool:
        turns = origin_rig.turns(run_id)
        return len(turns) >= 5 and all(status != "open" for *_, status in turns)

    try:
        wait_until(settled, "five settled turns")
    finally:
        print(origin_rig.turns(run_id), origin_rig.messages(run_id))
    assert [t[1] for t in origin_rig.turns(run_id)] == shown
