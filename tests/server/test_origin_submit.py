"""`interaction.submit` and `interaction.update` for an interactive run, over the real socket.

An interactive run's agent step waits in its origin Pi session: the runner proposed the
request, the server committed it with a `step` message, parked the run and the runner
exited. The origin session's coordinator (here a `WorkflowClient` that subscribed to the
session view with `coordinator: true`) submits the model's output with its session and
coordinator epoch. A real validation child validates it; on acceptance the same
transaction requeues the waiting run, a real runner replays, gets the accepted value
for the same waiting attempt, completes it, and the run goes on to its next node.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from tests.conftest import write_workflow
from tests.server import origin
from tests.server.origin import SESSION, rows, start
from tests.server.runs import wait_for

pytestmark = pytest.mark.timeout(120)

running = origin.running

WORKFLOW = """
from pi_workflows import agent, compute, define_workflow


def check(output, ctx):
    if output["summary"] == "bad":
        raise ValueError("the summary must say what changed")
    return {"summary": output["summary"].upper()}


workflow = define_workflow(
    name="ask",
    start_at="ask",
    nodes={
        "ask": agent(
            prompt=lambda ctx: "Summarise " + ctx.input["topic"],
            output_schema={"type": "object", "properties": {"summary": {"type": "string"}},
                           "required": ["summary"]},
            validate=check,
            timeout=600,
        ),
        "after": compute(lambda ctx: {"seen": ctx.outputs["ask"]["summary"]}),
    },
    edges=[{"from": "ask", "to": "after"}],
)
"""


@dataclass
class Waiting:
    """An interactive run waiting at its agent step, and its session's coordinator."""

    server: WorkflowServer
    run_id: str
    request_id: str
    coordinator: WorkflowClient
    epoch: int

    def submit(
        self,
        value: Any,
        *,
        client: WorkflowClient | None = None,
        session: str | None = SESSION,
        epoch: int | None = None,
        submission_id: str | None = None,
        key: str | None = None,
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "interactionId": self.request_id,
            "submissionId": submission_id or f"submission-{uuid.uuid4().hex[:8]}",
            "value": value,
        }
        if session is not None:
            payload |= {"sessionId": session, "coordinatorEpoch": epoch or self.epoch}
        return dict(
            (client or self.coordinator).request(
                "interaction.submit", payload, run_id=self.run_id, idempotency_key=key
            )
        )

    def request_row(self) -> tuple[Any, ...]:
        [row] = rows(
            self.server.state_dir,
            "SELECT status, accepted_submission_id FROM interactive_requests WHERE request_id = ?",
            self.request_id,
        )
        return row

    def run_status(self) -> str:
        [(status,)] = rows(
            self.server.state_dir, "SELECT status FROM runs WHERE run_id = ?", self.run_id
        )
        return str(status)


def claim(client: WorkflowClient) -> int:
    """Subscribe as the session's coordinator; the grant's epoch."""
    answer = client.request(
        "view.subscribe", {"kind": "sessionView", "sessionId": SESSION, "coordinator": True}
    )
    assert answer["outcome"] == "accepted", answer
    return int(answer["receipt"]["coordinatorEpoch"])


@pytest.fixture
def waiting(running: WorkflowServer, short_tmp: Path) -> Iterator[Waiting]:
    project = short_tmp / "project"
    write_workflow(project, "ask", WORKFLOW)
    with WorkflowClient(running.state_dir, autostart=False, timeout=30) as client:
        run_id = start(client, project, "ask", SESSION)["receipt"]["runId"]
        wait_for(client, run_id, {"waiting"})
    [(request_id,)] = rows(
        running.state_dir, "SELECT request_id FROM interactive_requests WHERE run_id = ?", run_id
    )
    coordinator = WorkflowClient(running.state_dir, autostart=False, timeout=60)
    try:
        epoch = claim(coordinator)
        yield Waiting(running, run_id, request_id, coordinator, epoch)
    finally:
        coordinator.close()


