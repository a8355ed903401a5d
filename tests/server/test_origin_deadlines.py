"""The node timeout of an interactive agent step while no runner exists (issue 14, item 3:
"Deadlines while nobody is connected"; workflow-server.md § Interactive Pi execution and
§ Recovery steps 7–11).

Real servers, real runners, real sockets; the origin session's coordinator is driven
over the socket as the Pi extension would. The server's clock is a `ManualClock`, so a
node timeout of 5 s is spent only when a test moves the clock: the time each report
counts is exact, and no test waits real seconds for a deadline. Checks that something
did *not* happen hold it over 20 ticks (`stays`), a bound that can only miss a bug,
never invent one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.storage import ManualClock, acquire_server_epoch, open_database
from pi_workflows.storage._deadlines import start_active_time
from tests.conftest import write_workflow
from tests.server.origin import SESSION, rows, session_snapshot, start
from tests.server.runs import TERMINAL, wait_for
from tests.server.watchers import Watcher
from tests.server.watchers import wait_for as poll

pytestmark = pytest.mark.timeout(120)

BUDGET_MS = 5_000
TICK_S = 0.05

ASK = """
from pi_workflows import agent, compute, define_workflow

workflow = define_workflow(
    name="{name}",
    start_at="ask",
    nodes={{
        "ask": agent(prompt="Summarise the diff", output_schema={{"type": "object"}},
                     timeout=5),
        {extra}
    }},
    edges={edges},
)
"""
UNROUTED = ASK.format(name="timed", extra="", edges="[]")
ROUTED = ASK.format(
    name="routed",
    extra='"fallback": compute(lambda ctx: {"fallback": True}),',
    edges='[{"from": "ask", "switch": {"on": "$result.outcome", '
    '"cases": {"timed_out": "fallback"}, "default": "fallback"}}]',
)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(time.time_ns() // 1_000_000)


@pytest.fixture
def project(short_tmp: Path) -> Path:
    folder = short_tmp / "project"
    write_workflow(folder, "timed", UNROUTED)
    write_workflow(folder, "routed", ROUTED)
    write_workflow(folder, "echo")
    return folder


def serve(state_dir: Path, clock: ManualClock) -> WorkflowServer:
    server = WorkflowServer(
        state_dir, idle_exit_s=None, tick_s=TICK_S, execute_runs=True, clock=clock
    )
    server.start()
    return server


@pytest.fixture
def running(state_dir: Path, clock: ManualClock) -> Iterator[WorkflowServer]:
    server = serve(state_dir, clock)
    try:
        yield server
    finally:
        server.stop("test teardown")


def stays(condition: Callable[[], bool], what: str, ticks: int = 20) -> None:
    """`condition` holds over `ticks` server ticks (a bound, not a wait for something)."""
    deadline = time.monotonic() + ticks * TICK_S
    while time.monotonic() < deadline:
        assert condition(), what
        time.sleep(TICK_S / 2)


@dataclass
class Step:
    """An interactive run parked at its agent step, with no runner alive."""

    server: WorkflowServer
    clock: ManualClock
    run_id: str
    request_id: str
    attempt_id: str
    message_id: str
    coordinator: Watcher

    def connect(self) -> None:
        """A (new) coordinator connection claims the session's epoch and gets its view."""
        self.coordinator = Watcher(self.server.socket_path)
        self.coordinator.subscribe(
            {"kind": "sessionView", "sessionId": SESSION, "coordinator": True}
        )
        session_snapshot(self.coordinator, lambda v: v["coordinator"] is not None, "the view")

    def branch(self, entries: list[tuple[str, str]], *, idle: bool) -> dict[str, Any]:
        answer = self.coordinator.request(
            "workflowMessage.reportBranch",
            {
                "sessionId": SESSION,
                "entries": [{"messageId": m, "entryId": e} for m, e in entries],
                "isIdle": idle,
                "hasPendingMessages": False,
            },
        )
        assert answer["outcome"] == "accepted", answer
        return dict(answer["receipt"])

    def turn(self, phase: str, turn_id: str, message_id: str | None = None) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "sessionId": SESSION,
            "messageId": message_id or self.message_id,
            "turnId": turn_id,
            "phase": phase,
        }
        if phase == "ended":
            payload |= {"stopReason": "completed", "responseEntryId": None}
        answer = self.coordinator.request("workflowTurn.report", payload, runId=self.run_id)
        assert answer["outcome"] == "accepted", answer
        return dict(answer["receipt"])

    def timer(self) -> tuple[str, int, int | None]:
        """(request status, active ms, active since) as stored."""
        [row] = rows(
            self.server.state_dir,
            "SELECT status, active_ms, active_since FROM interactive_requests WHERE request_id = ?",
            self.request_id,
        )
        return row[0], row[1], row[2]

    def pending(self) -> bool:
        return self.timer()[0] == "pending"

    def wait_terminal(self) -> dict[str, Any]:
        with WorkflowClient(self.server.state_dir, autostart=False, timeout=30) as client:
            return wait_for(client, self.run_id, TERMINAL)


