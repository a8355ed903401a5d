"""Assistant-message steps in an origin session, over the real socket (issue 29, part 1).

An interactive run's `assistant_message` step waits in its origin session like an agent
step, but as a request of kind `assistant`: its step message asks for a normal visible
reply, the run view offers no submit, the `workflow` tool cannot answer it, the turn
start's receipt asks for the reply (`visibleReply`), and the completed turn's end report
carries it: the reply, bounded by `max_chars`, is the node's output and the run goes on.
A turn that ends without a reply follows the unproductive-turn rule.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.domain import visible_output
from pi_workflows.storage import open_database, read_json_blob
from tests.conftest import write_workflow
from tests.server import origin
from tests.server.origin import SESSION, rows, session_snapshot, start
from tests.server.runs import wait_for
from tests.server.test_origin_reports import Parked, next_is, sent
from tests.server.watchers import Watcher

pytestmark = pytest.mark.timeout(120)

running = origin.running

PLAN = """
from pi_workflows import assistant_message, compute, define_workflow

workflow = define_workflow(
    name="plan",
    start_at="propose",
    nodes={
        "propose": assistant_message(
            lambda ctx: "Propose a plan for " + ctx.input["topic"], max_chars=10
        ),
        "after": compute(lambda ctx: {"seen": ctx.outputs["propose"]["text"]}),
    },
    edges=[{"from": "propose", "to": "after"}],
)
"""


@dataclass
class Visible(Parked):
    """The parked run, with the coordinator's active epoch."""

    epoch: int = 0


@pytest.fixture
def parked(running: WorkflowServer, short_tmp: Path) -> Iterator[Visible]:
    project = short_tmp / "project"
    write_workflow(project, "plan", PLAN)
    with WorkflowClient(running.state_dir, autostart=False, timeout=30) as client:
        run_id = start(client, project, "plan", SESSION)["receipt"]["runId"]
        wait_for(client, run_id, {"waiting"})
    coordinator = Watcher(running.socket_path)
    try:
        granted = coordinator.request(
            "view.subscribe", {"kind": "sessionView", "sessionId": SESSION, "coordinator": True}
        )
        assert granted["outcome"] == "accepted", granted
        view = session_snapshot(coordinator, lambda v: v["nextMessage"] is not None, "a message")
        message = view["nextMessage"]
        assert "normal visible reply" in message["content"]["value"]["prompt"]
        assert message["content"]["value"]["contract"]["visible"] is True
        yield Visible(
            running,
            run_id,
            message["messageId"],
            message["sourceId"],
            coordinator,
            int(granted["receipt"]["coordinatorEpoch"]),
        )
    finally:
        coordinator.close()


def _ended(parked: Parked, turn_id: str, **reply: Any) -> dict[str, Any]:
    payload = {
        "sessionId": SESSION,
        "messageId": parked.message_id,
        "turnId": turn_id,
        "phase": "ended",
        "stopReason": "completed",
        "responseEntryId": None,
        **reply,
    }
    return parked.coordinator.request("workflowTurn.report", payload, runId=parked.run_id)


def _output(state_dir: Path, run_id: str, node: str) -> Any:
    [(digest,)] = rows(
        state_dir,
        "SELECT output_hash FROM node_attempts WHERE run_id = ? AND node_path = ?",
        run_id,
        node,
    )
    db = open_database(state_dir / "state.sqlite")
    try:
        return read_json_blob(db, digest)
    finally:
        db.close()


def test_the_visible_reply_of_the_turn_is_the_output_and_the_run_goes_on(parked: Parked) -> None:
    [(kind,)] = rows(
        parked.server.state_dir,
        "SELECT kind FROM interactive_requests WHERE request_id = ?",
        parked.request_id,
    )
    assert kind == "assistant"
    display = parked.display()
    assert display["status"] == "waiting"
    assert "submit" not in display["controls"] and "update" not in display["controls"]
    sent(parked)
    started = parked.turn("started", "turn-1")
    assert started["receipt"]["ownership"] == "active"
    assert started["receipt"]["visibleReply"] is True
    ended = _ended(parked, "turn-1", assistantText="Ship it on Friday.")
    assert ended["receipt"]["ownership"] == "settled", ended
    # A repeat of the end adopts it: one submission, accepted once.
    assert (
        _ended(parked, "turn-1", assistantText="Ship it on Friday.")["receipt"] == ended["receipt"]
    )
    with WorkflowClient(parked.server.state_dir, autostart=False, timeout=60) as client:
        view = wait_for(client, parked.run_id, {"completed"})
    assert view["display"]["status"] == "completed"
    output = _output(parked.server.state_dir, parked.run_id, "propose")
    assert output == {"text": "Ship it on", "truncated": True, "overflow": " Friday."}
    assert _output(parked.server.state_dir, parked.run_id, "after") == {"seen": "Ship it on"}
    assert rows(
        parked.server.state_dir,
        "SELECT outcome FROM interactive_submissions WHERE request_id = ?",
        parked.request_id,
    ) == [("accepted",)]
    assert parked.turns() == {"turn-1": "completed"}


