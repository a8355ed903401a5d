"""Terminal and notification workflow messages of interactive runs, over the real socket.

Real server, real runners and (for agent steps) real validation children. When an
interactive run becomes terminal (completed, failed, timed out, cancelled), its terminal
transaction also ends its open turns as `lost`, cancels its pending step messages and
adds one `terminal` message with its outcome, only for the final leaf of a
checkpoint-continuation chain. A notify node of an interactive run adds one passive
`notification` message with its node result; it never opens a model turn. The session
view shows both, and names them as the next message to the active coordinator.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from tests.conftest import write_workflow
from tests.server import origin
from tests.server.origin import SESSION, rows, session_snapshot, start
from tests.server.runs import TERMINAL, wait_for
from tests.server.watchers import Watcher

pytestmark = pytest.mark.timeout(120)

running = origin.running

WORKFLOWS = {
    "ask": origin.AGENT_WORKFLOW,
    "broken": """
from pi_workflows import compute, define_workflow


def boom(ctx):
    raise RuntimeError("the build is red")


workflow = define_workflow(name="broken", start_at="boom", nodes={"boom": compute(boom)}, edges=[])
""",
    "late": """
import time
from pi_workflows import compute, define_workflow

workflow = define_workflow(
    name="late",
    start_at="slow",
    nodes={"slow": compute(lambda ctx: time.sleep(300) or {}, timeout=1)},
    edges=[],
)
""",
    "gated": """
from pi_workflows import checkpoint, compute, define_workflow

workflow = define_workflow(
    name="gated",
    start_at="gate",
    nodes={
        "gate": checkpoint(summary="Go on?"),
        "done": compute(lambda ctx: {"went": True}),
    },
    edges=[{"from": "gate", "to": "done"}],
)
""",
    "noted": """
from pi_workflows import agent, define_workflow, notify

workflow = define_workflow(
    name="noted",
    start_at="note",
    nodes={
        "note": notify(lambda ctx: "Looking at " + ctx.input["topic"], kind="progress"),
        "ask": agent(
            prompt="Summarise",
            output_schema={"type": "object", "properties": {"summary": {"type": "string"}},
                           "required": ["summary"]},
            timeout=600,
        ),
    },
    edges=[{"from": "note", "to": "ask"}],
)
""",
    "told": """
from pi_workflows import define_workflow, notify

workflow = define_workflow(
    name="told", start_at="note", nodes={"note": notify("Done here", kind="final")}, edges=[]
)
""",
}


@pytest.fixture
def project(short_tmp: Path) -> Path:
    folder = short_tmp / "project"
    for name, source in WORKFLOWS.items():
        write_workflow(folder, name, source)
    return folder


class Coordinator(Watcher):
    """The session's coordinator connection, with the epoch it was granted."""

    epoch: int = 0


@pytest.fixture
def coordinator(running: WorkflowServer) -> Iterator[Coordinator]:
    watcher = Coordinator(running.socket_path)
    try:
        answer = watcher.request(
            "view.subscribe", {"kind": "sessionView", "sessionId": SESSION, "coordinator": True}
        )
        assert answer["outcome"] == "accepted", answer
        watcher.epoch = int(answer["receipt"]["coordinatorEpoch"])
        yield watcher
    finally:
        watcher.close()


def messages(state_dir: Path, run_id: str) -> list[tuple[Any, ...]]:
    return rows(
        state_dir,
        "SELECT kind, reason, state, source_id FROM workflow_messages WHERE run_id = ? "
        "ORDER BY session_order",
        run_id,
    )


def content(state_dir: Path, run_id: str, kind: str) -> dict[str, Any]:
    [(blob,)] = rows(
        state_dir,
        "SELECT b.content FROM workflow_messages m JOIN blobs b ON b.digest = m.content_digest "
        "WHERE m.run_id = ? AND m.kind = ?",
        run_id,
        kind,
    )
    value = json.loads(bytes(blob))
    assert isinstance(value, dict)
    return value


