"""A protected decision's deadline: the default wins atomically (issue 15, item 1).

The server runs on a `ManualClock`, so the decision's 5 s deadline passes only when a
test moves the clock: a human answer 1 ms before it wins, one 1 ms after it is
rejected (through the CLI), whether or not the timeout unit has run yet. At the deadline
the deadlines actor takes a control claim on the waiting parent and records the default
(provenance `timeout`) with the continuation in one transaction; a restarted server
applies a deadline that passed while it was down before anything else.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.storage import ManualClock, open_database
from pi_workflows.storage._decisions import (
    answer_protected_decision,
    pending_protected_decisions,
    time_out_protected_decision,
)
from tests.conftest import Processes
from tests.server.origin import rows
from tests.server.runs import TERMINAL, wait_for
from tests.server.test_human_decisions import (
    DEFAULT,
    output_of,
    resolutions,
    start_waiting,
    write_ship,
)
from tests.server.watchers import wait_for as poll

pytestmark = pytest.mark.timeout(120)

TICK_S = 0.05


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(time.time_ns() // 1_000_000)


@pytest.fixture
def project(short_tmp: Path) -> Path:
    folder = short_tmp / "project"
    write_ship(folder)
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


def _pending(client: WorkflowClient) -> dict[str, object]:
    [item] = client.call("decision.list")["receipt"]["items"]
    return dict(item)


def _continuation(state_dir: Path, run_id: str) -> str:
    [(continuation,)] = rows(state_dir, "SELECT run_id FROM runs WHERE continuation_of = ?", run_id)
    return str(continuation)


def test_at_the_deadline_the_default_wins_and_an_answer_1ms_later_is_rejected(
    processes: Processes, running: WorkflowServer, clock: ManualClock, project: Path
) -> None:
    state_dir = running.state_dir
    with WorkflowClient(state_dir, autostart=False) as client:
        run_id = start_waiting(client, project, "shiptimed")
        item = _pending(client)
        assert item["hasDefault"] is True
        expires_at = item["expiresAt"]
        assert isinstance(expires_at, int) and expires_at > clock.now_ms()
        clock.set(expires_at + 1)
        late = processes.cli(
            state_dir, "decision", "answer", run_id, "--input-json", '{"choice": "approve"}'
        )
        assert late.returncode == 1
        # Before the timeout unit ran, or after it: no human answer wins past the deadline.
        assert late.stderr.startswith("pi-workflows: rejected: the decision's deadline")
        assert late.stdout == ""
        poll(lambda: resolutions(state_dir, run_id) != [], "the default to win")
        assert resolutions(state_dir, run_id) == [("accepted", "timeout", None)]
        continuation = _continuation(state_dir, run_id)
        assert output_of(client, continuation) == {
            "shipped": False,
            "why": DEFAULT["input"]["reason"],
        }
        assert wait_for(client, run_id, TERMINAL)["display"]["status"] == "completed"
        assert client.call("decision.list")["receipt"]["items"] == []
    # The control claim of that transaction was released by the parent's completion.
    assert rows(state_dir, "SELECT count(*) FROM leases WHERE resource = ?", run_id) == [(0,)]
    [(payload,)] = rows(
        state_dir,
        "SELECT payload FROM events WHERE run_id = ? AND event_type = 'run_completed'",
        run_id,
    )
    assert '"provenance":"timeout"' in payload


def test_an_answer_1ms_before_the_deadline_wins_and_the_deadline_then_changes_nothing(
    processes: Processes, running: WorkflowServer, clock: ManualClock, project: Path
) -> None:
    state_dir = running.state_dir
    with WorkflowClient(state_dir, autostart=False) as client:
        run_id = start_waiting(client, project, "shiptimed")
        expires_at = _pending(client)["expiresAt"]
        assert isinstance(expires_at, int)
        clock.set(expires_at - 1)
        answered = processes.cli(
            state_dir, "decision", "answer", run_id, "--input-json", '{"choice": "approve"}'
        )
        assert answered.returncode == 0, answered.stderr
        clock.set(expires_at + 1_000)
        continuation = _continuation(state_dir, run_id)
        assert output_of(client, continuation) == {"shipped": True}
    assert resolutions(state_dir, run_id) == [("accepted", "human", "cli")]


def test_a_paused_run_keeps_its_default_until_resume_and_refuses_answers_meanwhile(
    processes: Processes, running: WorkflowServer, clock: ManualClock, project: Path
) -> None:
    state_dir = running.state_dir
    with WorkflowClient(state_dir, autostart=False) as client:
        run_id = start_waiting(client, project, "shiptimed")
        expires_at = _pending(client)["expiresAt"]
        assert isinstance(expires_at, int)
        assert client.call("run.pause", run_id=run_id)["outcome"] == "accepted"
        clock.set(expires_at + 1)
        refused = processes.cli(
            state_dir, "decision", "answer", run_id, "--input-json", '{"choice": "approve"}'
        )
        assert refused.returncode == 1
        assert "the decision's deadline has passed" in refused.stderr
        assert resolutions(state_dir, run_id) == [], "a paused run's default waits"
        assert client.call("run.resume", run_id=run_id)["outcome"] == "accepted"
        poll(lambda: resolutions(state_dir, run_id) != [], "the default to win after resume")
    assert resolutions(state_dir, run_id) == [("accepted", "timeout", None)]


def test_a_deadline_that_passed_while_the_server_was_down_is_applied_at_start(
    state_dir: Path, clock: ManualClock, project: Path
) -> None:
    server = serve(state_dir, clock)
    try:
        with WorkflowClient(state_dir, autostart=False) as client:
            run_id = start_waiting(client, project, "shiptimed")
            expires_at = _pending(client)["expiresAt"]
            assert isinstance(expires_at, int)
    finally:
        server.stop("down")
    clock.set(expires_at + 1)
    server = serve(state_dir, clock)
    try:
        # Startup recovery ran the timeout before the server accepted any client.
        assert resolutions(state_dir, run_id) == [("accepted", "timeout", None)]
        with WorkflowClient(state_dir, autostart=False) as client:
            continuation = _continuation(state_dir, run_id)
            assert output_of(client, continuation)["shipped"] is False
    finally:
        server.stop("test teardown")


def test_the_storage_core_rejects_a_late_answer_before_the_timeout_ran(
    state_dir: Path, clock: ManualClock, project: Path
) -> None:
    """The same rule in the storage function a channel adapter calls, with no timeout
    unit in between: the deadline itself refuses the answer; the default then wins."""
    server = serve(state_dir, clock)
    try:
        with WorkflowClient(state_dir, autostart=False) as client:
            run_id = start_waiting(client, project, "shiptimed")
    finally:
        server.stop("down")
    db = open_database(state_dir / "state.sqlite", clock=clock)
    try:
        [pending] = pending_protected_decisions(db)
        assert pending.expires_at is not None
        clock.set(pending.expires_at + 1)
        with db.write() as tx:
            late = answer_protected_decision(
                tx,
                pending.decision_id,
                {"choice": "approve"},
                source_channel="telegram",
                idempotency_key="telegram:ops:1",
            )
        assert (late.outcome, late.reason) == ("rejected", "expired")
        with db.write() as tx:
            continuation = time_out_protected_decision(
                tx, pending.decision_id, owner_id="test-owner", ttl_ms=30_000
            )
        assert continuation is not None
        with db.write() as tx:
            again = answer_protected_decision(
                tx,
                pending.decision_id,
                DEFAULT,
                source_channel="telegram",
                idempotency_key="telegram:ops:2",
            )
        assert (again.outcome, again.reason) == ("rejected", "expired")
        with db.write() as tx:
            assert (
                time_out_protected_decision(
                    tx, pending.decision_id, owner_id="test-owner", ttl_ms=30_000
                )
                is None
            ), "the fence holds: one resolution"
    finally:
        db.close()
    assert resolutions(state_dir, run_id) == [("accepted", "timeout", None)]