def test_an_accepted_output_requeues_the_run_and_a_new_runner_completes_the_same_attempt(
    waiting: Waiting,
) -> None:
    [(attempt_id,)] = rows(
        waiting.server.state_dir,
        "SELECT attempt_id FROM node_attempts WHERE run_id = ? AND status = 'waiting'",
        waiting.run_id,
    )
    answer = waiting.submit({"summary": "two files"}, submission_id="submission-ok", key="k-ok")
    assert answer["outcome"] == "accepted", answer
    assert answer["receipt"] == {"submissionId": "submission-ok", "status": "accepted"}
    with WorkflowClient(waiting.server.state_dir, autostart=False, timeout=30) as client:
        wait_for(client, waiting.run_id, {"completed"})
    # `validate`'s return is the step's output, and the next node saw it.
    attempts = rows(
        waiting.server.state_dir,
        "SELECT attempt_id, node_path, status FROM node_attempts WHERE run_id = ? "
        "ORDER BY started_at, rowid",
        waiting.run_id,
    )
    assert attempts == [(attempt_id, "ask", "completed"), (attempts[1][0], "after", "completed")]
    assert waiting.request_row() == ("settled", "submission-ok")
    # The step message was never sent here: its acceptance cancelled it.
    assert rows(
        waiting.server.state_dir,
        "SELECT kind, state FROM workflow_messages WHERE run_id = ? AND kind = 'step'",
        waiting.run_id,
    ) == [("step", "cancelled")]
    events = [
        event
        for (event,) in rows(
            waiting.server.state_dir,
            "SELECT event_type FROM events WHERE run_id = ? ORDER BY revision",
            waiting.run_id,
        )
    ]
    settled = events.index("interaction_submission_settled")
    assert events[settled + 1] == "run_requeued"
    # Two runners: the one that proposed the request, and the one that completed it.
    assert rows(
        waiting.server.state_dir,
        "SELECT count(*) FROM runner_epochs WHERE run_id = ?",
        waiting.run_id,
    ) == [(2,)]
    with WorkflowClient(waiting.server.state_dir, autostart=False, timeout=30) as client:
        view = client.call("run.get", run_id=waiting.run_id)["receipt"]
    assert view["display"]["status"] == "completed"
    # A retry of the same submission adopts the stored outcome (the run is over).
    again = waiting.submit({"summary": "two files"}, submission_id="submission-ok", key="k-ok")
    assert again["outcome"] == "adopted", again
    assert again["receipt"] == {"submissionId": "submission-ok", "status": "accepted"}


def test_a_rejected_output_leaves_the_request_pending_with_the_actionable_error(
    waiting: Waiting,
) -> None:
    bad = waiting.submit({"summary": "bad"})
    assert bad["outcome"] == "rejected", bad
    assert bad["error"]["code"] == "submissionRejected"
    assert "the summary must say what changed" in bad["error"]["message"]
    no_schema = waiting.submit({"files": 2})
    assert no_schema["outcome"] == "rejected", no_schema
    assert "summary" in no_schema["error"]["message"]
    assert waiting.request_row() == ("pending", None)
    assert waiting.run_status() == "waiting"
    assert rows(
        waiting.server.state_dir,
        "SELECT state FROM workflow_messages WHERE run_id = ? AND kind = 'step'",
        waiting.run_id,
    ) == [("pending",)]
    # A corrected retry is accepted and the run goes on.
    good = waiting.submit({"summary": "fixed"})
    assert good["outcome"] == "accepted", good
    with WorkflowClient(waiting.server.state_dir, autostart=False, timeout=30) as client:
        wait_for(client, waiting.run_id, {"completed"})