def finish(client: WorkflowClient, run_id: str) -> str:
    return str(wait_for(client, run_id, TERMINAL)["display"]["status"])


def submit(coordinator: Coordinator, run_id: str, value: Any, state_dir: Path) -> dict[str, Any]:
    [(request_id,)] = rows(
        state_dir,
        "SELECT request_id FROM interactive_requests WHERE run_id = ? AND status = 'pending'",
        run_id,
    )
    return coordinator.request(
        "interaction.submit",
        {
            "interactionId": request_id,
            "submissionId": f"submission-{run_id}",
            "value": value,
            "sessionId": SESSION,
            "coordinatorEpoch": coordinator.epoch,
        },
        runId=run_id,
    )


def test_a_completed_interactive_run_gets_one_terminal_message_whose_first_turn_opens_once(
    running: WorkflowServer, project: Path, coordinator: Coordinator
) -> None:
    state = running.state_dir
    with WorkflowClient(state, autostart=False, timeout=30) as client:
        run_id = start(client, project, "ask", SESSION)["receipt"]["runId"]
        wait_for(client, run_id, {"waiting"})
        accepted = submit(coordinator, run_id, {"summary": "two files"}, state)
        assert accepted["outcome"] == "accepted", accepted
        assert finish(client, run_id) == "completed"
    assert messages(state, run_id) == [
        ("step", "initial", "cancelled", messages(state, run_id)[0][3]),
        ("terminal", None, "pending", run_id),
    ]
    body = content(state, run_id, "terminal")
    assert body == {
        "runId": run_id,
        "workflow": "ask",
        "outcome": "completed",
        "output": {"summary": "two files"},
    }
    # The coordinator's view keeps the terminal run and names its terminal message next.
    view = session_snapshot(
        coordinator,
        lambda v: v["nextMessage"] is not None and v["nextMessage"]["kind"] == "terminal",
        "the terminal message",
    )
    assert view["activeRun"]["runId"] == run_id
    assert view["activeRun"]["display"]["status"] == "completed"
    message_id = view["nextMessage"]["messageId"]
    assert view["nextMessage"]["content"]["value"]["outcome"] == "completed"
    # Pi shows it: the branch report makes it sent; it stays in the window (open) until
    # its first turn ends, and that turn is the only one it opens.
    adopted = coordinator.request(
        "workflowMessage.reportBranch",
        {
            "sessionId": SESSION,
            "entries": [{"messageId": message_id, "entryId": "entry-t"}],
            "isIdle": False,
            "hasPendingMessages": False,
        },
    )
    assert adopted["receipt"]["adopted"] == [message_id], adopted

    def turn(phase: str, turn_id: str) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "sessionId": SESSION,
            "messageId": message_id,
            "turnId": turn_id,
            "phase": phase,
        }
        if phase == "ended":
            payload |= {"stopReason": "completed", "responseEntryId": None}
        return coordinator.request("workflowTurn.report", payload, runId=run_id)

    assert turn("started", "turn-1")["receipt"]["ownership"] == "active"
    kept = session_snapshot(
        coordinator,
        lambda v: v["nextMessage"] is None and v["messages"]["count"] == 1,
        "the sent terminal message in the window",
    )
    assert kept["messages"]["items"][0]["state"] == "sent"
    assert turn("ended", "turn-1")["receipt"]["ownership"] == "settled"
    assert turn("started", "turn-2")["receipt"]["ownership"] == "absent"
    # After its first turn ended it leaves the window, and the run stays in view (60 s).
    after = session_snapshot(coordinator, lambda v: v["messages"]["count"] == 0, "an empty window")
    assert after["activeRun"]["runId"] == run_id


