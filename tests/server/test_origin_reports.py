"""Branch and turn reports from an origin session's coordinator, over the real socket.

`workflowMessage.reportBranch` adopts entries (a pending or cancelled message becomes
`sent`), names only this session's messages, closes proved-lost turns on an idle
report and, after a branch change, creates at most one `resumed` step message.
`workflowTurn.report` records exact starts and ends with `active`, `settled` or
`absent` receipts; a stale end cannot clear a newer turn; an aborted end pauses the run
and cancels its pending step messages in one transaction; an open turn shows the run
`running`. Only the connection holding the session's active coordinator epoch reports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from tests.server import origin
from tests.server.origin import SESSION, rows, session_snapshot, start
from tests.server.runs import wait_for
from tests.server.watchers import Watcher

pytestmark = pytest.mark.timeout(120)

running = origin.running
ask_project = origin.ask_project


@dataclass
class Parked:
    """An interactive run waiting at its agent step, and a coordinator for its session."""

    server: WorkflowServer
    run_id: str
    message_id: str
    request_id: str
    coordinator: Watcher

    def branch(
        self,
        entries: list[tuple[str, str]],
        *,
        idle: bool = True,
        pending: bool = False,
        watcher: Watcher | None = None,
    ) -> dict[str, Any]:
        payload = {
            "sessionId": SESSION,
            "entries": [{"messageId": m, "entryId": e} for m, e in entries],
            "isIdle": idle,
            "hasPendingMessages": pending,
        }
        return (watcher or self.coordinator).request("workflowMessage.reportBranch", payload)

    def turn(
        self,
        phase: str,
        turn_id: str,
        *,
        message_id: str | None = None,
        stop: str = "completed",
        watcher: Watcher | None = None,
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "sessionId": SESSION,
            "messageId": message_id or self.message_id,
            "turnId": turn_id,
            "phase": phase,
        }
        if phase == "ended":
            payload |= {"stopReason": stop, "responseEntryId": None}
        return (watcher or self.coordinator).request(
            "workflowTurn.report", payload, runId=self.run_id
        )

    def messages(self) -> list[tuple[Any, ...]]:
        return rows(
            self.server.state_dir,
            "SELECT message_id, reason, state, pi_entry_id FROM workflow_messages "
            "WHERE run_id = ? ORDER BY session_order",
            self.run_id,
        )

    def turns(self) -> dict[str, str]:
        return dict(
            rows(
                self.server.state_dir,
                "SELECT turn_id, status FROM workflow_turns WHERE run_id = ?",
                self.run_id,
            )
        )

    def display(self) -> dict[str, Any]:
        """The run view's display; the run list shows the same status."""
        with WorkflowClient(self.server.state_dir, autostart=False, timeout=30) as client:
            view = client.call("run.get", run_id=self.run_id)["receipt"]
            page = client.call("run.list")["receipt"]
        [item] = [item for item in page["items"] if item["runId"] == self.run_id]
        assert item["display"]["status"] == view["display"]["status"]
        return dict(view["display"])


@pytest.fixture
def parked(running: WorkflowServer, ask_project: Path) -> Iterator[Parked]:
    with WorkflowClient(running.state_dir, autostart=False, timeout=30) as client:
        run_id = start(client, ask_project, "ask", SESSION)["receipt"]["runId"]
        wait_for(client, run_id, {"waiting"})
    coordinator = Watcher(running.socket_path)
    try:
        coordinator.subscribe({"kind": "sessionView", "sessionId": SESSION, "coordinator": True})
        view = session_snapshot(coordinator, lambda v: v["nextMessage"] is not None, "a message")
        message = view["nextMessage"]
        yield Parked(running, run_id, message["messageId"], message["sourceId"], coordinator)
    finally:
        coordinator.close()


def sent(parked: Parked, entry: str = "entry-1") -> None:
    answer = parked.branch([(parked.message_id, entry)], idle=False)
    assert answer["outcome"] == "accepted", answer
    assert answer["receipt"]["adopted"] == [parked.message_id]


# --- reportBranch ----------------------------------------------------------------------


def test_a_branch_report_adopts_the_entry_once_and_the_message_becomes_sent(
    parked: Parked,
) -> None:
    sent(parked)
    assert parked.messages() == [(parked.message_id, "initial", "sent", "entry-1")]
    again = parked.branch([(parked.message_id, "entry-2")], idle=False)
    assert again["outcome"] == "accepted"
    assert again["receipt"] == {"adopted": [], "created": [], "closedTurns": []}
    assert parked.messages() == [(parked.message_id, "initial", "sent", "entry-1")]
    # The view names it in the window as sent (open: its request is pending), and no
    # longer as the next message to send.
    view = session_snapshot(
        parked.coordinator,
        lambda v: v["messages"]["items"][0]["state"] == "sent",
        "the sent message",
    )
    assert view["messages"]["items"][0]["piEntryId"] == "entry-1"
    assert view["nextMessage"] is None