def test_a_wrong_session_a_fenced_epoch_or_no_authority_is_rejected_before_any_record(
    waiting: Waiting,
) -> None:
    other = waiting.submit({"summary": "x"}, session="pi-session-other")
    assert other["outcome"] == "rejected", other
    # No coordinator of that session holds an epoch on this connection.
    assert other["error"]["code"] == "coordinatorFenced"
    with WorkflowClient(waiting.server.state_dir, autostart=False, timeout=30) as client:
        # This connection coordinates another session: that is not the request's session.
        answer = client.request(
            "view.subscribe",
            {"kind": "sessionView", "sessionId": "pi-session-other", "coordinator": True},
        )
        other_epoch = int(answer["receipt"]["coordinatorEpoch"])
        wrong = waiting.submit(
            {"summary": "x"}, client=client, session="pi-session-other", epoch=other_epoch
        )
        # The headless bridge's shape (no session) cannot answer an origin-session step.
        bare = waiting.submit({"summary": "x"}, client=client, session=None)
    assert wrong["outcome"] == "rejected", wrong
    assert wrong["error"]["code"] == "submissionRefused"
    assert wrong["error"]["message"] == "the request belongs to another origin session"
    assert SESSION not in wrong["error"]["message"]
    assert bare["outcome"] == "rejected", bare
    assert "coordinator" in bare["error"]["message"]
    # A second coordinator of the session fences the first one's epoch.
    with WorkflowClient(waiting.server.state_dir, autostart=False, timeout=30) as newer:
        newer_epoch = claim(newer)
        fenced = waiting.submit({"summary": "x"})
        assert fenced["outcome"] == "rejected", fenced
        assert fenced["error"]["code"] == "coordinatorFenced"
        # The newer epoch on another connection is no authority either.
        borrowed = waiting.submit({"summary": "x"}, epoch=newer_epoch)
        assert borrowed["error"]["code"] == "coordinatorFenced"
        stale_number = waiting.submit({"summary": "x"}, client=newer, epoch=waiting.epoch)
        assert stale_number["error"]["code"] == "coordinatorFenced"
    # None of these reached the request: no submission, no event.
    assert rows(waiting.server.state_dir, "SELECT count(*) FROM interactive_submissions") == [(0,)]
    assert waiting.request_row() == ("pending", None)


def test_an_update_takes_the_same_authority_and_a_retry_adopts(waiting: Waiting) -> None:
    payload = {
        "interactionId": waiting.request_id,
        "update": {"type": "progress", "key": "p", "data": {"done": 1}},
        "sessionId": SESSION,
        "coordinatorEpoch": waiting.epoch,
    }
    first = waiting.coordinator.request(
        "interaction.update", payload, run_id=waiting.run_id, idempotency_key="update-1"
    )
    assert first["outcome"] == "accepted", first
    again = waiting.coordinator.request(
        "interaction.update", payload, run_id=waiting.run_id, idempotency_key="update-1"
    )
    assert again["outcome"] == "adopted", again
    with WorkflowClient(waiting.server.state_dir, autostart=False, timeout=30) as client:
        outsider = client.request(
            "interaction.update", payload, run_id=waiting.run_id, idempotency_key="update-2"
        )
        bare = client.request(
            "interaction.update",
            {"interactionId": waiting.request_id, "update": {"type": "progress"}},
            run_id=waiting.run_id,
        )
    assert outsider["outcome"] == "rejected"
    assert outsider["error"]["code"] == "coordinatorFenced"
    assert bare["outcome"] == "rejected"
    assert bare["error"]["code"] == "submissionRefused"
    assert rows(
        waiting.server.state_dir,
        "SELECT count(*) FROM events WHERE run_id = ? AND event_type = 'interaction_update'",
        waiting.run_id,
    ) == [(1,)]


# --- the checkpoint `answer` action from an origin session ---------------------------------

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


@dataclass
class Gated:
    server: WorkflowServer
    run_id: str
    coordinator: WorkflowClient
    epoch: int

    def answer(
        self,
        value: Any,
        *,
        client: WorkflowClient | None = None,
        session: str = SESSION,
        epoch: int | None = None,
        key: str | None = None,
    ) -> dict[str, Any]:
        payload = {"answer": value, "sessionId": session, "coordinatorEpoch": epoch or self.epoch}
        return dict(
            (client or self.coordinator).request(
                "run.answer", payload, run_id=self.run_id, idempotency_key=key
            )
        )


@pytest.fixture
def gated(running: WorkflowServer, short_tmp: Path) -> Iterator[Gated]:
    project = short_tmp / "project"
    write_workflow(project, "gated", GATED)
    with WorkflowClient(running.state_dir, autostart=False, timeout=30) as client:
        run_id = start(client, project, "gated", SESSION)["receipt"]["runId"]
        wait_for(client, run_id, {"waiting"})
    coordinator = WorkflowClient(running.state_dir, autostart=False, timeout=60)
    try:
        yield Gated(running, run_id, coordinator, claim(coordinator))
    finally:
        coordinator.close()


