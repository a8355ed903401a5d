"""The session record under faults, with the real `pi --mode rpc` and the extension
(issue 29, "How it must behave"; conformance bullet 40):

- a server SIGKILLed mid-turn: the reconnected coordinator re-sends what was not
  acknowledged, the capture completes with every seq once and no finding, and the step
  settles with the reply;
- a Pi killed mid-turn: the restarted Pi's idle branch report proves the turn lost,
  which fails its capture (`turnLost`); the reminder's turn is recorded on its own;
- a normal runner continuation (the step settled by a submission while its turn still
  runs, the run going on to its next node) leaves the capture open until the Pi turn
  ends, fails nothing, and the extension never reports the server lost.

The model's second request of a turn waits at a `Gate` in the fake provider, so "mid
turn" is a point the test chooses: after a tool call and its result were recorded.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import psutil
import pytest

from pi_workflows import WorkflowServer
from pi_workflows.testing import ScriptedTurn, ToolCall, Turn, text_turn, workflow_submit_turn
from pi_workflows.wire.session_fold import conversation, fold
from tests.conftest import write_workflow
from tests.pi.agents import attempt_of
from tests.pi.origin_pi import (
    OriginPi,
    OriginRig,
    origin_rig,
    origin_server,
    server_process,
    wait_until,
)

pytestmark = pytest.mark.timeout(300)
__all__ = ["origin_rig", "origin_server"]

STARTED = re.compile(r"^Started workflow ask: (run-[0-9a-f]+)$", re.M)
REPLY = "Plan: freeze on Thursday, ship on Friday."
LOST_NOTE = "connection to the workflow server lost"

VISIBLE = """
from pi_workflows import assistant_message, define_workflow

workflow = define_workflow(
    name="ask",
    start_at="plan",
    nodes={"plan": assistant_message(lambda ctx: "Propose a release plan")},
    edges=[],
)
"""

CONTINUED = """
from pi_workflows import agent, assistant_message, compute, define_workflow