def test_failed_and_timed_out_runs_get_their_outcome_and_a_headless_run_none(
    running: WorkflowServer, project: Path
) -> None:
    state = running.state_dir
    with WorkflowClient(state, autostart=False, timeout=30) as client:
        broken = start(client, project, "broken", SESSION)["receipt"]["runId"]
        assert finish(client, broken) == "failed"
        late = start(client, project, "late", SESSION)["receipt"]["runId"]
        assert finish(client, late) == "timed_out"
        headless = start(client, project, "broken", None)["receipt"]["runId"]
        assert finish(client, headless) == "failed"
    failed = content(state, broken, "terminal")
    assert failed["outcome"] == "failed" and "the build is red" in failed["reason"]
    assert "output" not in failed
    assert content(state, late, "terminal")["outcome"] == "timed_out"
    assert messages(state, headless) == []


def test_a_cancel_ends_the_open_turn_lost_cancels_the_step_and_adds_the_terminal_message(
    running: WorkflowServer, project: Path, coordinator: Coordinator
) -> None:
    state = running.state_dir
    with WorkflowClient(state, autostart=False, timeout=30) as client:
        run_id = start(client, project, "ask", SESSION)["receipt"]["runId"]
        wait_for(client, run_id, {"waiting"})
        view = session_snapshot(coordinator, lambda v: v["nextMessage"] is not None, "a step")
        step = view["nextMessage"]["messageId"]
        coordinator.request(
            "workflowMessage.reportBranch",
            {
                "sessionId": SESSION,
                "entries": [{"messageId": step, "entryId": "entry-s"}],
                "isIdle": False,
                "hasPendingMessages": False,
            },
        )
        started = coordinator.request(
            "workflowTurn.report",
            {"sessionId": SESSION, "messageId": step, "turnId": "turn-s", "phase": "started"},
            runId=run_id,
        )
        assert started["receipt"]["ownership"] == "active", started
        cancelled = client.request("run.cancel", {"reason": "user"}, run_id=run_id)
        assert cancelled["outcome"] == "accepted", cancelled
    assert rows(state, "SELECT status FROM workflow_turns WHERE turn_id = 'turn-s'") == [("lost",)]
    assert [(kind, state_) for kind, _, state_, _ in messages(state, run_id)] == [
        ("step", "sent"),
        ("terminal", "pending"),
    ]
    assert content(state, run_id, "terminal")["outcome"] == "cancelled"
    # The late matching end adopts the terminal cleanup.
    late = coordinator.request(
        "workflowTurn.report",
        {
            "sessionId": SESSION,
            "messageId": step,
            "turnId": "turn-s",
            "phase": "ended",
            "stopReason": "completed",
            "responseEntryId": None,
        },
        runId=run_id,
    )
    assert late["receipt"]["ownership"] == "settled"
    assert late["receipt"]["turn"]["status"] == "lost"


def test_only_the_final_leaf_of_a_continuation_chain_gets_a_terminal_message(
    running: WorkflowServer, project: Path
) -> None:
    state = running.state_dir
    with WorkflowClient(state, autostart=False, timeout=30) as client:
        parent = start(client, project, "gated", SESSION)["receipt"]["runId"]
        wait_for(client, parent, {"waiting"})
        answered = client.call("run.answer", {"answer": {"ok": True}}, run_id=parent)
        leaf = answered["receipt"]["continuationRunId"]
        assert finish(client, leaf) == "completed"
    assert messages(state, parent) == []
    assert messages(state, leaf) == [("terminal", None, "pending", leaf)]
    assert content(state, leaf, "terminal")["outcome"] == "completed"