def test_the_coordinators_answer_continues_the_run_in_the_same_origin_session(
    gated: Gated,
) -> None:
    invalid = gated.answer({"go": "yes"}, key="answer-bad")
    assert invalid["outcome"] == "rejected", invalid
    assert invalid["error"]["code"] == "answerInvalid"
    answer = gated.answer({"go": True}, key="answer-1")
    assert answer["outcome"] == "accepted", answer
    continuation = answer["receipt"]["continuationRunId"]
    state = gated.server.state_dir
    with WorkflowClient(state, autostart=False, timeout=30) as client:
        wait_for(client, continuation, {"waiting"})
    # The continuation holds the origin session's reservation; the parent handed it over.
    bindings = dict(
        (run, (mode, session, reserved))
        for run, mode, session, reserved in rows(
            state, "SELECT run_id, execution_mode, origin_session_id, reserved FROM run_bindings"
        )
    )
    assert bindings == {
        gated.run_id: ("interactive", SESSION, 0),
        continuation: ("interactive", SESSION, 1),
    }
    assert rows(state, "SELECT status FROM runs WHERE run_id = ?", gated.run_id) == [("completed",)]
    # Its agent step waits in the same session, with the answer in its prompt.
    [(request_id, target)] = rows(
        state,
        "SELECT request_id, target_session_id FROM interactive_requests WHERE run_id = ?",
        continuation,
    )
    assert target == SESSION
    assert rows(
        state,
        "SELECT kind, reason, state FROM workflow_messages WHERE run_id = ?",
        continuation,
    ) == [("step", "initial", "pending")]
    # A retry with the same key after a reconnect (a new epoch) adopts the stored answer.
    gated.coordinator.close()
    newer = claim(gated.coordinator)
    assert newer > gated.epoch
    again = gated.answer({"go": True}, key="answer-1", epoch=newer)
    assert again["outcome"] == "adopted", again
    assert again["receipt"]["continuationRunId"] == continuation
    # The continuation's step takes the coordinator's submission like any other.
    submitted = gated.coordinator.request(
        "interaction.submit",
        {
            "interactionId": request_id,
            "submissionId": "submission-after-gate",
            "value": {"summary": "went on"},
            "sessionId": SESSION,
            "coordinatorEpoch": newer,
        },
        run_id=continuation,
    )
    assert submitted["outcome"] == "accepted", submitted
    with WorkflowClient(state, autostart=False, timeout=30) as client:
        wait_for(client, continuation, {"completed"})
    assert rows(state, "SELECT count(*) FROM runs") == [(2,)]


def test_an_answer_without_the_sessions_authority_is_rejected_and_continues_nothing(
    gated: Gated,
) -> None:
    with WorkflowClient(gated.server.state_dir, autostart=False, timeout=30) as other:
        answer = other.request(
            "view.subscribe",
            {"kind": "sessionView", "sessionId": "pi-session-other", "coordinator": True},
        )
        other_epoch = int(answer["receipt"]["coordinatorEpoch"])
        wrong = gated.answer(
            {"go": True}, client=other, session="pi-session-other", epoch=other_epoch
        )
        fenced = gated.answer({"go": True}, client=other)  # its epoch is not this session's
    assert wrong["outcome"] == "rejected", wrong
    assert wrong["error"] == {
        "code": "answerRefused",
        "message": "the run does not belong to this origin session",
    }
    assert fenced["outcome"] == "rejected" and fenced["error"]["code"] == "coordinatorFenced"
    state = gated.server.state_dir
    assert rows(state, "SELECT count(*) FROM runs") == [(1,)]
    assert rows(state, "SELECT status FROM human_decisions") == [("pending",)]
    # No receipt was stored for them: the same key is free for the real answer.
    assert rows(state, "SELECT count(*) FROM host_commands WHERE operation = 'run.answer'") == [
        (0,)
    ]