def test_a_turn_without_a_reply_is_unproductive_and_gets_a_visible_reminder(
    parked: Parked,
) -> None:
    sent(parked)
    parked.turn("started", "turn-1")
    assert _ended(parked, "turn-1")["receipt"]["ownership"] == "settled"
    [(count,)] = rows(
        parked.server.state_dir,
        "SELECT unproductive_turn_ends FROM interactive_requests WHERE request_id = ?",
        parked.request_id,
    )
    assert count == 1
    [reminder] = [row for row in parked.messages() if row[2] == "pending"]
    view = session_snapshot(parked.coordinator, next_is(str(reminder[0])), "the reminder")
    content = view["nextMessage"]["content"]["value"]
    assert (
        "normal visible reply" in content["prompt"] and "`workflow` tool" not in content["prompt"]
    )
    assert content["contract"]["visible"] is True


def test_an_aborted_turn_pauses_and_its_reply_is_not_taken_then_resume_presents_it_again(
    parked: Visible,
) -> None:
    sent(parked)
    parked.turn("started", "turn-1")
    aborted = _ended(parked, "turn-1", stopReason="aborted", assistantText="half a plan")
    assert aborted["receipt"]["turn"]["status"] == "aborted"
    assert parked.display()["status"] == "paused"
    assert rows(
        parked.server.state_dir,
        "SELECT count(*) FROM interactive_submissions WHERE request_id = ?",
        parked.request_id,
    ) == [(0,)]
    with WorkflowClient(parked.server.state_dir, autostart=False, timeout=30) as client:
        assert client.request("run.resume", run_id=parked.run_id)["outcome"] == "accepted"
    [(message, reason, _, _)] = [row for row in parked.messages() if row[2] == "pending"]
    assert reason == "resumed"
    parked.branch([(parked.message_id, "entry-1"), (message, "entry-2")], idle=False)
    fresh = parked.turn("started", "turn-2", message_id=message)
    assert fresh["receipt"]["visibleReply"] is True
    payload = {
        "sessionId": SESSION,
        "messageId": message,
        "turnId": "turn-2",
        "phase": "ended",
        "stopReason": "completed",
        "responseEntryId": None,
        "assistantText": "Whole plan",
    }
    parked.coordinator.request("workflowTurn.report", payload, runId=parked.run_id)
    with WorkflowClient(parked.server.state_dir, autostart=False, timeout=60) as client:
        wait_for(client, parked.run_id, {"completed"})
    assert _output(parked.server.state_dir, parked.run_id, "propose") == {"text": "Whole plan"}


def test_the_workflow_tool_cannot_answer_it(parked: Visible) -> None:
    epoch = parked.epoch
    answer = parked.coordinator.request(
        "interaction.submit",
        {
            "interactionId": parked.request_id,
            "submissionId": "submission-tool-1",
            "value": {"text": "via the tool"},
            "sessionId": SESSION,
            "coordinatorEpoch": epoch,
        },
        runId=parked.run_id,
    )
    assert answer["outcome"] == "rejected", answer
    assert "answer with a normal visible reply" in answer["error"]["message"]


@pytest.mark.parametrize(
    ("text", "bound", "cut", "expected"),
    [
        ("short", 10, False, {"text": "short"}),
        ("exactly10!", 10, False, {"text": "exactly10!"}),
        ("a longer reply", 8, False, {"text": "a longer", "truncated": True, "overflow": " reply"}),
        ("anything", None, False, {"text": "anything"}),
        ("cut by pi", None, True, {"text": "cut by pi", "truncated": True}),
    ],
)
def test_visible_output_bounds_the_text_and_keeps_the_rest(
    text: str, bound: int | None, cut: bool, expected: dict[str, Any]
) -> None:
    assert visible_output(text, bound, cut=cut) == expected
