"""Branch changes of an origin session in the real `pi --mode rpc` (issue 14, "How it
must behave"): an RPC `fork` to a branch without the step's entry presents the step
exactly once more, with reason `resumed`.

A Pi fork writes a new session file with a new session ID; the run entry the extension
recorded (with the origin session's ID) is on the forked branch, so the forked session
is the same origin session on another branch.
"""

from __future__ import annotations

import re

import pytest

from pi_workflows.testing import Stall, text_turn
from tests.conftest import write_workflow
from tests.pi.agents import running_server
from tests.pi.origin_pi import (
    OriginPi,
    OriginRig,
    is_workflow_message,
    message_id_of,
    origin_rig,
    wait_until,
)

pytestmark = pytest.mark.timeout(240)
__all__ = ["origin_rig"]

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
STARTED = re.compile(r"^Started workflow gated: (run-[0-9a-f]+)$", re.M)
CONTINUES = re.compile(r"^Answered run-[0-9a-f]+; the workflow continues as (run-[0-9a-f]+)$")


def shown_since(origin: OriginPi, mark: int) -> list[str]:
    origin.drain(0.2)
    return [message_id_of(e) for e in origin.events[mark:] if is_workflow_message(e)]


def test_a_fork_to_a_branch_without_the_step_entry_presents_it_once_as_resumed(
    origin_rig: OriginRig,
) -> None:
    write_workflow(origin_rig.project, "gated", GATED)
    origin_rig.provider.script(text_turn("Hello."), text_turn("OK."), Stall("Working"))
    with running_server(origin_rig.state_dir):
        origin = origin_rig.spawn()
        assert origin.child.run_turn("Hi", 60).stop_reason == "stop"  # pi writes its file
        started = STARTED.match(origin.notice("/workflow start gated"))
        assert started is not None
        parent = started.group(1)
        wait_until(lambda: origin_rig.status(parent) == "waiting", "the checkpoint")
        # A user message after the run entry and before the step's entry: the fork point.
        assert origin.child.run_turn("Go on", 60).stop_reason == "stop"
        continued = CONTINUES.match(origin.notice('/workflow answer {"go": true}'))
        assert continued is not None
        run_id = continued.group(1)
        turn = wait_until(
            lambda: [t for t in origin_rig.turns(run_id) if t[2] == "open"], "the step's turn"
        )[0]
        [(first, _, reason, state, _)] = origin_rig.messages(run_id)
        assert (reason, state) == ("initial", "sent")
    # The server is down while pi forks: the old branch's turn end never reaches it.
    forks = origin.rpc({"type": "get_fork_messages"})["data"]["messages"]
    [point] = [m["entryId"] for m in forks if m["text"] == "Go on"]
    origin_rig.provider.script(text_turn("Again."), text_turn("More."), text_turn("Still."))
    mark = len(origin.events)
    assert origin.rpc({"type": "fork", "entryId": point})["data"]["cancelled"] is False
    with running_server(origin_rig.state_dir):
        # The forked branch has the run entry but not the step's: its idle branch report
        # presents the step once more (`resumed`) and closes the old branch's turn.
        resumed = wait_until(
            lambda: [m for m in origin_rig.messages(run_id) if m[2] == "resumed"], "resumed"
        )
        wait_until(lambda: origin_rig.turns(run_id)[0][2] == "lost", "the old turn closed")
        wait_until(lambda: resumed[0][0] in shown_since(origin, mark), "the resumed step shown")
        messages = origin_rig.messages(run_id)
        assert [m[0] for m in messages][:2] == [first, resumed[0][0]]
        assert [m for m in messages if m[2] == "resumed"] == [
            m for m in messages if m[0] == resumed[0][0]
        ]
        assert not [m for m in messages[:2] if m[2] == "reminder"]
        assert origin_rig.turns(run_id)[0][:1] == (turn[0],)
        # The forked session is a new Pi session file, the same origin session.
        assert origin_rig.origin_session(run_id) == origin_rig.origin_session(parent)