def no_runner(state_dir: Path, run_id: str) -> bool:
    """No runner epoch of the run is live and no process is recorded."""
    [(live,)] = rows(
        state_dir,
        "SELECT count(*) FROM runner_epochs WHERE run_id = ? AND status IN ('starting', 'ready')",
        run_id,
    )
    [(processes,)] = rows(state_dir, "SELECT count(*) FROM runner_processes")
    return bool(live == 0 and processes == 0)


def park(server: WorkflowServer, clock: ManualClock, project: Path, name: str) -> Step:
    """Start `name` in the session, wait until it waits with no runner, connect."""
    with WorkflowClient(server.state_dir, autostart=False, timeout=30) as client:
        answer = start(client, project, name, SESSION)
        assert answer["outcome"] == "accepted", answer
        run_id = answer["receipt"]["runId"]
        wait_for(client, run_id, {"waiting"})
    poll(lambda: no_runner(server.state_dir, run_id), "the runner to exit")
    [(request_id, attempt_id)] = rows(
        server.state_dir,
        "SELECT request_id, attempt_id FROM interactive_requests WHERE run_id = ?",
        run_id,
    )
    [(message_id,)] = rows(
        server.state_dir, "SELECT message_id FROM workflow_messages WHERE run_id = ?", run_id
    )
    step = Step(server, clock, run_id, request_id, attempt_id, message_id, None)  # type: ignore[arg-type]
    step.connect()
    step.branch([(message_id, "entry-1")], idle=False)  # Pi shows the step message
    return step


@pytest.fixture
def step(running: WorkflowServer, clock: ManualClock, project: Path) -> Iterator[Step]:
    parked = park(running, clock, project, "timed")
    try:
        yield parked
    finally:
        parked.coordinator.close()


def attempt(state_dir: Path, attempt_id: str) -> tuple[Any, ...]:
    [row] = rows(
        state_dir,
        "SELECT status, deadline_at - started_at, error FROM node_attempts WHERE attempt_id = ?",
        attempt_id,
    )
    return row


# --- the deadline with no runner alive ---------------------------------------------------


def test_the_deadline_fires_with_no_runner_alive_and_an_unrouted_step_ends_the_run(
    step: Step, project: Path
) -> None:
    state = step.server.state_dir
    assert step.turn("started", "turn-1")["ownership"] == "active"
    assert step.timer() == ("pending", 0, step.clock.now_ms())
    step.clock.advance(BUDGET_MS - 1)
    stays(step.pending, "the step timed out before its budget was used")
    assert no_runner(state, step.run_id)  # nothing but the server enforces it
    step.clock.advance(1)
    view = step.wait_terminal()
    assert view["display"]["status"] == "timed_out"
    assert [(s["node"], s["status"]) for s in view["steps"]] == [("ask", "timed_out")]
    # The same attempt, its deadline kept, ended timed_out; the request is closed, the
    # session reservation released, and the open turn ended with the run.
    [(attempts,)] = rows(state, "SELECT count(*) FROM node_attempts WHERE run_id = ?", step.run_id)
    assert attempts == 1
    status, budget, error = attempt(state, step.attempt_id)
    assert (status, budget) == ("timed_out", BUDGET_MS)
    assert error.startswith("nodeTimedOut")
    assert step.timer() == ("cancelled", BUDGET_MS, None)
    assert rows(state, "SELECT reserved FROM run_bindings WHERE run_id = ?", step.run_id) == [(0,)]
    assert rows(state, "SELECT status FROM workflow_turns WHERE turn_id = 'turn-1'") == [("lost",)]
    # One control claim, then one supervised runner (the timeout-resume child) routed it.
    events = [
        e
        for (e,) in rows(
            state, "SELECT event_type FROM events WHERE run_id = ? ORDER BY revision", step.run_id
        )
    ]
    tail = events[events.index("interaction_timed_out") :]
    assert tail[:2] == ["interaction_timed_out", "run_requeued"]
    assert "run_claimed" in tail and tail[-1] == "run_timed_out"
    [(runners,)] = rows(state, "SELECT count(*) FROM runner_epochs WHERE run_id = ?", step.run_id)
    assert runners == 2
    with WorkflowClient(state, autostart=False, timeout=30) as client:
        again = start(client, project, "echo", SESSION)
    assert again["outcome"] == "accepted", again  # the session is free again