def test_only_the_active_coordinator_can_report_a_branch_or_a_turn(parked: Parked) -> None:
    bystander = Watcher(parked.server.socket_path)
    newer = Watcher(parked.server.socket_path)
    try:
        # A connection that never claimed the epoch.
        refused = parked.branch([(parked.message_id, "entry-1")], watcher=bystander)
        assert refused["outcome"] == "claimLost", refused
        assert refused["error"]["code"] == "coordinatorFenced"
        # A newer claim fences the first coordinator: its reports are refused too.
        newer.subscribe({"kind": "sessionView", "sessionId": SESSION, "coordinator": True})
        fenced = parked.branch([(parked.message_id, "entry-1")])
        assert fenced["outcome"] == "claimLost", fenced
        turn = parked.turn("started", "turn-1")
        assert turn["outcome"] == "claimLost", turn
        assert parked.messages() == [(parked.message_id, "initial", "pending", None)]
        accepted = parked.branch([(parked.message_id, "entry-1")], watcher=newer)
        assert accepted["outcome"] == "accepted", accepted
    finally:
        bystander.close()
        newer.close()


def test_a_report_naming_a_message_outside_the_session_changes_nothing(parked: Parked) -> None:
    answer = parked.branch([(parked.message_id, "entry-1"), ("message-unknown", "entry-2")])
    assert answer["outcome"] == "rejected", answer
    assert answer["error"]["code"] == "messageNotInWindow"
    assert parked.messages() == [(parked.message_id, "initial", "pending", None)]


def test_a_cancelled_message_found_on_the_branch_becomes_sent(parked: Parked) -> None:
    with WorkflowClient(parked.server.state_dir, autostart=False, timeout=30) as client:
        paused = client.request("run.pause", run_id=parked.run_id)
    assert paused["outcome"] == "accepted", paused
    assert parked.messages() == [(parked.message_id, "initial", "cancelled", None)]
    sent(parked)  # Pi had sent it before the pause cancelled it
    assert parked.messages() == [(parked.message_id, "initial", "sent", "entry-1")]


def test_a_branch_change_creates_one_resumed_step_message_and_a_repeat_none(
    parked: Parked,
) -> None:
    sent(parked)
    # Absence proves nothing while Pi is busy or has queued input.
    busy = parked.branch([], idle=False)
    queued = parked.branch([], pending=True)
    assert busy["receipt"]["created"] == [] and queued["receipt"]["created"] == []
    # The branch that holds the message: nothing to present again.
    same = parked.branch([(parked.message_id, "entry-1")])
    assert same["receipt"]["created"] == []
    # A fork without the step entry: exactly one `resumed` step message.
    forked = parked.branch([])
    assert forked["outcome"] == "accepted", forked
    [created] = forked["receipt"]["created"]
    repeat = parked.branch([])
    back = parked.branch([(parked.message_id, "entry-1")])
    assert repeat["receipt"]["created"] == [] and back["receipt"]["created"] == []
    assert parked.messages() == [
        (parked.message_id, "initial", "sent", "entry-1"),
        (created, "resumed", "pending", None),
    ]
    # Wait for the resumed message by its ID: an earlier snapshot (still naming the
    # initial message, before it was sent) may be queued ahead of it.
    view = session_snapshot(
        parked.coordinator,
        lambda v: (v["nextMessage"] or {}).get("messageId") == created,
        "the resumed message",
    )
    assert view["nextMessage"]["reason"] == "resumed"
    assert "Summarise the diff" in view["nextMessage"]["content"]["value"]["prompt"]


# --- workflowTurn.report ---------------------------------------------------------------


def test_a_turn_start_is_active_its_end_settled_and_a_repeat_adopts(parked: Parked) -> None:
    sent(parked)
    started = parked.turn("started", "turn-1")
    assert started["outcome"] == "accepted", started
    receipt = started["receipt"]
    assert receipt["version"] == 1 and receipt["ownership"] == "active"
    assert receipt["turn"]["turnId"] == "turn-1" and receipt["turn"]["status"] == "open"
    assert parked.turn("started", "turn-1")["receipt"]["ownership"] == "active"
    # An open turn shows the waiting step as running, in the view and the list alike.
    display = parked.display()
    assert display["status"] == "running"
    assert display["activity"]["kind"] == "piTurn"
    assert display["activity"]["turnId"] == "turn-1"
    assert display["currentNode"] == "ask"
    ended = parked.turn("ended", "turn-1")
    assert ended["receipt"]["ownership"] == "settled"
    assert ended["receipt"]["turn"]["status"] == "completed"
    assert parked.turn("ended", "turn-1", stop="error")["receipt"] == ended["receipt"]
    assert parked.display()["status"] == "waiting"
    assert parked.turns() == {"turn-1": "completed"}