def test_a_notify_node_adds_one_passive_notification_that_opens_no_turn(
    running: WorkflowServer, project: Path, coordinator: Coordinator
) -> None:
    state = running.state_dir
    with WorkflowClient(state, autostart=False, timeout=30) as client:
        run_id = start(client, project, "noted", SESSION)["receipt"]["runId"]
        wait_for(client, run_id, {"waiting"})
        headless = start(client, project, "told", None)["receipt"]["runId"]
        assert finish(client, headless) == "completed"
    assert messages(state, headless) == []  # no origin session, no message
    [note, step] = messages(state, run_id)
    assert note[:3] == ("notification", None, "pending")
    assert note[3].endswith(":note:1")
    assert step[:3] == ("step", "initial", "pending")
    assert content(state, run_id, "notification") == {
        "runId": run_id,
        "step": "note",
        "text": "Looking at the diff",
        "kind": "progress",
    }
    # The notify node's result and its message: the node finished, the message exists.
    assert rows(
        state,
        "SELECT status FROM node_attempts WHERE run_id = ? AND node_path = 'note'",
        run_id,
    ) == [("completed",)]
    # It is delivered first (session order), passively: it never opens a model turn.
    view = session_snapshot(coordinator, lambda v: v["nextMessage"] is not None, "a message")
    assert view["nextMessage"]["kind"] == "notification"
    notification = view["nextMessage"]["messageId"]
    coordinator.request(
        "workflowMessage.reportBranch",
        {
            "sessionId": SESSION,
            "entries": [{"messageId": notification, "entryId": "entry-n"}],
            "isIdle": False,
            "hasPendingMessages": False,
        },
    )
    opened = coordinator.request(
        "workflowTurn.report",
        {"sessionId": SESSION, "messageId": notification, "turnId": "turn-n", "phase": "started"},
        runId=run_id,
    )
    assert opened["receipt"]["ownership"] == "absent", opened
    after = session_snapshot(
        coordinator,
        lambda v: v["nextMessage"] is not None and v["nextMessage"]["kind"] == "step",
        "the step next",
    )
    assert after["messages"]["count"] == 1  # the sent notification left the window


# --- follow-ups ----------------------------------------------------------------------------


def follow_ups(state_dir: Path) -> list[tuple[str, str]]:
    return [
        (json.loads(bytes(blob))["text"], follow_up_state)
        for blob, follow_up_state in rows(
            state_dir,
            "SELECT b.content, f.state FROM follow_ups f JOIN blobs b ON b.digest = f.content_hash "
            "ORDER BY f.created_at, f.rowid",
        )
    ]


def show_and_end(coordinator: Coordinator, run_id: str, message_id: str, turn_id: str) -> None:
    """Pi shows the message and its turn runs to the end (branch report, start, end)."""
    adopted = coordinator.request(
        "workflowMessage.reportBranch",
        {
            "sessionId": SESSION,
            "entries": [{"messageId": message_id, "entryId": f"entry-{turn_id}"}],
            "isIdle": False,
            "hasPendingMessages": False,
        },
    )
    assert adopted["receipt"]["adopted"] == [message_id], adopted
    base = {"sessionId": SESSION, "messageId": message_id, "turnId": turn_id}
    started = coordinator.request("workflowTurn.report", {**base, "phase": "started"}, runId=run_id)
    assert started["receipt"]["ownership"] == "active", started
    ended = coordinator.request(
        "workflowTurn.report",
        {**base, "phase": "ended", "stopReason": "completed", "responseEntryId": None},
        runId=run_id,
    )
    assert ended["receipt"]["ownership"] == "settled", ended


def names(message_id: str) -> Callable[[dict[str, Any]], bool]:
    """A session-view check: it names `message_id` as the next message."""

    def check(view: dict[str, Any]) -> bool:
        return view["nextMessage"] is not None and view["nextMessage"]["messageId"] == message_id

    return check


def pending_follow_up_messages(state_dir: Path, run_id: str) -> list[str]:
    return [
        message_id
        for (message_id,) in rows(
            state_dir,
            "SELECT message_id FROM workflow_messages WHERE run_id = ? AND kind = 'follow_up' "
            "AND state = 'pending' ORDER BY session_order",
            run_id,
        )
    ]