def test_a_protected_decision_is_never_answered_by_the_workflow_tool(state_dir: Path) -> None:
    """No protected decision kind exists yet: a stored decision row of another audience
    stands in for one, so the refusal path is proved before that kind is built."""
    from pi_workflows.storage import open_database  # noqa: PLC0415 - this test only
    from pi_workflows.storage._content import put_json_blob  # noqa: PLC0415
    from tests.storage.storage_helpers import enqueue  # noqa: PLC0415

    db = open_database(state_dir / "state.sqlite")
    try:
        enqueue(db, "run-p", execution_mode="interactive", origin_session_id=SESSION)
        with db.write() as tx:
            tx.execute(
                "INSERT INTO human_decisions (decision_id, run_id, node_path, audience, "
                "request_digest, request_hash, status, created_at, updated_at) VALUES "
                "('decision-p', 'run-p', 'approve', 'human', 'sha256:x', :h, 'pending', "
                ":now, :now)",
                {"h": put_json_blob(tx, {"question": "Deploy?"}), "now": tx.now},
            )
    finally:
        db.close()
    server = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=False)
    server.start()
    try:
        with WorkflowClient(state_dir, autostart=False, timeout=30) as coordinator:
            epoch = claim(coordinator)
            refused = coordinator.request(
                "run.answer",
                {"answer": {"ok": True}, "sessionId": SESSION, "coordinatorEpoch": epoch},
                run_id="run-p",
            )
    finally:
        server.stop("test teardown")
    assert refused["outcome"] == "rejected", refused
    assert refused["error"]["code"] == "protectedDecision"
    assert "/workflow answer" in refused["error"]["message"]
    assert rows(state_dir, "SELECT status FROM human_decisions") == [("pending",)]


def test_an_accepted_output_survives_a_restart_before_any_runner_takes_it(
    state_dir: Path, short_tmp: Path
) -> None:
    """The acceptance and the requeue are one durable commit: a server that stops before
    it launches the runner leaves a queued run with its waiting attempt and settled
    request, and the next server completes that same attempt."""
    project = short_tmp / "project"
    write_workflow(project, "ask", WORKFLOW)

    def server(execute: bool) -> WorkflowServer:
        instance = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=execute)
        instance.start()
        return instance

    first = server(True)
    try:
        with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
            run_id = start(client, project, "ask", SESSION)["receipt"]["runId"]
            wait_for(client, run_id, {"waiting"})
    finally:
        first.stop("test: the step waits")
    [(request_id, attempt_id)] = rows(
        state_dir,
        "SELECT request_id, attempt_id FROM interactive_requests WHERE run_id = ?",
        run_id,
    )
    idle = server(False)  # records, admits nothing
    try:
        with WorkflowClient(state_dir, autostart=False, timeout=60) as coordinator:
            epoch = claim(coordinator)
            answer = coordinator.request(
                "interaction.submit",
                {
                    "interactionId": request_id,
                    "submissionId": "submission-durable",
                    "value": {"summary": "kept"},
                    "sessionId": SESSION,
                    "coordinatorEpoch": epoch,
                },
                run_id=run_id,
            )
            assert answer["outcome"] == "accepted", answer
    finally:
        idle.stop("test: accepted, not yet run")
    assert rows(
        state_dir,
        "SELECT r.status, q.state, a.status, i.status FROM runs r "
        "JOIN run_queue q ON q.run_id = r.run_id JOIN node_attempts a ON a.attempt_id = ? "
        "JOIN interactive_requests i ON i.request_id = ? WHERE r.run_id = ?",
        attempt_id,
        request_id,
        run_id,
    ) == [("queued", "queued", "waiting", "settled")]
    last = server(True)
    try:
        with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
            wait_for(client, run_id, {"completed"})
    finally:
        last.stop("test teardown")
    assert rows(state_dir, "SELECT status FROM node_attempts WHERE attempt_id = ?", attempt_id) == [
        ("completed",)
    ]
    [(output,)] = rows(
        state_dir,
        "SELECT b.content FROM node_attempts a JOIN blobs b ON b.digest = a.output_hash "
        "WHERE a.run_id = ? AND a.node_path = 'after'",
        run_id,
    )
    assert b"KEPT" in bytes(output)