def test_a_turn_on_an_unsent_or_unknown_message_is_absent(parked: Parked) -> None:
    pending = parked.turn("started", "turn-1")  # the message is not confirmed sent yet
    unknown = parked.turn("started", "turn-2", message_id="message-unknown")
    no_start = parked.turn("ended", "turn-3")
    for answer in (pending, unknown, no_start):
        assert answer["outcome"] == "accepted", answer
        assert answer["receipt"] == {"version": 1, "ownership": "absent"}
    assert parked.turns() == {}
    assert parked.display()["status"] == "waiting"


def test_a_turn_id_reused_for_another_message_is_a_conflict(parked: Parked) -> None:
    sent(parked)
    parked.turn("started", "turn-1")
    parked.turn("ended", "turn-1")  # unproductive: a reminder step message
    [(reminder, _, _, _)] = [row for row in parked.messages() if row[1] == "reminder"]
    parked.branch([(parked.message_id, "entry-1"), (reminder, "entry-2")], idle=False)
    conflict = parked.turn("started", "turn-1", message_id=reminder)
    assert conflict["outcome"] == "conflict", conflict
    assert conflict["error"]["code"] == "turnConflict"


def test_a_stale_end_cannot_clear_a_newer_turn(parked: Parked) -> None:
    sent(parked)
    parked.turn("started", "turn-1")
    newer = parked.turn("started", "turn-2")  # Pi runs one turn at a time: turn-1 is over
    assert newer["receipt"]["ownership"] == "active"
    stale = parked.turn("ended", "turn-1")
    assert stale["receipt"]["ownership"] == "settled"
    assert stale["receipt"]["turn"]["status"] == "lost"
    assert parked.turns() == {"turn-1": "lost", "turn-2": "open"}
    assert parked.display()["status"] == "running"


def test_an_aborted_turn_pauses_the_run_and_cancels_its_pending_step_messages(
    parked: Parked,
) -> None:
    sent(parked)
    [resumed] = parked.branch([])["receipt"]["created"]  # a pending step message
    parked.turn("started", "turn-1")  # the sent step is still open
    aborted = parked.turn("ended", "turn-1", stop="aborted")
    assert aborted["receipt"]["ownership"] == "settled"
    assert aborted["receipt"]["turn"]["status"] == "aborted"
    assert rows(
        parked.server.state_dir, "SELECT status, paused FROM runs WHERE run_id = ?", parked.run_id
    ) == [("waiting", 1)]
    assert parked.messages() == [
        (parked.message_id, "initial", "sent", "entry-1"),
        (resumed, "resumed", "cancelled", None),
    ]
    display = parked.display()
    assert display["status"] == "paused"
    # A paused run's sent step is not open: no new turn can start on it.
    assert parked.turn("started", "turn-2")["receipt"]["ownership"] == "absent"


def test_an_idle_branch_report_closes_the_lost_turn_and_a_busy_one_does_not(
    parked: Parked,
) -> None:
    sent(parked)
    parked.turn("started", "turn-1")
    busy = parked.branch([(parked.message_id, "entry-1")], idle=False)
    assert busy["receipt"]["closedTurns"] == []
    assert parked.turns() == {"turn-1": "open"}
    idle = parked.branch([(parked.message_id, "entry-1")])
    assert idle["receipt"]["closedTurns"] == ["turn-1"]
    assert parked.turns() == {"turn-1": "lost"}
    assert parked.display()["status"] == "waiting"


def test_a_disconnect_ends_the_epoch_but_not_the_open_turn(parked: Parked) -> None:
    sent(parked)
    parked.turn("started", "turn-1")
    parked.coordinator.close()
    replacement = Watcher(parked.server.socket_path)
    try:
        replacement.subscribe({"kind": "sessionView", "sessionId": SESSION, "coordinator": True})
        view = session_snapshot(replacement, lambda v: v["coordinator"], "the new epoch")
        assert view["activeRun"]["display"]["status"] == "running"
        assert parked.turns() == {"turn-1": "open"}
        # A busy Pi re-reports the same started turn: it is adopted, still active.
        again = parked.turn("started", "turn-1", watcher=replacement)
        assert again["receipt"]["ownership"] == "active"
    finally:
        replacement.close()