def test_a_timed_out_step_follows_its_timeout_edge(
    running: WorkflowServer, clock: ManualClock, project: Path
) -> None:
    step = park(running, clock, project, "routed")
    try:
        step.turn("started", "turn-1")
        clock.advance(BUDGET_MS)
        view = step.wait_terminal()
    finally:
        step.coordinator.close()
    assert view["display"]["status"] == "completed"
    assert [(s["node"], s["status"]) for s in view["steps"]] == [
        ("ask", "timed_out"),
        ("fallback", "completed"),
    ]
    assert attempt(running.state_dir, step.attempt_id)[:2] == ("timed_out", BUDGET_MS)
    reserved = rows(
        running.state_dir, "SELECT reserved FROM run_bindings WHERE run_id = ?", step.run_id
    )
    assert reserved == [(0,)]


def test_a_late_submission_after_the_timeout_cannot_win(step: Step) -> None:
    step.turn("started", "turn-1")
    step.clock.advance(BUDGET_MS)
    poll(lambda: step.timer()[0] == "cancelled", "the timeout")
    with WorkflowClient(step.server.state_dir, autostart=False, timeout=30) as client:
        late = client.request(
            "interaction.submit",
            {
                "interactionId": step.request_id,
                "submissionId": "submission-late",
                "value": {"summary": "too late"},
            },
            run_id=step.run_id,
        )
    assert late["outcome"] != "accepted", late
    view = step.wait_terminal()
    assert view["display"]["status"] == "timed_out"
    accepted = rows(
        step.server.state_dir,
        "SELECT count(*) FROM interactive_submissions WHERE request_id = ? "
        "AND outcome = 'accepted'",
        step.request_id,
    )
    assert accepted == [(0,)]
    # The turn's end, reported after the timeout, adopts the run's terminal cleanup.
    assert step.turn("ended", "turn-1")["ownership"] == "settled"


# --- the timer runs only during reported turns of a connected active session ----------


