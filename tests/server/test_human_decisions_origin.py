"""A protected decision in an origin session (issue 15 item 1, issue 14's "Pause and
resume a protected decision"), over the socket as the Pi extension would drive it.

The decision creates exactly one passive `decision` workflow message; the model's
`workflow` tool (`run.answer` with the coordinator's authority) cannot answer it; pause
and resume keep the decision's answer revision and create no second decision message;
`decision.answer` with source channel `pi` completes the run in the session.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from tests.server.origin import SESSION, rows, session_snapshot, start
from tests.server.runs import TERMINAL, wait_for
from tests.server.test_human_decisions import output_of, resolutions, write_ship
from tests.server.watchers import Watcher

pytestmark = pytest.mark.timeout(120)


def decision_messages(state_dir: Path, run_id: str) -> list[tuple[Any, ...]]:
    return rows(
        state_dir,
        "SELECT kind, source_id, state FROM workflow_messages "
        "WHERE run_id = ? AND kind = 'decision'",
        run_id,
    )


@pytest.fixture
def session_run(
    running_server: WorkflowServer, short_tmp: Path
) -> Iterator[tuple[str, Watcher, int]]:
    project = short_tmp / "project"
    write_ship(project)
    with WorkflowClient(running_server.state_dir, autostart=False, timeout=30) as client:
        answer = start(client, project, "ship", SESSION, input={"version": "2.0"})
        assert answer["outcome"] == "accepted", answer
        run_id = answer["receipt"]["runId"]
        assert wait_for(client, run_id, {"waiting"} | TERMINAL)["display"]["status"] == "waiting"
    coordinator = Watcher(running_server.socket_path)
    try:
        granted = coordinator.request(
            "view.subscribe", {"kind": "sessionView", "sessionId": SESSION, "coordinator": True}
        )
        assert granted["outcome"] == "accepted", granted
        yield run_id, coordinator, int(granted["receipt"]["coordinatorEpoch"])
    finally:
        coordinator.close()


def test_the_decision_is_one_passive_message_the_model_tool_cannot_answer(
    running_server: WorkflowServer, session_run: tuple[str, Watcher, int]
) -> None:
    run_id, coordinator, epoch = session_run
    state_dir = running_server.state_dir
    [(decision_id, revision)] = rows(
        state_dir, "SELECT decision_id, revision FROM human_decisions WHERE run_id = ?", run_id
    )
    assert decision_messages(state_dir, run_id) == [("decision", decision_id, "pending")]
    view = session_snapshot(coordinator, lambda v: v.get("nextMessage") is not None, "next")
    message = view["nextMessage"]
    assert message["kind"] == "decision" and message["sourceId"] == decision_id
    # The model's `workflow` tool answers through run.answer with the session's authority.
    refused = coordinator.request(
        "run.answer",
        {"answer": {"choice": "approve"}, "sessionId": SESSION, "coordinatorEpoch": epoch},
        runId=run_id,
    )
    assert refused["outcome"] == "rejected", refused
    assert refused["error"]["code"] == "protectedDecision"
    assert resolutions(state_dir, run_id) == []
    assert rows(state_dir, "SELECT revision FROM human_decisions WHERE run_id = ?", run_id) == [
        (revision,)
    ]


def test_pause_and_resume_keep_the_revision_and_add_no_decision_message_then_pi_answers(
    running_server: WorkflowServer, session_run: tuple[str, Watcher, int]
) -> None:
    run_id, _, _ = session_run
    state_dir = running_server.state_dir
    before = rows(
        state_dir, "SELECT decision_id, revision FROM human_decisions WHERE run_id = ?", run_id
    )
    with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
        assert client.call("run.pause", run_id=run_id)["outcome"] == "accepted"
        paused = client.request(
            "decision.answer",
            {"answer": {"choice": "approve"}, "sourceChannel": "pi"},
            run_id=run_id,
        )
        assert paused["outcome"] == "rejected" and paused["error"]["code"] == "runPaused"
        assert client.call("run.resume", run_id=run_id)["outcome"] == "accepted"
        after = rows(
            state_dir, "SELECT decision_id, revision FROM human_decisions WHERE run_id = ?", run_id
        )
        assert after == before, "the same decision at the same answer revision"
        [(decision_id, _)] = after
        assert decision_messages(state_dir, run_id) == [("decision", decision_id, "pending")]
        answered = client.call(
            "decision.answer",
            {"answer": {"choice": "approve"}, "sourceChannel": "pi"},
            run_id=run_id,
        )
        continuation = answered["receipt"]["continuationRunId"]
        assert output_of(client, continuation) == {"shipped": True}
    assert resolutions(state_dir, run_id) == [("accepted", "human", "pi")]
    # Answered: the pending decision message is closed with its run, and the final leaf
    # of the chain (the continuation, in the same session) has its terminal message.
    assert decision_messages(state_dir, run_id) == [("decision", decision_id, "cancelled")]
    assert rows(
        state_dir,
        "SELECT run_id FROM workflow_messages WHERE kind = 'terminal'",
    ) == [(continuation,)]