def test_a_terminal_run_ends_its_open_turn_as_lost_and_a_late_end_adopts_it(
    parked: Parked,
) -> None:
    sent(parked)
    parked.turn("started", "turn-1")
    with WorkflowClient(parked.server.state_dir, autostart=False, timeout=30) as client:
        cancelled = client.request("run.cancel", {"reason": "test"}, run_id=parked.run_id)
    assert cancelled["outcome"] == "accepted", cancelled
    assert parked.turns() == {"turn-1": "lost"}
    late = parked.turn("ended", "turn-1")
    assert late["receipt"]["ownership"] == "settled"
    assert late["receipt"]["turn"]["status"] == "lost"
    assert parked.display()["status"] == "cancelled"
    # A terminal run's step cannot start another turn.
    assert parked.turn("started", "turn-2")["receipt"]["ownership"] == "absent"


# --- reminders and unproductive turns ---------------------------------------------------


def next_is(message_id: str) -> Callable[[dict[str, Any]], bool]:
    def check(view: dict[str, Any]) -> bool:
        return bool((view["nextMessage"] or {}).get("messageId") == message_id)

    return check


def unproductive_count(parked: Parked) -> int:
    [(count,)] = rows(
        parked.server.state_dir,
        "SELECT unproductive_turn_ends FROM interactive_requests WHERE request_id = ?",
        parked.request_id,
    )
    return int(count)


def test_unproductive_turns_remind_twice_and_then_fail_the_attempt(parked: Parked) -> None:
    sent(parked)
    seen = [parked.message_id]
    for number in (1, 2):
        parked.turn("started", f"turn-{number}", message_id=seen[-1])
        ended = parked.turn("ended", f"turn-{number}", message_id=seen[-1])
        assert ended["receipt"]["ownership"] == "settled"
        # A repeat of the end adopts it: the counter does not move twice.
        parked.turn("ended", f"turn-{number}", message_id=seen[-1])
        assert unproductive_count(parked) == number
        [reminder] = [row for row in parked.messages() if row[2] == "pending"]
        assert reminder[1] == "reminder"
        view = session_snapshot(
            parked.coordinator, next_is(str(reminder[0])), "the reminder as the next message"
        )
        assert view["nextMessage"]["content"]["value"]["contract"]["step"] == "ask"
        seen.append(reminder[0])
        entries = [(message, f"entry-{index}") for index, message in enumerate(seen)]
        parked.branch(entries, idle=False)
    parked.turn("started", "turn-3", message_id=seen[-1])
    parked.turn("ended", "turn-3", message_id=seen[-1])
    assert unproductive_count(parked) == 3
    assert [row[2] for row in parked.messages()] == ["sent", "sent", "sent"]
    with WorkflowClient(parked.server.state_dir, autostart=False, timeout=60) as client:
        view = wait_for(client, parked.run_id, {"failed"})
    assert view["display"]["status"] == "failed"
    [(status, error)] = rows(
        parked.server.state_dir,
        "SELECT status, error FROM node_attempts WHERE run_id = ? AND node_path = 'ask'",
        parked.run_id,
    )
    assert status == "failed" and error.startswith("agentUnproductive")


def test_at_most_one_reminder_is_pending(parked: Parked) -> None:
    sent(parked)
    parked.turn("started", "turn-1")
    parked.turn("ended", "turn-1")
    parked.turn("started", "turn-2")  # the same sent step, still open
    parked.turn("ended", "turn-2")
    assert unproductive_count(parked) == 2
    reminders = [row for row in parked.messages() if row[1] == "reminder"]
    assert [row[2] for row in reminders] == ["pending"]


def test_an_aborted_turn_is_not_unproductive(parked: Parked) -> None:
    sent(parked)
    parked.turn("started", "turn-1")
    parked.turn("ended", "turn-1", stop="aborted")
    assert unproductive_count(parked) == 0
    assert [row[1] for row in parked.messages()] == ["initial"]


