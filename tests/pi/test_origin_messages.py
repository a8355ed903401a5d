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
from pi_workflows.testing import text_turn
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

STARTED = re.compile(r"^Started workflow ask: (run-[0-9a-f]+)$")


def _start(origin: OriginPi, text: str = "/workflow start ask") -> str:
    found = STARTED.match(origin.notice(text))
    assert found is not None
    return found.group(1)


def test_unproductive_turns_get_two_reminders_then_the_step_fails(
    origin_rig: OriginRig, origin_server: WorkflowServer
) -> None:
    origin_rig.provider.script(text_turn("Thinking."), text_turn("Still."), text_turn("Hm."))
    origin = origin_rig.spawn()
    run_id = _start(origin)
    # The run is this Pi session's: interactive, bound to pi's own session ID.
    session = origin_rig.origin_session(run_id)
    failed = wait_until(lambda: origin_rig.status(run_id) == "failed", "the step to fail", 120)
    assert failed
    messages = origin_rig.messages(run_id)
    assert [(kind, reason, state) for _, kind, reason, state, _ in messages] == [
        ("step", "initial", "sent"),
        ("step", "reminder", "sent"),
        ("step", "reminder", "sent"),
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
    assert len(origin_rig.provider.chat_requests()) == 3
    assert "Summarise the diff" in json.dumps(origin_rig.provider.chat_requests()[0].body)
    [(count,)] = origin_rig.rows(
        "SELECT unproductive_turn_ends FROM interactive_requests WHERE run_id = ?", run_id
    )
    assert count == 3
    header = json.loads(origin_rig.session.read_text().splitlines()[0])
    assert session == header["id"], "the origin session is pi's own session ID"
