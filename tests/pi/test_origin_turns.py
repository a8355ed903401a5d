"""Model turns of an origin session in the real `pi --mode rpc` (issue 14, "How it must
behave"): an RPC `abort` pauses the run only after the turn's end, and `/workflow resume`
presents the step once more with one fresh turn; a Pi killed mid-turn and started again
on the same session file sends nothing twice, and its idle branch report closes the lost
turn under the reminder rule; a server restart (graceful or SIGKILL) closes no turn
by itself; two pi on one
origin session have one active coordinator, and only it sends.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from pi_workflows import WorkflowServer
from pi_workflows.testing import Stall, text_turn
from tests.pi.agents import running_server
from tests.pi.origin_pi import (
    OriginPi,
    OriginRig,
    is_workflow_message,
    message_id_of,
    origin_rig,
    origin_server,
    server_process,
    wait_until,
)

pytestmark = pytest.mark.timeout(240)
__all__ = ["origin_rig", "origin_server"]

STARTED = re.compile(r"^Started workflow ask: (run-[0-9a-f]+)$", re.M)


def start(origin: OriginPi) -> str:
    found = STARTED.match(origin.notice("/workflow start ask"))
    assert found is not None
    return found.group(1)


def converse(rig: OriginRig, origin: OriginPi) -> None:
    """An ordinary first exchange: pi writes its session file only once it holds a
    model reply, and a restart needs the file."""
    rig.provider.script(text_turn("Hello."))
    assert origin.child.run_turn("Hi", 60).stop_reason == "stop"


def shown(origin: OriginPi) -> list[str]:
    origin.drain()
    return [message_id_of(e) for e in origin.events if is_workflow_message(e)]


def open_turn(rig: OriginRig, run_id: str, origin: OriginPi) -> tuple[str, str]:
    """Wait until the server holds an open turn of the run and the model streams (a
    `Stall` answered pi's request: an abort now ends that stream); (turn, message)."""
    found = wait_until(
        lambda: [(t, m) for t, m, status in rig.turns(run_id) if status == "open"],
        "an open turn",
    )
    since = origin.last_index("agent_start")
    origin.wait_event(lambda e: e.get("type") == "message_update", "the stream", since=since)
    turn, message = found[0]
    return str(turn), str(message)


def test_abort_pauses_after_the_turn_end_and_resume_presents_the_step_once(
    origin_rig: OriginRig, origin_server: WorkflowServer
) -> None:
    origin_rig.provider.script(Stall("Working"), text_turn("Resumed."))
    origin = origin_rig.spawn()
    run_id = start(origin)
    turn, first = open_turn(origin_rig, run_id, origin)
    # A busy origin turn shows `running` (the waiting step, for presentation only).
    assert origin_rig.status(run_id) == "running"
    origin.rpc({"type": "abort"})
    wait_until(lambda: origin_rig.status(run_id) == "paused", "the durable pause")
    assert origin_rig.turns(run_id) == [(turn, first, "aborted")]
    assert origin_rig.rows("SELECT paused FROM runs WHERE run_id = ?", run_id) == [(1,)]
    assert "pause" not in origin_rig.view(run_id)["display"]["controls"]

    assert origin.notice("/workflow resume") == f"resume: {run_id}"
    fresh = wait_until(
        lambda: [t for t in origin_rig.turns(run_id) if t[0] != turn and t[2] != "open"],
        "the fresh turn to end",
    )
    messages = origin_rig.messages(run_id)
    resumed = [m for m in messages if m[2] == "resumed"]
    assert len(resumed) == 1, messages
    assert resumed[0][3] == "sent" and resumed[0][4] is not None
    # Exactly one fresh turn, on the resumed message; the session shows each message once.
    assert [(m, s) for _, m, s in origin_rig.turns(run_id)][:2] == [
        (first, "aborted"),
        (resumed[0][0], "completed"),
    ]
    assert fresh[0][1] == resumed[0][0]
    assert shown(origin)[:2] == [first, resumed[0][0]]
    assert len(set(shown(origin))) == len(shown(origin)), "no message was sent twice"


def test_a_pi_killed_mid_turn_and_restarted_sends_nothing_twice_and_closes_the_lost_turn(
    origin_rig: OriginRig, origin_server: WorkflowServer
) -> None:
    origin = origin_rig.spawn()
    converse(origin_rig, origin)
    origin_rig.provider.script(Stall("Working"), text_turn("Back."), text_turn("Again."))
    run_id = start(origin)
    turn, first = open_turn(origin_rig, run_id, origin)
    assert shown(origin) == [first]
    pid = origin.child.pi_pid
    assert pid is not None
    psutil.Process(pid).kill()  # pi dies mid-turn: no agent_end, no report
    origin.child.stop()
    assert origin_rig.turns(run_id) == [(turn, first, "open")]

    again = origin_rig.spawn()  # a Pi restart on the same session file
    # Its idle branch report closes the lost turn; the reminder rule presents a reminder.
    wait_until(lambda: origin_rig.turns(run_id)[0][2] == "lost", "the lost turn to close")
    reminder = wait_until(
        lambda: [m for m in origin_rig.messages(run_id) if m[2] == "reminder"], "a reminder"
    )[0]
    wait_until(lambda: reminder[0] in shown(again), "the reminder in the restarted pi")
    [(count,)] = origin_rig.rows(
        "SELECT unproductive_turn_ends FROM interactive_requests WHERE run_id = ?", run_id
    )
    assert count >= 1
    # The initial message was not sent again, and the first turn was not reported again.
    assert first not in shown(again)
    assert origin_rig.messages(run_id)[0][:4] == (first, "step", "initial", "sent")
    turns = origin_rig.turns(run_id)
    assert [t[0] for t in turns].count(turn) == 1
    assert all(t[0] != turn for t in turns[1:])
    text = origin_rig.session.read_text()
    assert text.count(first) == 1, "the step entry is in the session file once"


def test_a_server_restart_closes_no_turn_and_a_turn_end_meanwhile_is_reported_after_it(
    origin_rig: OriginRig,
) -> None:
    origin_rig.provider.script(Stall("Working"))
    with running_server(origin_rig.state_dir):
        origin = origin_rig.spawn()
        run_id = start(origin)
        turn, first = open_turn(origin_rig, run_id, origin)
    # The server is gone while the turn is open; the turn ends (abort) while nobody
    # listens: the coordinator keeps its turn ID and the end until it is connected again.
    origin.rpc({"type": "abort"})
    origin.wait_event(lambda e: e.get("type") == "agent_end", "the aborted turn's end")
    assert origin_rig.turns(run_id) == [(turn, first, "open")]
    with running_server(origin_rig.state_dir):
        # Startup closed nothing; the reconnected coordinator reports the branch (not
        # idle: a turn of its own is unsettled), then the same turn's start and end.
        wait_until(lambda: origin_rig.status(run_id) == "paused", "the pause after the end")
        assert origin_rig.turns(run_id) == [(turn, first, "aborted")]
        assert origin_rig.messages(run_id)[0][3] == "sent"
        assert shown(origin) == [first]


def test_a_server_killed_with_an_open_turn_closes_no_turn_and_the_end_is_reported_after(
    origin_rig: OriginRig,
) -> None:
    """The server dies by SIGKILL (no drain, no goodbye) while a step's turn is open:
    the next server's recovery closes no turn by itself, and the reconnected coordinator
    reports the end it kept, which pauses the run (the turn was aborted)."""
    origin_rig.provider.script(Stall("Working"))
    with server_process(origin_rig) as first_server:
        origin = origin_rig.spawn()
        run_id = start(origin)
        turn, first = open_turn(origin_rig, run_id, origin)
        os.kill(first_server.pid, signal.SIGKILL)
        assert first_server.wait(30) == -signal.SIGKILL
    origin.rpc({"type": "abort"})
    origin.wait_event(lambda e: e.get("type") == "agent_end", "the aborted turn's end")
    assert origin_rig.turns(run_id) == [(turn, first, "open")]
    with server_process(origin_rig):
        wait_until(lambda: origin_rig.status(run_id) == "paused", "the pause after the end")
        assert origin_rig.turns(run_id) == [(turn, first, "aborted")]
        assert origin_rig.messages(run_id)[0][3] == "sent"
        assert shown(origin) == [first]


def test_two_pi_on_one_origin_session_have_one_coordinator_and_only_it_sends(
    origin_rig: OriginRig, origin_server: WorkflowServer
) -> None:
    first = origin_rig.spawn()
    converse(origin_rig, first)
    origin_rig.provider.script(
        Stall("Working"), text_turn("One."), text_turn("Two."), text_turn("Failed.")
    )
    run_id = start(first)
    turn, initial = open_turn(origin_rig, run_id, first)
    # A second pi on the same session file: the same origin session. Its coordinator
    # claims the epoch (fencing the first one's) and its idle branch report closes the
    # turn it cannot see as lost, which presents a reminder: the second pi sends it.
    second = origin_rig.spawn()
    wait_until(lambda: origin_rig.turns(run_id)[0][2] == "lost", "the fenced turn closed")
    reminder = wait_until(
        lambda: [m[0] for m in origin_rig.messages(run_id) if m[2] == "reminder"], "a reminder"
    )[0]
    wait_until(lambda: reminder in shown(second), "the reminder in the second pi")
    # The first pi, now idle, is fenced: its abort's end pauses nothing, and it sends
    # nothing; every later message goes to the second pi.
    first.rpc({"type": "abort"})
    first.wait_event(lambda e: e.get("type") == "agent_end", "the first pi's turn end")
    wait_until(lambda: origin_rig.status(run_id) == "failed", "three unproductive turns", 120)
    wait_until(lambda: len(shown(second)) == 3, "the terminal message in the second pi")
    sent = [m[0] for m in origin_rig.messages(run_id)]
    assert len(sent) == 4 and sent[0] == initial  # three steps and the terminal message
    assert shown(first) == [initial]
    assert shown(second) == sent[1:]
    assert origin_rig.rows("SELECT paused FROM runs WHERE run_id = ?", run_id) == [(0,)]
    assert origin_rig.turns(run_id)[0][0] == turn


def _run_show(rig: OriginRig, run_id: str) -> dict[str, Any]:
    """`pi-workflows run show RUN_ID --json`: the CLI's own view of the run."""
    done = subprocess.run(
        [sys.executable, "-m", "pi_workflows.cli", "run", "show", run_id, "--json"],
        env={**os.environ, "PI_CODING_AGENT_DIR": str(rig.agent_dir)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    shown: dict[str, Any] = json.loads(done.stdout)
    return shown


def _piw_frame(rig: OriginRig, run_id: str) -> str:
    """`piw RUN_ID --once`: the viewer's one plain-text frame of the run."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "piw"), run_id, "--once"],
        env={**os.environ, "PI_CODING_AGENT_DIR": str(rig.agent_dir)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def _status_is(text: str, event: dict[str, Any]) -> bool:
    return event.get("method") == "setStatus" and event.get("statusText") == text


def _widget_index(origin: OriginPi, wanted: list[str]) -> int:
    """The index of pi's first `setWidget` whose lines include every line of `wanted`."""
    event = origin.wait_event(
        lambda e: (
            e.get("type") == "extension_ui_request"
            and e.get("method") == "setWidget"
            and all(line in (e.get("widgetLines") or []) for line in wanted)
        ),
        f"the widget showing {wanted}",
    )
    return origin.events.index(event)


def test_the_widget_run_show_and_the_session_view_show_the_same_status_and_controls(
    origin_rig: OriginRig, origin_server: WorkflowServer
) -> None:
    """The widget projects the session view the coordinator subscribes to: what it shows
    is the server's `display`, the same one `run show --json`, `piw RUN_ID --once` and a
    bystander's session view get (conformance bullet 36)."""
    origin_rig.provider.script(Stall("Working"))
    origin = origin_rig.spawn()
    run_id = start(origin)
    open_turn(origin_rig, run_id, origin)
    session = origin_rig.origin_session(run_id)
    for status in ("running", "paused"):
        if status == "paused":
            origin.rpc({"type": "abort"})
            wait_until(lambda: origin_rig.status(run_id) == "paused", "the durable pause")
        shown = _run_show(origin_rig, run_id)["display"]
        viewed = origin_rig.session_view(session)["activeRun"]["display"]
        assert shown["status"] == viewed["status"] == status
        assert shown["controls"] == viewed["controls"]
        # piw's frame: the same status and controls, as the viewer's header line.
        header = _piw_frame(origin_rig, run_id).splitlines()[1]
        assert header.startswith(f"status: {status} ")
        assert header.rstrip().endswith(f"controls: {', '.join(shown['controls'])}")
        assert (shown.get("currentNode"), shown.get("waitingOn")) == (
            ("ask", None) if status == "running" else (None, "ask")
        )
        # Each allowed control as the /workflow command that performs it.
        controls = [f"  /workflow {control} {run_id}" for control in shown["controls"]]
        node = "at node: ask" if status == "running" else "waiting on: ask"
        at = _widget_index(origin, [f"workflow ask {run_id}: {status}", node, *controls])
        assert origin.events[at]["widgetLines"][0] == f"workflow ask {run_id}: {status}"
        status_line = origin.wait_event(
            functools.partial(_status_is, f"workflow ask: {status} (ask)"),
            f"the status line showing {status}",
            since=at,
        )
        assert status_line["statusKey"] == "pi-workflows"
        if status == "paused":
            # `paused` appeared only after the aborted turn ended in pi: never before.
            ended = origin.wait_event(lambda e: e.get("type") == "agent_end", "the turn end")
            assert origin.events.index(ended) < at
    assert [s for *_, s in origin_rig.turns(run_id)] == ["aborted"]


def test_a_message_pending_across_a_server_restart_is_sent_once_after_the_branch_report(
    origin_rig: OriginRig,
) -> None:
    """The step message is pending (pi busy with a user turn) when the server stops;
    pi becomes idle while nobody listens, so nothing may be sent; once the server is
    back, the coordinator reconnects, reports the branch, and sends it exactly once."""
    origin_rig.provider.script(Stall("Let me think"), text_turn("On it."), text_turn("Done."))
    with running_server(origin_rig.state_dir):
        origin = origin_rig.spawn()
        origin.child.send({"type": "prompt", "message": "Think about it"})
        origin.wait_event(lambda e: e.get("type") == "message_update", "the user's turn")
        run_id = start(origin)
        [(message, *_)] = wait_until(
            lambda: [m for m in origin_rig.messages(run_id) if m[3] == "pending"], "the step"
        )
    origin.rpc({"type": "abort"})  # pi is idle now, with the server down
    origin.wait_event(lambda e: e.get("type") == "agent_end", "the user's turn end")
    assert shown(origin) == []
    with running_server(origin_rig.state_dir):
        assert origin_rig.messages(run_id)[0][:4] == (message, "step", "initial", "pending")
        wait_until(lambda: origin_rig.messages(run_id)[0][3] == "sent", "the step sent")
        wait_until(lambda: [t for t in origin_rig.turns(run_id) if t[2] != "open"], "its turn")
        # Sent once (a reminder for its unproductive turn may follow it).
        assert shown(origin)[:1] == [message] and shown(origin).count(message) == 1
        assert [t[1] for t in origin_rig.turns(run_id)][:1] == [message]
        assert [t for t in origin_rig.turns(run_id) if t[1] == message][1:] == []
