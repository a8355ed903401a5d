"""An assistant-message step in the real `pi --mode rpc` with the extension (issue 29,
part 1): `/workflow start` makes an interactive run of this Pi session, its step message
appears once and starts one model turn, the turn's final visible reply (not its thinking)
becomes the node's output `{"text": ...}`, and the run goes on to its next node.

Part 2, the session record: the extension records the turn's events (the reply streamed
in pieces, a tool call and its result) and the capture completes with no finding;
`run show` prints the reply and the tool call.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pi_workflows import WorkflowServer
from pi_workflows.testing import ToolCall, Turn, text_turn
from tests.conftest import write_workflow
from tests.pi.origin_pi import (
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

VISIBLE = """
from pi_workflows import assistant_message, compute, define_workflow

workflow = define_workflow(
    name="ask",
    start_at="plan",
    nodes={
        "plan": assistant_message(lambda ctx: "Propose a release plan", max_chars=4000),
        "after": compute(lambda ctx: {"seen": ctx.outputs["plan"]["text"].upper()}),
    },
    edges=[{"from": "plan", "to": "after"}],
)
"""

REPLY = "Plan: freeze on Thursday, ship on Friday."


def node_outputs(rig: OriginRig, run_id: str) -> dict[str, bytes]:
    """Each finished node's output (canonical JSON), by node path."""
    rows = rig.rows(
        "SELECT a.node_path, b.content FROM node_attempts a "
        "JOIN blobs b ON b.digest = a.output_hash WHERE a.run_id = ?",
        run_id,
    )
    return {str(path): bytes(content) for path, content in rows}


def test_the_visible_reply_of_one_turn_is_the_output_and_the_run_goes_on(
    origin_rig: OriginRig, origin_server: WorkflowServer
) -> None:
    write_workflow(origin_rig.project, "ask", VISIBLE)
    origin_rig.provider.script(
        Turn(thinking="PRIVATE-THOUGHT", text=REPLY), text_turn("The workflow finished.")
    )
    origin = origin_rig.spawn()
    found = STARTED.match(origin.notice("/workflow start ask"))
    assert found is not None
    run_id = found.group(1)
    wait_until(lambda: origin_rig.status(run_id) == "completed", "the run to complete", 120)
    outputs = node_outputs(origin_rig, run_id)
    assert json.loads(outputs["plan"]) == {"text": REPLY}, "the visible reply, not its thinking"
    assert json.loads(outputs["after"]) == {"seen": REPLY.upper()}, "the next node read it"
    [(kind, status, accepted)] = origin_rig.rows(
        "SELECT kind, status, accepted_submission_id IS NOT NULL FROM interactive_requests "
        "WHERE run_id = ?",
        run_id,
    )
    assert (kind, status, accepted) == ("assistant", "settled", 1)
    # One step message, sent once, and one model turn on it.
    messages = origin_rig.messages(run_id)
    steps = [m for m in messages if m[1] == "step"]
    assert [(kind, reason, state) for _, kind, reason, state, _ in steps] == [
        ("step", "initial", "sent")
    ]
    origin.drain()
    shown = [message_id_of(e) for e in origin.events if is_workflow_message(e)]
    assert shown.count(steps[0][0]) == 1
    wait_until(
        lambda: [s for _, m, s in origin_rig.turns(run_id) if m == steps[0][0] and s != "open"],
        "the step turn's end",
    )
    assert [s for _, m, s in origin_rig.turns(run_id) if m == steps[0][0]] == ["completed"]
    # The model was asked for a normal reply, not for a `workflow` tool submission.
    requests = origin_rig.provider.chat_requests()
    first = json.dumps(requests[0].body)
    assert "Propose a release plan" in first and "normal visible reply" in first
    # The terminal message follows, with its own turn; the run's result is the next node's.
    wait_until(lambda: origin_rig.provider.chat_requests()[1:], "the terminal turn")
    view = origin_rig.view(run_id)
    assert REPLY.upper() in json.dumps(view["result"])
    assert "PRIVATE-THOUGHT" not in json.dumps(view)