def test_time_counts_only_during_reported_turns_of_the_connected_active_session(
    step: Step,
) -> None:
    clock = step.clock
    # Delivery and waiting before any turn consume nothing.
    clock.advance(2 * BUDGET_MS)
    stays(lambda: step.timer() == ("pending", 0, None), "waiting consumed the timeout")
    # A turn runs the timer; its end keeps the time used and stops it.
    step.turn("started", "turn-1")
    clock.advance(1_000)
    step.turn("ended", "turn-1")
    assert step.timer() == ("pending", 1_000, None)
    clock.advance(2 * BUDGET_MS)
    stays(lambda: step.timer() == ("pending", 1_000, None), "an ended turn kept counting")
    # The unproductive end presented a reminder; Pi shows it and a second turn starts.
    [(reminder,)] = rows(
        step.server.state_dir,
        "SELECT message_id FROM workflow_messages WHERE source_id = ? AND reason = 'reminder'",
        step.request_id,
    )
    step.branch([(step.message_id, "entry-1"), (reminder, "entry-2")], idle=False)
    step.turn("started", "turn-2", reminder)
    clock.advance(1_000)
    # Disconnect: the epoch ends and the timer stops, the turn stays open.
    step.coordinator.close()
    poll(lambda: step.timer() == ("pending", 2_000, None), "the disconnect to suspend")
    clock.advance(2 * BUDGET_MS)
    stays(lambda: step.timer() == ("pending", 2_000, None), "a disconnected session counted")
    assert rows(
        step.server.state_dir, "SELECT status FROM workflow_turns WHERE turn_id = 'turn-2'"
    ) == [("open",)]
    # A new connection: nothing runs until it reports the branch (the turn still open).
    step.connect()
    stays(lambda: step.timer() == ("pending", 2_000, None), "the timer resumed before a report")
    step.branch([(step.message_id, "entry-1"), (reminder, "entry-2")], idle=False)
    assert step.timer() == ("pending", 2_000, clock.now_ms())
    clock.advance(BUDGET_MS - 2_000 - 1)
    stays(step.pending, "the earlier active time was counted twice")
    clock.advance(1)
    assert step.wait_terminal()["display"]["status"] == "timed_out"
    assert step.timer() == ("cancelled", BUDGET_MS, None)


def test_a_replacement_connection_fences_the_timer_until_its_own_branch_report(
    step: Step,
) -> None:
    step.turn("started", "turn-1")
    step.clock.advance(1_500)
    first = step.coordinator
    try:
        step.connect()  # a second Pi on the session takes the epoch: the first is fenced
        poll(lambda: step.timer() == ("pending", 1_500, None), "the fenced epoch to suspend")
        step.clock.advance(2 * BUDGET_MS)
        stays(lambda: step.timer() == ("pending", 1_500, None), "a fenced epoch counted")
        step.branch([(step.message_id, "entry-1")], idle=False)
        assert step.timer()[2] == step.clock.now_ms()
    finally:
        first.close()


def test_paused_time_does_not_consume_the_timeout(step: Step) -> None:
    step.turn("started", "turn-1")
    step.clock.advance(1_000)
    with WorkflowClient(step.server.state_dir, autostart=False, timeout=30) as client:
        paused = client.request("run.pause", run_id=step.run_id)
    assert paused["outcome"] == "accepted", paused
    assert step.timer() == ("pending", 1_000, None)
    step.clock.advance(2 * BUDGET_MS)
    stays(lambda: step.timer() == ("pending", 1_000, None), "a paused run counted")
    # A report of the still-open turn does not resume a paused run's timer either.
    step.branch([(step.message_id, "entry-1")], idle=False)
    assert step.timer() == ("pending", 1_000, None)


def test_an_idle_branch_report_that_closes_the_lost_turn_keeps_the_timer_stopped(
    step: Step,
) -> None:
    step.turn("started", "turn-1")
    step.clock.advance(1_000)
    step.coordinator.close()  # Pi died mid-turn
    poll(lambda: step.timer() == ("pending", 1_000, None), "the disconnect to suspend")
    step.connect()
    receipt = step.branch([(step.message_id, "entry-1")], idle=True)
    assert receipt["closedTurns"] == ["turn-1"]
    step.clock.advance(2 * BUDGET_MS)
    stays(lambda: step.timer()[:3] == ("pending", 1_000, None), "a lost turn kept counting")


# --- recovery ----------------------------------------------------------------------------


def test_server_downtime_consumes_nothing_and_the_earlier_active_time_is_kept(
    state_dir: Path, clock: ManualClock, project: Path
) -> None:
    server = serve(state_dir, clock)
    try:
        step = park(server, clock, project, "timed")
        step.turn("started", "turn-1")
        clock.advance(3_000)
        # The lease's next renewal proves the server alive at this instant.
        poll(
            lambda: (
                rows(state_dir, "SELECT heartbeat_at FROM server_lease")[0][0] >= clock.now_ms()
            ),
            "a lease renewal",
        )
        step.coordinator.close()
    finally:
        server.stop("restart")
    clock.advance(60_000)  # the server is down for a minute
    server = serve(state_dir, clock)
    try:
        # Recovery steps 7 and 10: the request, its message and the open turn are kept
        # as they were; only the timer stopped, with the 3 s used before the stop.
        assert step.timer() == ("pending", 3_000, None)
        assert server.recovery is not None and server.recovery.steps_timed_out == 0
        assert rows(state_dir, "SELECT status FROM workflow_turns") == [("open",)]
        assert rows(state_dir, "SELECT state FROM workflow_messages") == [("sent",)]
        step.server = server
        step.connect()
        step.branch([(step.message_id, "entry-1")], idle=False)  # the turn goes on
        clock.advance(BUDGET_MS - 3_000 - 1)
        stays(step.pending, "the downtime was counted")
        clock.advance(1)
        assert step.wait_terminal()["display"]["status"] == "timed_out"
        step.coordinator.close()
    finally:
        server.stop("test teardown")