workflow = define_workflow(
    name="ask",
    start_at="ask",
    nodes={
        "ask": agent(
            prompt=lambda ctx: "Summarise the diff",
            output_schema={"type": "object", "properties": {"summary": {"type": "string"}},
                           "required": ["summary"]},
        ),
        "then": compute(lambda ctx: {"seen": ctx.outputs["ask"]["summary"]}),
        "plan": assistant_message(lambda ctx: "Propose a release plan"),
    },
    edges=[{"from": "ask", "to": "then"}, {"from": "then", "to": "plan"}],
)
"""


class Gate:
    """A scripted reply that waits (in the provider's handler thread) until opened."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self._open = threading.Event()

    def reply(self, turn: ScriptedTurn) -> Callable[[Mapping[str, Any]], ScriptedTurn]:
        def answer(_body: Mapping[str, Any]) -> ScriptedTurn:
            self.reached.set()
            self._open.wait(120)
            return turn

        return answer

    def open(self) -> None:
        self._open.set()


@pytest.fixture
def gate() -> Iterator[Gate]:
    opened = Gate()
    try:
        yield opened
    finally:
        opened.open()  # never leave a provider thread waiting


def looking() -> Turn:
    return Turn(
        text="Let me look first.",
        tool_calls=(ToolCall("bash", {"command": "echo LOOKED"}, "call-look"),),
        chunk_size=4,
    )


def submit_and_look(attempt: str) -> Turn:
    """The step's submission with another tool call in the same batch: the submission's
    result asks Pi to end the turn, but Pi ends early only when every result of the
    batch asks, so the model is asked again (the turn goes on after the step settled)."""
    submit = workflow_submit_turn("ask", attempt, {"summary": "went on"}).tool_calls[0]
    return Turn(tool_calls=(submit, ToolCall("bash", {"command": "echo LOOKED"}, "call-look")))


def start(origin: OriginPi) -> str:
    found = STARTED.match(origin.notice("/workflow start ask"))
    assert found is not None
    return found.group(1)


def segments(rig: OriginRig, run_id: str) -> list[dict[str, Any]]:
    record = rig.view(run_id).get("sessionRecord") or {}
    found: list[dict[str, Any]] = record.get("segments", [])
    return sorted(found, key=lambda s: (s["startedAt"], s.get("firstPosition") or 0))


def stored_types(rig: OriginRig, turn_id: str) -> list[str]:
    return [
        str(kind)
        for (kind,) in rig.rows(
            "SELECT e.event_type FROM session_events e JOIN session_segments s "
            "ON s.segment_id = e.segment_id WHERE s.turn_id = ? ORDER BY e.seq",
            turn_id,
        )
    ]


def assert_whole(rig: OriginRig, segment: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every seq of the segment stored once, from 0 with no hole, matching the final
    count; the stored items in seq order."""
    rows = rig.rows(
        "SELECT e.seq, e.position, e.event_type, e.payload FROM session_events e "
        "JOIN session_segments s ON s.segment_id = e.segment_id WHERE s.turn_id = ? "
        "ORDER BY e.seq",
        segment["turnId"],
    )
    assert [row[0] for row in rows] == list(range(len(rows)))
    assert segment["eventCount"] == len(rows)
    return [
        {"type": kind, "turnId": segment["turnId"], "position": position, **json.loads(payload)}
        for _, position, kind, payload in rows
    ]


def recorded_text(items: list[dict[str, Any]]) -> str:
    return json.dumps(conversation(fold({"messages": [], "open": None, "tools": {}}, items)))


def test_a_server_killed_mid_turn_loses_and_duplicates_no_event(
    origin_rig: OriginRig, gate: Gate
) -> None:
    write_workflow(origin_rig.project, "ask", VISIBLE)
    origin_rig.provider.script(
        looking(), gate.reply(text_turn(REPLY, chunk_size=3)), text_turn("Noted.")
    )
    with server_process(origin_rig) as first_server:
        origin = origin_rig.spawn()
        run_id = start(origin)
        assert gate.reached.wait(60), "the turn's second model request"
        [segment] = wait_until(lambda: segments(origin_rig, run_id), "the capture to open")
        # The tool's run reached the server before it dies: events are acknowledged.
        wait_until(
            lambda: "toolEnd" in stored_types(origin_rig, segment["turnId"]), "the tool's end"
        )
        os.kill(first_server.pid, signal.SIGKILL)
        assert first_server.wait(30) == -signal.SIGKILL
    # The reply streams and the turn ends while no server listens: all of it waits.
    since = origin.last_index("agent_start")
    gate.open()
    origin.wait_event(lambda e: e.get("type") == "agent_end", "the turn's end", since=since)
    with server_process(origin_rig):
        wait_until(lambda: origin_rig.status(run_id) == "completed", "the run to complete", 120)
        [segment] = [s for s in segments(origin_rig, run_id) if s["kind"] == "step"]
        assert segment["status"] == "complete", segment
        assert segment["findings"] == [], "no gap, no count mismatch, no conflicting resend"
        items = assert_whole(origin_rig, segment)
        text = recorded_text(items)
        assert "Let me look first." in text and REPLY in text and "call-look" in text
        [(output,)] = origin_rig.rows(
            "SELECT b.content FROM node_attempts a JOIN blobs b ON b.digest = a.output_hash "
            "WHERE a.run_id = ? AND a.node_path = 'plan'",
            run_id,
        )
        assert json.loads(output) == {"text": REPLY}


def test_a_pi_killed_mid_turn_fails_its_capture_and_the_reminder_turn_is_recorded(
    origin_rig: OriginRig, origin_server: WorkflowServer, gate: Gate
) -> None:
    write_workflow(origin_rig.project, "ask", VISIBLE)
    origin = origin_rig.spawn()
    origin_rig.provider.script(text_turn("Hello."))
    assert origin.child.run_turn("Hi", 60).stop_reason == "stop"  # pi writes its file
    origin_rig.provider.script(
        looking(), gate.reply(text_turn("never seen")), text_turn(REPLY), text_turn("Noted.")
    )
    run_id = start(origin)
    assert gate.reached.wait(60), "the turn's second model request"
    [first] = wait_until(lambda: segments(origin_rig, run_id), "the capture to open")
    wait_until(lambda: "toolEnd" in stored_types(origin_rig, first["turnId"]), "the tool's end")
    pid = origin.child.pi_pid
    assert pid is not None
    psutil.Process(pid).kill()  # pi dies mid-turn: no agent_end, no final batch
    origin.child.stop()
    gate.open()
    assert segments(origin_rig, run_id)[0]["status"] == "recording"

    origin_rig.spawn()  # a Pi restart on the same session file
    wait_until(lambda: origin_rig.status(run_id) == "completed", "the run to complete", 120)
    first, second = [s for s in segments(origin_rig, run_id) if s["kind"] == "step"]
    # The proved-lost turn failed its capture; what it recorded stays, once each.
    assert (first["status"], first.get("failure")) == ("failed", "turnLost"), first
    assert_whole(origin_rig, first)
    assert "never seen" not in recorded_text(assert_whole(origin_rig, first))
    # The reminder's turn is its own capture, complete, with the reply.
    assert second["turnId"] != first["turnId"]
    assert (second["status"], second["findings"]) == ("complete", []), second
    assert REPLY in recorded_text(assert_whole(origin_rig, second))


def test_a_runner_continuation_mid_turn_leaves_the_capture_open_until_the_turn_ends(
    origin_rig: OriginRig, origin_server: WorkflowServer, gate: Gate
) -> None:
    """Bullet 40: the step settles by its submission while the model still answers; the
    run goes on (a new runner runs `then` and requests `plan`), and the turn's capture
    stays `recording` until Pi's turn ends, then completes. The extension never says the
    server was lost."""
    write_workflow(origin_rig.project, "ask", CONTINUED)
    origin_rig.provider.script(
        lambda body: submit_and_look(attempt_of(body)),
        gate.reply(text_turn("Submitted; carrying on.", chunk_size=5)),
        text_turn(REPLY),
        text_turn("Noted."),
    )
    origin = origin_rig.spawn()
    run_id = start(origin)
    assert gate.reached.wait(60), "the model's request after the submission"
    # Meanwhile the run went on: `then` ran in a new runner, `plan` waits for its turn.
    wait_until(
        lambda: origin_rig.rows(
            "SELECT 1 FROM interactive_requests WHERE run_id = ? AND kind = 'assistant'",
            run_id,
        ),
        "the next step's request",
    )
    [(then_status,)] = origin_rig.rows(
        "SELECT status FROM node_attempts WHERE run_id = ? AND node_path = 'then'", run_id
    )
    assert then_status == "completed"
    # The running turn's events go out within 250 ms: its capture opens meanwhile.
    [segment] = wait_until(lambda: segments(origin_rig, run_id), "the capture to open")
    assert segment["status"] == "recording", "the continuation left the capture open"
    assert segment["findings"] == []
    gate.open()
    wait_until(lambda: origin_rig.status(run_id) == "completed", "the run to complete", 120)
    first = next(s for s in segments(origin_rig, run_id) if s["turnId"] == segment["turnId"])
    assert (first["status"], first["findings"]) == ("complete", []), first
    assert "Submitted; carrying on." in recorded_text(assert_whole(origin_rig, first))
    origin.drain()
    assert not [e for e in origin.events if LOST_NOTE in json.dumps(e)], "no false server loss"