def test_follow_ups_wait_for_the_final_outcome_and_its_terminal_turn_then_come_in_order(
    running: WorkflowServer, project: Path, coordinator: Coordinator
) -> None:
    from pi_workflows.storage import open_database  # noqa: PLC0415 - a read of the counts
    from pi_workflows.storage._follow_ups import pending_follow_up_count  # noqa: PLC0415

    state = running.state_dir
    with WorkflowClient(state, autostart=False, timeout=30) as client:
        parent = start(client, project, "gated", SESSION)["receipt"]["runId"]
        wait_for(client, parent, {"waiting"})
        first = client.request(
            "followUp.add", {"text": "first"}, run_id=parent, idempotency_key="fu-1"
        )
        assert first["outcome"] == "accepted", first
        assert first["receipt"]["state"] == "pending"
        again = client.request(
            "followUp.add", {"text": "first"}, run_id=parent, idempotency_key="fu-1"
        )
        assert again["outcome"] == "adopted" and again["receipt"] == first["receipt"]
        client.call("followUp.add", {"text": "second"}, run_id=parent)
        leaf = client.call("run.answer", {"answer": {}}, run_id=parent)["receipt"][
            "continuationRunId"
        ]
        assert finish(client, leaf) == "completed"
        # Added to the continuation: the same chain, after the two.
        client.call("followUp.add", {"text": "third"}, run_id=leaf)
    # The final outcome is there, but its terminal turn has not run: nothing presented.
    assert follow_ups(state) == [("first", "pending"), ("second", "pending"), ("third", "pending")]
    assert pending_follow_up_messages(state, leaf) == []
    [(terminal,)] = rows(
        state,
        "SELECT message_id FROM workflow_messages WHERE run_id = ? AND kind = 'terminal'",
        leaf,
    )
    show_and_end(coordinator, leaf, terminal, "turn-terminal")
    delivered: list[str] = []
    for index in range(3):
        # Exactly one follow-up is presented at a time, after the one before it ended.
        [message_id] = pending_follow_up_messages(state, leaf)
        delivered.append(content_of(state, message_id)["text"])
        # The coordinator's view names it next (a queued older snapshot may come first).
        view = session_snapshot(coordinator, names(message_id), "the follow-up message next")
        assert view["nextMessage"]["kind"] == "follow_up"
        show_and_end(coordinator, leaf, message_id, f"turn-follow-{index}")
    assert delivered == ["first", "second", "third"]
    assert pending_follow_up_messages(state, leaf) == []
    assert [follow_up_state for _, follow_up_state in follow_ups(state)] == ["presented"] * 3
    db = open_database(state / "state.sqlite")
    try:
        assert pending_follow_up_count(db) == 0
    finally:
        db.close()


def content_of(state_dir: Path, message_id: str) -> dict[str, Any]:
    [(blob,)] = rows(
        state_dir,
        "SELECT b.content FROM workflow_messages m JOIN blobs b ON b.digest = m.content_digest "
        "WHERE m.message_id = ?",
        message_id,
    )
    value = json.loads(bytes(blob))
    assert isinstance(value, dict)
    return value


def test_cancellation_cancels_pending_follow_ups_and_refuses_new_ones(
    running: WorkflowServer, project: Path
) -> None:
    state = running.state_dir
    with WorkflowClient(state, autostart=False, timeout=30) as client:
        run_id = start(client, project, "gated", SESSION)["receipt"]["runId"]
        wait_for(client, run_id, {"waiting"})
        client.call("followUp.add", {"text": "later"}, run_id=run_id)
        client.call("run.cancel", {"reason": "user"}, run_id=run_id)
        refused = client.request("followUp.add", {"text": "more"}, run_id=run_id)
        headless = start(client, project, "told", None)["receipt"]["runId"]
        no_session = client.request("followUp.add", {"text": "x"}, run_id=headless)
    assert follow_ups(state) == [("later", "cancelled")]
    assert refused["outcome"] == "rejected" and refused["error"]["code"] == "runNotCompleted"
    assert no_session["outcome"] == "rejected"
    assert no_session["error"]["code"] == "noOriginSession"
    assert rows(state, "SELECT count(*) FROM workflow_messages WHERE kind = 'follow_up'") == [(0,)]