def _run_show(rig: OriginRig, run_id: str, *flags: str) -> str:
    cli = [sys.executable, "-m", "pi_workflows.cli", "--state-dir", str(rig.state_dir)]
    shown = subprocess.run(
        [*cli, "run", "show", run_id, *flags],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def test_the_turn_is_recorded_and_run_show_prints_the_reply_and_the_tool_call(
    origin_rig: OriginRig, origin_server: WorkflowServer
) -> None:
    write_workflow(origin_rig.project, "ask", VISIBLE)
    origin_rig.provider.script(
        Turn(
            text="Let me look first.",
            tool_calls=(ToolCall("bash", {"command": "echo TOOL-SAID-$((40 + 2))"}, "call-look"),),
            chunk_size=4,
        ),
        text_turn(REPLY, chunk_size=3),
        text_turn("The workflow finished."),
    )
    origin = origin_rig.spawn()
    found = STARTED.match(origin.notice("/workflow start ask"))
    assert found is not None
    run_id = found.group(1)
    wait_until(lambda: origin_rig.status(run_id) == "completed", "the run to complete", 120)
    outputs = node_outputs(origin_rig, run_id)
    assert json.loads(outputs["plan"]) == {"text": REPLY}, "the final reply after the tool"

    def step_segment() -> dict[str, object] | None:
        record = origin_rig.view(run_id).get("sessionRecord") or {}
        steps = [s for s in record.get("segments", []) if s.get("kind") == "step"]
        return steps[0] if steps and steps[0]["status"] != "recording" else None

    segment = wait_until(step_segment, "the step turn's capture to end", 60)
    assert segment["status"] == "complete", segment
    assert segment["findings"] == [], "no gap, no count mismatch, no conflicting resend"
    assert segment["node"] == "plan"
    # Each (segment, seq) once, numbered from 0 with no hole, and deltas coalesced:
    # the reply streamed in 3-character pieces is far fewer events than pieces.
    seqs = [
        seq
        for (seq,) in origin_rig.rows(
            "SELECT e.seq FROM session_events e JOIN session_segments s "
            "ON s.segment_id = e.segment_id WHERE s.turn_id = ? ORDER BY e.seq",
            segment["turnId"],
        )
    ]
    assert seqs == list(range(len(seqs))) and len(seqs) == segment["eventCount"]
    types = [
        t
        for (t,) in origin_rig.rows(
            "SELECT e.event_type FROM session_events e JOIN session_segments s "
            "ON s.segment_id = e.segment_id WHERE s.turn_id = ? ORDER BY e.seq",
            segment["turnId"],
        )
    ]
    for kind in ("messageStart", "textDelta", "toolCallEnd", "toolStart", "toolEnd", "messageEnd"):
        assert kind in types, (kind, types)
    assert types.count("textDelta") < len(REPLY) // 3
    # Saved messages name their Pi entries, whose verbatim content is kept.
    entries = origin_rig.rows(
        "SELECT n.role, n.content_hash IS NOT NULL FROM session_entries n "
        "JOIN session_segments s ON s.segment_id = n.segment_id WHERE s.turn_id = ?",
        segment["turnId"],
    )
    assert ("assistant", 1) in entries and ("toolResult", 1) in entries
    shown = _run_show(origin_rig, run_id)
    assert REPLY in shown and "Let me look first." in shown
    assert "bash" in shown and "TOOL-SAID-$((40 + 2))" in shown
    assert "TOOL-SAID-42" in _run_show(origin_rig, run_id, "--full")
    # piw's one frame shows the same turn: the reply and the tool call.
    piw_program = str(Path(sys.executable).with_name("piw"))
    piw = subprocess.run(
        [piw_program, "--state-dir", str(origin_rig.state_dir), run_id, "--once"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert piw.returncode == 0, piw.stderr
    assert "conversation:" in piw.stdout and REPLY in piw.stdout
    assert "tool call bash" in piw.stdout
