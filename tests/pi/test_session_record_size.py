"""Conformance bullet 50 with the real `pi --mode rpc` and the extension: a large session
history is never copied into runner messages or result blobs.

Two runs of one interactive workflow on one Pi session: in the first the model's turn
is a line, in the second it writes more than 5 MiB before it submits. The session
record holds the 5 MiB; what the server keeps from the runners (launch envelopes, the
replies to their messages, node outputs, the run's events) is the same size for both.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import pytest

from pi_workflows import WorkflowServer
from pi_workflows.testing import Turn, text_turn, workflow_submit_turn
from tests.conftest import write_workflow
from tests.pi.agents import ATTEMPT_IN_PROMPT
from tests.pi.origin_pi import OriginPi, OriginRig, origin_rig, origin_server, wait_until

pytestmark = pytest.mark.timeout(300)
__all__ = ["origin_rig", "origin_server"]

STARTED = re.compile(r"^Started workflow ask: (run-[0-9a-f]+)$", re.M)
LONG = 5 * 1024 * 1024 + 4096
SLACK = 512
"""Bytes the two runs may differ by: none of the runner's records grows with the
conversation; the slack only absorbs a number written with one more digit."""

WORKFLOW = """
from pi_workflows import agent, compute, define_workflow

workflow = define_workflow(
    name="ask",
    start_at="ask",
    nodes={
        "ask": agent(
            prompt=lambda ctx: "Summarise the diff",
            output_schema={"type": "object", "properties": {"summary": {"type": "string"}},
                           "required": ["summary"]},
        ),
        "after": compute(lambda ctx: {"seen": ctx.outputs["ask"]["summary"]}),
    },
    edges=[{"from": "ask", "to": "after"}],
)
"""


def latest_attempt(body: Mapping[str, Any]) -> str:
    """The attempt of the newest step prompt (the first run's is earlier in the history)."""
    found = ATTEMPT_IN_PROMPT.findall(json.dumps(body.get("messages")))
    assert found, "the prompt carries the step contract"
    return str(found[-1])


def talk_then_submit(text: str) -> Any:
    def reply(body: Mapping[str, Any]) -> Turn:
        submit = workflow_submit_turn("ask", latest_attempt(body), {"summary": "same"})
        return Turn(text=text, tool_calls=submit.tool_calls, chunk_size=1024 * 1024)

    return reply


def run_once(rig: OriginRig, origin: OriginPi, text: str) -> str:
    rig.provider.script(talk_then_submit(text), text_turn("Noted."))
    found = STARTED.match(origin.notice("/workflow start ask"))
    assert found is not None
    run_id = found.group(1)
    wait_until(lambda: rig.status(run_id) == "completed", "the run to complete", 180)
    # Its terminal message's turn ends too before the next run's turns are scripted.
    wait_until(lambda: captured(rig, run_id), "the captures of its turns to end", 120)
    return run_id


def captured(rig: OriginRig, run_id: str) -> bool:
    record = rig.view(run_id).get("sessionRecord") or {}
    found = record.get("segments", [])
    kinds = {s["kind"] for s in found}
    return {"step", "terminal"} <= kinds and all(s["status"] == "complete" for s in found)


def one(rig: OriginRig, sql: str, run_id: str) -> int:
    [(value,)] = rig.rows(sql, run_id)
    return int(value or 0)


def runner_bytes(rig: OriginRig, run_id: str) -> dict[str, int]:
    """What the server keeps of the run's runners and results, in bytes."""
    return {
        "launch envelopes": one(
            rig,
            "SELECT SUM(LENGTH(b.content)) FROM runner_epochs r "
            "JOIN blobs b ON b.digest = r.launch_envelope_hash WHERE r.run_id = ?",
            run_id,
        ),
        "runner message replies": one(
            rig,
            "SELECT coalesce(SUM(LENGTH(m.reply)), 0) FROM runner_messages m "
            "JOIN runner_epochs r ON r.runner_epoch = m.runner_epoch WHERE r.run_id = ?",
            run_id,
        ),
        "node outputs": one(
            rig,
            "SELECT SUM(LENGTH(b.content)) FROM node_attempts a "
            "JOIN blobs b ON b.digest = a.output_hash WHERE a.run_id = ?",
            run_id,
        ),
        "events": one(rig, "SELECT SUM(LENGTH(payload)) FROM events WHERE run_id = ?", run_id),
    }


def test_a_five_mib_conversation_costs_the_runners_nothing(
    origin_rig: OriginRig, origin_server: WorkflowServer
) -> None:
    write_workflow(origin_rig.project, "ask", WORKFLOW)
    origin = origin_rig.spawn()
    short = run_once(origin_rig, origin, "Looks fine.")
    long = run_once(origin_rig, origin, ("The diff, line by line. " * 220_000)[:LONG])
    recorded = one(
        origin_rig,
        "SELECT SUM(LENGTH(payload)) FROM session_events WHERE run_id = ?",
        long,
    )
    assert recorded >= 5 * 1024 * 1024, "the session record holds the long conversation"
    small, large = runner_bytes(origin_rig, short), runner_bytes(origin_rig, long)
    for what, size in small.items():
        assert large[what] <= size + SLACK, (what, size, large[what])
    assert sum(large.values()) < 256 * 1024, json.dumps(large)