def test_a_server_restart_alone_closes_no_turn_and_branch_evidence_adopts_after_it(
    state_dir: Path, ask_project: Path
) -> None:
    """Recovery steps 7 and 10: the pending message and the open turn survive a restart
    untouched; the first branch report after it adopts the sent message."""
    first = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=True)
    first.start()
    try:
        with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
            run_id = start(client, ask_project, "ask", SESSION)["receipt"]["runId"]
            wait_for(client, run_id, {"waiting"})
        coordinator = Watcher(first.socket_path)
        try:
            coordinator.subscribe(
                {"kind": "sessionView", "sessionId": SESSION, "coordinator": True}
            )
            view = session_snapshot(coordinator, lambda v: v["nextMessage"] is not None, "one")
            message = view["nextMessage"]["messageId"]
            parked = Parked(first, run_id, message, view["nextMessage"]["sourceId"], coordinator)
            sent(parked)
            parked.turn("started", "turn-1")
            parked.turn("ended", "turn-1")  # unproductive: a pending reminder
            parked.turn("started", "turn-2")  # the sent step is still open
            [reminder] = [row[0] for row in parked.messages() if row[2] == "pending"]
        finally:
            coordinator.close()
    finally:
        first.stop("restart")
    second = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=True)
    second.start()
    try:
        parked.server = second
        assert parked.turns() == {"turn-1": "completed", "turn-2": "open"}
        assert parked.messages()[-1] == (reminder, "reminder", "pending", None)
        assert parked.display()["status"] == "running"
        replacement = Watcher(second.socket_path)
        try:
            replacement.subscribe(
                {"kind": "sessionView", "sessionId": SESSION, "coordinator": True}
            )
            session_snapshot(replacement, lambda v: v["coordinator"], "the new epoch")
            # Pi sent the reminder before the restart: branch evidence adopts it now.
            entries = [(message, "entry-1"), (reminder, "entry-2")]
            busy = parked.branch(entries, idle=False, watcher=replacement)
            assert busy["receipt"]["adopted"] == [reminder]
            assert busy["receipt"]["closedTurns"] == []
            assert parked.turns() == {"turn-1": "completed", "turn-2": "open"}
            assert parked.messages()[-1] == (reminder, "reminder", "sent", "entry-2")
        finally:
            replacement.close()
    finally:
        second.stop("test teardown")


def test_resuming_an_aborted_step_presents_it_once_with_reason_resumed(parked: Parked) -> None:
    sent(parked)
    parked.turn("started", "turn-1")
    parked.turn("ended", "turn-1", stop="aborted")
    with WorkflowClient(parked.server.state_dir, autostart=False, timeout=30) as client:
        resumed = client.request("run.resume", run_id=parked.run_id)
        again = client.request("run.resume", run_id=parked.run_id)
    assert resumed["outcome"] == "accepted", resumed
    assert again["outcome"] == "rejected", again  # not paused any more: nothing more
    [(message, reason, state, _)] = [row for row in parked.messages() if row[2] == "pending"]
    assert (reason, state) == ("resumed", "pending")
    assert rows(
        parked.server.state_dir,
        "SELECT revision, status FROM interactive_requests WHERE request_id = ?",
        parked.request_id,
    ) == [(2, "pending")]
    assert parked.display()["status"] == "waiting"
    # Pi presents it and starts one fresh turn from it.
    parked.branch([(parked.message_id, "entry-1"), (message, "entry-2")], idle=False)
    fresh = parked.turn("started", "turn-2", message_id=message)
    assert fresh["receipt"]["ownership"] == "active"
    assert parked.display()["status"] == "running"


def test_a_pause_is_stored_once_on_the_run_and_derived_for_its_interaction(
    parked: Parked,
) -> None:
    """Conformance 22: only `runs.paused` holds the pause; the pending request, its
    messages and decisions have no pause of their own, and every view derives it."""
    state_dir = parked.server.state_dir
    for table in ("interactive_requests", "workflow_messages", "workflow_turns"):
        columns = [row[1] for row in rows(state_dir, f"PRAGMA table_info({table})")]
        assert not [c for c in columns if "paus" in c], (table, columns)
    sent(parked)
    with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
        assert client.call("run.pause", run_id=parked.run_id)["outcome"] == "accepted"
    request = "SELECT status, revision FROM interactive_requests WHERE request_id = ?"
    assert rows(state_dir, request, parked.request_id) == [("pending", 1)]
    assert rows(state_dir, "SELECT paused FROM runs WHERE run_id = ?", parked.run_id) == [(1,)]
    assert parked.display()["status"] == "paused"
    # Derived for the interaction: its sent step is not open, so no turn can start on it.
    assert parked.turn("started", "turn-1")["receipt"]["ownership"] == "absent"
    with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
        assert client.call("run.resume", run_id=parked.run_id)["outcome"] == "accepted"
    assert rows(state_dir, "SELECT paused FROM runs WHERE run_id = ?", parked.run_id) == [(0,)]
    [(status, _)] = rows(state_dir, request, parked.request_id)
    assert status == "pending", "the same interaction continues in place"
    assert parked.display()["status"] == "waiting"