def test_recovery_times_out_a_step_whose_budget_ran_out_before_the_server_died(
    state_dir: Path, clock: ManualClock, project: Path
) -> None:
    server = serve(state_dir, clock)
    try:
        step = park(server, clock, project, "timed")
        step.turn("started", "turn-1")
        step.coordinator.close()
        poll(lambda: step.timer() == ("pending", 0, None), "the disconnect to suspend")
    finally:
        server.stop("restart")
    # What a server killed mid-turn after the budget ran out and before its timer's
    # transaction committed leaves (a kill that cannot be timed from outside, so it is
    # built with the storage calls that server made): the turn's span running since
    # the turn began, and the server's last heartbeat past the budget.
    db = open_database(state_dir / "state.sqlite", clock=clock)
    try:
        with db.write() as tx:
            start_active_time(tx, step.request_id)  # the turn start report's write
        clock.advance(BUDGET_MS + 500)
        with db.write() as tx:
            acquire_server_epoch(tx, owner_id="server-died", pid=None, previous_owner_gone=True)
    finally:
        db.close()
    clock.advance(60_000)
    server = serve(state_dir, clock)
    try:
        # Recovery ran the timeout path before any actor existed: committed by the time
        # `start` returned, before a client, a report or a runner could act.
        assert server.recovery is not None and server.recovery.steps_timed_out == 1
        assert step.timer() == ("cancelled", BUDGET_MS + 500, None)
        assert attempt(state_dir, step.attempt_id)[0] == "timed_out"
        step.server = server
        assert step.wait_terminal()["display"]["status"] == "timed_out"
    finally:
        server.stop("test teardown")


def test_after_a_restart_nothing_is_offered_until_a_matching_session_connects(
    state_dir: Path, clock: ManualClock, project: Path
) -> None:
    server = serve(state_dir, clock)
    try:
        with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
            run_id = start(client, project, "timed", SESSION)["receipt"]["runId"]
            wait_for(client, run_id, {"waiting"})
    finally:
        server.stop("restart")
    [(message_id,)] = rows(state_dir, "SELECT message_id FROM workflow_messages")
    server = serve(state_dir, clock)
    viewer, coordinator = Watcher(server.socket_path), Watcher(server.socket_path)
    try:
        # Recovery step 7: the pending step message is restored as it was; step 11: a
        # view that holds no coordinator epoch is offered nothing to send.
        viewer.subscribe({"kind": "sessionView", "sessionId": SESSION})
        seen = session_snapshot(viewer, lambda v: v["activeRun"] is not None, "the run")
        assert seen["nextMessage"] is None
        assert [m["messageId"] for m in seen["messages"]["items"]] == [message_id]
        assert seen["messages"]["items"][0]["state"] == "pending"
        stays(lambda: rows(state_dir, "SELECT count(*) FROM workflow_turns") == [(0,)], "a turn")
        # The matching session connects: the same message, once, and only to it.
        coordinator.subscribe({"kind": "sessionView", "sessionId": SESSION, "coordinator": True})
        offered = session_snapshot(coordinator, lambda v: v["nextMessage"] is not None, "one")
        assert offered["nextMessage"]["messageId"] == message_id
        assert offered["messages"]["count"] == 1
        assert rows(state_dir, "SELECT count(*) FROM workflow_messages") == [(1,)]
    finally:
        viewer.close()
        coordinator.close()
        server.stop("test teardown")
