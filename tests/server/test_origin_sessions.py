"""Origin sessions on the server, proved over the real socket (issue 14, item 3).

A run started with `payload.originSessionId` is interactive and bound to that Pi
session. Its agent step starts no pi: the runner proposes the request, the server
commits it with one pending `step` message for the session in the same transaction,
parks the run (waiting), and the runner exits. No pi is needed for any of this.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.domain._session_view import (
    TERMINAL_RETENTION_MS,
    WINDOW_BYTES,
    WINDOW_ITEMS,
    build_session_view,
)
from pi_workflows.storage import ManualClock, cancel_run, open_database
from pi_workflows.storage._messages import (
    end_turn,
    insert_message,
    insert_turn,
    mark_sent,
    read_message,
    read_turn,
)
from pi_workflows.wire.canonical import dumps
from tests.server import origin
from tests.server.origin import SESSION, has_step, rows, session_snapshot, start
from tests.server.runs import wait_for
from tests.server.watchers import Watcher
from tests.server.watchers import wait_for as poll
from tests.storage.storage_helpers import INTERACTIVE, enqueue

pytestmark = pytest.mark.timeout(120)

running = origin.running
ask_project = origin.ask_project


def test_a_start_with_an_origin_session_binds_an_interactive_run(
    running: WorkflowServer, ask_project: Path
) -> None:
    with WorkflowClient(running.state_dir, autostart=False, timeout=30) as client:
        answer = start(client, ask_project, "echo", SESSION, mode="interactive")
        assert answer["outcome"] == "accepted", answer
        run_id = answer["receipt"]["runId"]
        view = client.call("run.get", run_id=run_id)["receipt"]
        headless = start(client, ask_project, "echo", None)
        assert headless["outcome"] == "accepted", headless
    assert view["executionMode"] == "interactive"
    binding = rows(
        running.state_dir,
        "SELECT execution_mode, origin_session_id FROM run_bindings WHERE run_id = ?",
        run_id,
    )
    assert binding == [("interactive", SESSION)]
    other = rows(
        running.state_dir,
        "SELECT execution_mode, origin_session_id FROM run_bindings WHERE run_id = ?",
        headless["receipt"]["runId"],
    )
    assert other == [("headless", None)]


def test_a_start_whose_mode_contradicts_its_session_is_rejected(
    running: WorkflowServer, ask_project: Path
) -> None:
    with WorkflowClient(running.state_dir, autostart=False, timeout=30) as client:
        no_session = start(client, ask_project, "echo", None, mode="interactive")
        with_headless = start(client, ask_project, "echo", SESSION, mode="headless")
        bad_id = start(client, ask_project, "echo", "bad\nid")
    for answer in (no_session, with_headless, bad_id):
        assert answer["outcome"] == "rejected", answer
    assert no_session["error"]["code"] == "executionModeInvalid"
    assert bad_id["error"]["code"] == "sessionIdInvalid"
    assert rows(running.state_dir, "SELECT count(*) FROM runs") == [(0,)]


def test_a_second_unfinished_run_of_one_session_is_refused(
    running: WorkflowServer, ask_project: Path
) -> None:
    with WorkflowClient(running.state_dir, autostart=False, timeout=30) as client:
        first = start(client, ask_project, "ask", SESSION)
        assert first["outcome"] == "accepted", first
        wait_for(client, first["receipt"]["runId"], {"waiting"})
        second = start(client, ask_project, "echo", SESSION)
    assert second["outcome"] == "rejected", second
    assert second["error"]["code"] == "sessionReserved"


def test_an_interactive_agent_step_parks_with_one_initial_step_message_and_no_pi(
    running: WorkflowServer, ask_project: Path
) -> None:
    with WorkflowClient(running.state_dir, autostart=False, timeout=30) as client:
        answer = start(client, ask_project, "ask", SESSION)
        assert answer["outcome"] == "accepted", answer
        run_id = answer["receipt"]["runId"]
        view = wait_for(client, run_id, {"waiting"})
    assert view["display"]["status"] == "waiting"
    state = rows(
        running.state_dir,
        "SELECT r.status, q.state, (SELECT count(*) FROM leases l WHERE l.resource = r.run_id) "
        "FROM runs r JOIN run_queue q ON q.run_id = r.run_id WHERE r.run_id = ?",
        run_id,
    )
    assert state == [("waiting", "parked", 0)], state
    attempts = rows(
        running.state_dir,
        "SELECT node_path, status, deadline_at IS NOT NULL FROM node_attempts WHERE run_id = ?",
        run_id,
    )
    assert attempts == [("ask", "waiting", 1)]
    requests = rows(
        running.state_dir,
        "SELECT request_id, target_session_id, kind, status FROM interactive_requests "
        "WHERE run_id = ?",
        run_id,
    )
    assert len(requests) == 1 and requests[0][1:] == (SESSION, "agent", "pending")
    messages = rows(
        running.state_dir,
        "SELECT target_session_id, kind, reason, source_id, state, pi_entry_id, "
        "content_digest FROM workflow_messages WHERE run_id = ?",
        run_id,
    )
    assert [message[:6] for message in messages] == [
        (SESSION, "step", "initial", requests[0][0], "pending", None)
    ]
    content = rows(running.state_dir, "SELECT content FROM blobs WHERE digest = ?", messages[0][6])
    assert b"Summarise the diff" in bytes(content[0][0])
    # The runner exits by itself: its epoch finishes as `exited` (no crash, no stop).
    poll(
        lambda: (
            rows(running.state_dir, "SELECT status FROM runner_epochs WHERE run_id = ?", run_id)
            == [("exited",)]
        ),
        "the runner to exit",
    )
    assert rows(running.state_dir, "SELECT status FROM runs WHERE run_id = ?", run_id) == [
        ("waiting",)
    ]


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_the_prompt_stays_out_of_the_server_log(running: WorkflowServer, ask_project: Path) -> None:
    kept = _Kept()
    root = logging.getLogger()
    level = root.level
    root.addHandler(kept)
    root.setLevel(logging.DEBUG)
    try:
        with WorkflowClient(running.state_dir, autostart=False, timeout=30) as client:
            run_id = start(client, ask_project, "ask", SESSION)["receipt"]["runId"]
            wait_for(client, run_id, {"waiting"})
        poll(
            lambda: any(record.getMessage() == "runner exited" for record in kept.records),
            "the runner's exit to be logged",
        )
    finally:
        root.removeHandler(kept)
        root.setLevel(level)
    for record in kept.records:
        assert "Summarise the diff" not in record.getMessage()
        assert "Summarise the diff" not in repr(record.__dict__)


# --- the session view ------------------------------------------------------------------


def test_the_session_view_shows_the_active_run_and_its_pending_step_message(
    running: WorkflowServer, ask_project: Path
) -> None:
    watcher = Watcher(running.socket_path)
    try:
        watcher.subscribe({"kind": "sessionView", "sessionId": SESSION})
        empty = session_snapshot(watcher, lambda view: True, "a first snapshot")
        assert empty["activeRun"] is None and empty["messages"]["count"] == 0
        with WorkflowClient(running.state_dir, autostart=False, timeout=30) as client:
            run_id = start(client, ask_project, "ask", SESSION)["receipt"]["runId"]
            view = session_snapshot(
                watcher,
                # The runner that parked the run exits after it: `activity` (apart from
                # status) shows it until then, so compare once it is gone.
                lambda view: (
                    has_step(view)
                    and view["activeRun"]["display"]["status"] == "waiting"
                    and view["activeRun"]["display"].get("activity") is None
                ),
                "the waiting run (its runner gone) and its step message",
            )
            shown = client.call("run.get", run_id=run_id)["receipt"]
    finally:
        watcher.close()
    assert view["sessionId"] == SESSION
    assert view["activeRun"]["runId"] == run_id
    assert view["activeRun"]["display"] == shown["display"]
    [item] = view["messages"]["items"]
    assert (item["runId"], item["kind"], item["reason"], item["state"]) == (
        run_id,
        "step",
        "initial",
        "pending",
    )
    assert item["piEntryId"] is None and view["messages"]["complete"] is True
    # Not a coordinator: the view names no message to send.
    assert view["coordinator"] is False and view["nextMessage"] is None


def test_only_the_active_coordinator_gets_the_next_message_and_a_newer_claim_fences(
    running: WorkflowServer, ask_project: Path
) -> None:
    with WorkflowClient(running.state_dir, autostart=False, timeout=30) as client:
        run_id = start(client, ask_project, "ask", SESSION)["receipt"]["runId"]
        wait_for(client, run_id, {"waiting"})
    first, second = Watcher(running.socket_path), Watcher(running.socket_path)
    try:
        first.subscribe({"kind": "sessionView", "sessionId": SESSION, "coordinator": True})
        held = session_snapshot(first, lambda view: view["nextMessage"] is not None, "a message")
        assert held["coordinator"] is True
        message = held["nextMessage"]
        assert message["messageId"] == held["messages"]["items"][0]["messageId"]
        content = message["content"]["value"]
        assert "Summarise the diff" in content["prompt"]
        assert content["contract"]["step"] == "ask"
        assert "outputSchema" in content["contract"]
        # A second coordinator for the same session fences the first.
        second.subscribe({"kind": "sessionView", "sessionId": SESSION, "coordinator": True})
        taken = session_snapshot(second, lambda view: view["nextMessage"] is not None, "one")
        fenced = session_snapshot(first, lambda view: not view["coordinator"], "a fenced view")
        assert fenced["coordinator"] is False and fenced["nextMessage"] is None
        assert taken["nextMessage"]["messageId"] == message["messageId"]
        # Closing the active connection releases its epoch; the fenced one stays fenced
        # until it claims again, and then it is the coordinator.
        second.close()
        first.subscribe({"kind": "sessionView", "sessionId": SESSION, "coordinator": True})
        again = session_snapshot(first, lambda view: view["coordinator"] is True, "a new epoch")
        assert again["nextMessage"]["messageId"] == message["messageId"]
    finally:
        first.close()
        second.close()


def test_a_cancelled_run_cancels_its_step_message_and_stays_for_its_terminal_message(
    running: WorkflowServer, ask_project: Path
) -> None:
    watcher = Watcher(running.socket_path)
    try:
        watcher.subscribe({"kind": "sessionView", "sessionId": SESSION})
        with WorkflowClient(running.state_dir, autostart=False, timeout=30) as client:
            run_id = start(client, ask_project, "ask", SESSION)["receipt"]["runId"]
            session_snapshot(watcher, has_step, "the step message")
            cancelled = client.request("run.cancel", {"reason": "test"}, run_id=run_id)
            assert cancelled["outcome"] == "accepted", cancelled
            view = session_snapshot(
                watcher,
                lambda view: (
                    view["activeRun"] is not None
                    and view["activeRun"]["display"]["status"] == "cancelled"
                ),
                "the cancelled run",
            )
    finally:
        watcher.close()
    # The step message was cancelled with the run; only its terminal message is left,
    # and it keeps the terminal run in view until its first turn ends.
    [item] = view["messages"]["items"]
    assert (item["runId"], item["kind"], item["state"]) == (run_id, "terminal", "pending")
    assert dict(
        rows(
            running.state_dir, "SELECT kind, state FROM workflow_messages WHERE run_id = ?", run_id
        )
    ) == {"step": "cancelled", "terminal": "pending"}


def test_the_message_window_is_bounded_and_its_count_complete(
    state_dir: Path,
) -> None:
    """A flood of pending messages (bounded: 300): the window stops at its item limit,
    the count names them all, and `complete` says that some are not in the window."""
    db = open_database(state_dir / "state.sqlite", clock=ManualClock())
    try:
        enqueue(db, "run-i", **INTERACTIVE)
        session = str(INTERACTIVE["origin_session_id"])
        with db.write() as tx:
            for index in range(300):
                insert_message(
                    tx,
                    run_id="run-i",
                    session_id=session,
                    kind="notification",
                    source_id=f"note-{index}",
                    content={"text": f"note {index}"},
                )
        read = build_session_view(db, session)
    finally:
        db.close()
    assert read is not None
    window = read.payload["messages"]
    assert window["count"] == 300 and window["complete"] is False
    assert len(window["items"]) == WINDOW_ITEMS
    assert [item["order"] for item in window["items"]] == list(range(1, WINDOW_ITEMS + 1))
    assert len(dumps(window)) <= WINDOW_BYTES + 64


def test_a_terminal_run_stays_for_its_terminal_message_and_60_s_after_its_first_turn(
    state_dir: Path,
) -> None:
    """The retention rule over the injectable clock: pending terminal message, sent with
    no turn yet, open first turn, then 60 s after that turn ends; then it leaves, and the
    revision moved."""
    clock = ManualClock()
    db = open_database(state_dir / "state.sqlite", clock=clock)
    session = str(INTERACTIVE["origin_session_id"])
    try:
        enqueue(db, "run-i", **INTERACTIVE)
        with db.write() as tx:
            cancel_run(tx, "run-i")  # its terminal message, in the same transaction
        [(terminal,)] = db.connection.execute(
            "SELECT message_id FROM workflow_messages WHERE kind = 'terminal'"
        ).fetchall()

        def shown() -> tuple[str | None, int]:
            read = build_session_view(db, session)
            assert read is not None
            run = read.payload["activeRun"]
            return (None if run is None else run["runId"]), read.revision

        assert shown()[0] == "run-i"  # its terminal message is pending
        message = read_message(db, terminal)
        assert message is not None
        with db.write() as tx:
            mark_sent(tx, message, "entry-1")
        clock.advance(3_600_000)
        assert shown()[0] == "run-i"  # sent, and pi has not started its turn yet
        with db.write() as tx:
            insert_turn(tx, turn_id="turn-1", message=message)
        clock.advance(3_600_000)
        assert shown()[0] == "run-i"  # its first turn is open, however long
        turn = read_turn(db, "turn-1")
        assert turn is not None
        with db.write() as tx:
            end_turn(tx, turn, "completed", None)
        clock.advance(TERMINAL_RETENTION_MS - 1_000)
        kept, before = shown()
        assert kept == "run-i"
        clock.advance(2_000)
        gone, after = shown()
        assert gone is None and after > before
        # A newer run of the session is its active run.
        enqueue(db, "run-j", **INTERACTIVE)
        assert shown()[0] == "run-j"
    finally:
        db.close()


def test_clear_terminal_removes_the_retained_terminal_view_and_changes_no_workflow_state(
    state_dir: Path,
) -> None:
    """`sessionView.clearTerminal` over the socket. The terminal run (cancelled, which
    writes its pending terminal message) is written before the server starts."""
    session = str(INTERACTIVE["origin_session_id"])
    db = open_database(state_dir / "state.sqlite")
    try:
        enqueue(db, "run-i", **INTERACTIVE)
        with db.write() as tx:
            cancel_run(tx, "run-i")
    finally:
        db.close()
    server = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=False)
    server.start()
    watcher = Watcher(server.socket_path)
    try:
        watcher.subscribe({"kind": "sessionView", "sessionId": session})
        shown = session_snapshot(watcher, lambda v: v["activeRun"] is not None, "the run")
        assert shown["activeRun"]["runId"] == "run-i"
        assert shown["activeRun"]["display"]["status"] == "cancelled"
        cleared = watcher.request("sessionView.clearTerminal", {"sessionId": session})
        assert cleared["outcome"] == "accepted", cleared
        assert cleared["receipt"] == {"clearedRunId": "run-i"}
        gone = session_snapshot(watcher, lambda v: v["activeRun"] is None, "no run")
        assert gone["revision"] > shown["revision"]
        again = watcher.request("sessionView.clearTerminal", {"sessionId": session})
        assert again["receipt"] == {"clearedRunId": None}
    finally:
        watcher.close()
        server.stop("test teardown")
    # No workflow state changed: the run, its revision and its message are as they were.
    assert rows(state_dir, "SELECT status, revision FROM runs WHERE run_id = 'run-i'") == [
        ("cancelled", 2)
    ]
    assert rows(state_dir, "SELECT kind, state FROM workflow_messages") == [("terminal", "pending")]


def test_a_restart_of_an_interactive_run_runs_in_its_origin_session_once_it_is_free(
    running: WorkflowServer, ask_project: Path
) -> None:
    """`run.restart` keeps where the run ran: an interactive run's restart is interactive
    in the same origin session, so its step is presented there; while another run of the
    session is unfinished the restart is refused `sessionReserved`, writing nothing."""
    with WorkflowClient(running.state_dir, autostart=False, timeout=30) as client:
        first = start(client, ask_project, "ask", SESSION)["receipt"]["runId"]
        wait_for(client, first, {"waiting"})
        assert client.request("run.cancel", {"reason": "test"}, run_id=first)["outcome"] == (
            "accepted"
        )
        wait_for(client, first, {"cancelled"})
        holder = start(client, ask_project, "ask", SESSION)["receipt"]["runId"]
        refused = client.request("run.restart", run_id=first)
        assert refused["outcome"] == "rejected", refused
        assert refused["error"]["code"] == "sessionReserved"
        assert rows(running.state_dir, "SELECT count(*) FROM runs WHERE restart_of = ?", first) == [
            (0,)
        ]
        client.request("run.cancel", {"reason": "test"}, run_id=holder)
        wait_for(client, holder, {"cancelled"})
        restarted = client.request("run.restart", run_id=first)
        assert restarted["outcome"] == "accepted", restarted
        again = restarted["receipt"]["runId"]
        wait_for(client, again, {"waiting"})
    assert rows(
        running.state_dir,
        "SELECT execution_mode, origin_session_id FROM run_bindings WHERE run_id = ?",
        again,
    ) == [("interactive", SESSION)]
    assert rows(
        running.state_dir,
        "SELECT kind, reason, state FROM workflow_messages WHERE run_id = ?",
        again,
    ) == [("step", "initial", "pending")]
