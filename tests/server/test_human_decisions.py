"""Protected human decisions through the CLI and `decision.*` (issue 15, item 1).

Real servers, real runners, real sockets and the real CLI. A `human_decision` parks
its run `waiting` with one protected decision; `decision list` shows it; `decision
answer` is checked against the decision's choices in the stored definition snapshot;
exactly one answer wins, a repeat adopts, another answer is a conflict; the model-facing
`run.answer` is refused; a paused run refuses answers and keeps the answer revision.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from tests.conftest import Processes, write_workflow
from tests.server.origin import rows
from tests.server.runs import TERMINAL, wait_for

pytestmark = pytest.mark.timeout(120)

SHIP = """
from pi_workflows import choice, compute, define_workflow, human_decision

workflow = define_workflow(
    name="{name}",
    start_at="ask",
    nodes={{
        "ask": human_decision(
            lambda ctx: "Ship version " + ctx.input["version"] + "?",
            choices={{"approve": "Approve", "reject": choice("Reject", input="reason")}},
            {timeout}
        ),
        "shipped": compute(lambda ctx: {{"shipped": True}}),
        "held": compute(
            lambda ctx: {{"shipped": False, "why": ctx.outputs["ask"]["input"]["reason"]}}
        ),
    }},
    edges=[{{"from": "ask", "switch": {{"on": "$.choice",
             "cases": {{"approve": "shipped", "reject": "held"}}}}}}],
)
"""
DEFAULT: dict[str, Any] = {"choice": "reject", "input": {"reason": "nobody answered"}}
SHIP_NOW = SHIP.format(name="ship", timeout="")
SHIP_TIMED = SHIP.format(name="shiptimed", timeout=f"on_timeout=(5, {DEFAULT!r}),")


def write_ship(project: Path) -> None:
    """Both decision workflows (`ship` waits for a person, `shiptimed` has a 5 s
    default) in the project."""
    write_workflow(project, "ship", SHIP_NOW)
    write_workflow(project, "shiptimed", SHIP_TIMED)


def start_waiting(client: WorkflowClient, project: Path, name: str = "ship", **extra: Any) -> str:
    """Start `name` and wait until it waits at its decision."""
    payload = {"workflow": name, "projectPath": str(project), "input": {"version": "1.2"}}
    run_id = str(client.call("run.start", {**payload, **extra})["receipt"]["runId"])
    waiting = wait_for(client, run_id, {"waiting"} | TERMINAL)
    assert waiting["display"]["status"] == "waiting", waiting
    return run_id


def resolutions(state_dir: Path, run_id: str) -> list[tuple[Any, ...]]:
    """(outcome, provenance, source channel) of each resolution of the run's decisions."""
    return rows(
        state_dir,
        "SELECT x.outcome, x.provenance, x.source_channel FROM human_decision_resolutions x "
        "JOIN human_decisions d ON d.decision_id = x.decision_id WHERE d.run_id = ?",
        run_id,
    )


def output_of(client: WorkflowClient, run_id: str) -> Any:
    view = wait_for(client, run_id, TERMINAL)
    assert view["display"]["status"] == "completed", view
    return view["result"]["output"]["value"]


@pytest.fixture
def ship_project(short_tmp: Path) -> Path:
    project = short_tmp / "project"
    write_ship(project)
    return project


@pytest.fixture
def waiting(running_server: WorkflowServer, ship_project: Path) -> Iterator[str]:
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        yield start_waiting(client, ship_project)


def test_decision_list_shows_the_pending_decision_without_payloads(
    processes: Processes, running_server: WorkflowServer, waiting: str
) -> None:
    state_dir = running_server.state_dir
    listed = processes.cli(state_dir, "decision", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    [item] = json.loads(listed.stdout)
    assert item["runId"] == waiting
    assert item["workflow"] == "ship"
    assert item["summary"] == "Ship version 1.2?"
    assert [c["id"] for c in item["choices"]] == ["approve", "reject"]
    assert item["choices"][1]["input"]["name"] == "reason"
    assert item["expiresAt"] is None and item["hasDefault"] is False
    assert item["revision"] == 1 and item["audience"] == "operator"
    assert set(item) == {
        "decisionId", "runId", "workflow", "node", "audience", "revision", "createdAt",
        "expiresAt", "hasDefault", "paused", "summary", "choices",
    }  # fmt: skip
    text = processes.cli(state_dir, "decision", "list")
    assert text.returncode == 0, text.stderr
    assert waiting in text.stdout and "Ship version 1.2?" in text.stdout
    assert "choices: approve (Approve), reject (Reject; with reason: text)" in text.stdout
    assert f"pi-workflows decision answer {waiting} --input-json" in text.stdout


def test_one_answer_wins_a_repeat_adopts_and_another_answer_conflicts(
    processes: Processes, running_server: WorkflowServer, waiting: str
) -> None:
    state_dir = running_server.state_dir
    reject = '{"choice": "reject", "input": {"reason": "not on a Friday"}}'
    answered = processes.cli(state_dir, "decision", "answer", waiting, "--input-json", reject)
    assert answered.returncode == 0, answered.stderr
    # The words go to stderr; stdout is the continuation's bare run ID (issue 24).
    assert answered.stderr.startswith(f"Answered {waiting}; the workflow continues as run-")
    continuation = answered.stderr.strip().rsplit(" ", 1)[1]
    assert answered.stdout == f"{continuation}\n"
    again = processes.cli(state_dir, "decision", "answer", waiting, "--input-json", reject)
    assert again.returncode == 0, again.stderr
    assert (
        again.stderr.strip()
        == f"Already answered this way; the workflow continues as {continuation}"
    )
    assert again.stdout == f"{continuation}\n"
    other = processes.cli(
        state_dir, "decision", "answer", waiting, "--input-json", '{"choice": "approve"}'
    )
    assert other.returncode == 1
    assert (
        other.stderr.strip()
        == "pi-workflows: conflict: the decision was already answered differently"
    )
    with WorkflowClient(state_dir, autostart=False) as client:
        assert output_of(client, continuation) == {"shipped": False, "why": "not on a Friday"}
        parent = client.call("run.get", run_id=waiting)["receipt"]
        assert parent["display"]["status"] == "completed"
        assert client.call("decision.list")["receipt"]["items"] == []
    assert resolutions(state_dir, waiting) == [("accepted", "human", "cli")]
    [(continued,)] = rows(state_dir, "SELECT count(*) FROM runs WHERE continuation_of = ?", waiting)
    assert continued == 1, "exactly one continuation run"


def test_a_repeat_of_the_same_request_adopts_and_the_same_key_with_another_answer_conflicts(
    running_server: WorkflowServer, waiting: str
) -> None:
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        first = client.request(
            "decision.answer", {"answer": {"choice": "approve"}}, run_id=waiting,
            idempotency_key="person-1",
        )  # fmt: skip
        assert first["outcome"] == "accepted", first
        assert first["receipt"]["provenance"] == "human"
        repeat = client.request(
            "decision.answer", {"answer": {"choice": "approve"}}, run_id=waiting,
            idempotency_key="person-1",
        )  # fmt: skip
        assert repeat["outcome"] == "adopted"
        assert repeat["receipt"] == first["receipt"]
        reused = client.request(
            "decision.answer", {"answer": {"choice": "reject", "input": {"reason": "x"}}},
            run_id=waiting, idempotency_key="person-1",
        )  # fmt: skip
        assert reused["outcome"] == "conflict"
        assert reused["error"]["code"] == "idempotencyConflict"
        assert output_of(client, first["receipt"]["continuationRunId"]) == {"shipped": True}


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        ('{"choice": "maybe"}', "the choice is not one of the decision's choices: approve, reject"),
        ('{"choice": "reject"}', 'choice reject needs "input": {"reason": text}'),
        ('{"choice": "approve", "input": {"x": "y"}}', "choice approve takes no input"),
        ('{"choice": "reject", "input": {"reason": "  "}}', "input reason must be 1 to 4000"),
        ('"approve"', 'the answer is {"choice": ID} with one of the choices'),
    ],
)
def test_an_answer_that_fits_no_choice_is_rejected_and_changes_nothing(
    processes: Processes, running_server: WorkflowServer, waiting: str, answer: str, says: str
) -> None:
    state_dir = running_server.state_dir
    refused = processes.cli(state_dir, "decision", "answer", waiting, "--input-json", answer)
    assert refused.returncode == 1
    assert refused.stdout == ""
    assert refused.stderr.startswith("pi-workflows: rejected: ")
    assert says in refused.stderr
    assert resolutions(state_dir, waiting) == []
    with WorkflowClient(state_dir, autostart=False) as client:
        [item] = client.call("decision.list")["receipt"]["items"]
        assert item["runId"] == waiting and item["revision"] == 1


def test_run_answer_and_the_session_tool_path_cannot_answer_a_protected_decision(
    processes: Processes, running_server: WorkflowServer, waiting: str
) -> None:
    state_dir = running_server.state_dir
    refused = processes.cli(
        state_dir, "run", "answer", waiting, "--input-json", '{"choice": "approve"}'
    )
    assert refused.returncode == 1
    assert "rejected: the run waits at a protected human decision" in refused.stderr
    assert resolutions(state_dir, waiting) == []


def test_a_paused_run_rejects_answers_and_keeps_its_answer_revision(
    processes: Processes, running_server: WorkflowServer, waiting: str
) -> None:
    state_dir = running_server.state_dir
    with WorkflowClient(state_dir, autostart=False) as client:
        [before] = client.call("decision.list")["receipt"]["items"]
        assert client.call("run.pause", run_id=waiting)["outcome"] == "accepted"
        [paused] = client.call("decision.list")["receipt"]["items"]
        assert paused["paused"] is True and paused["revision"] == before["revision"]
    refused = processes.cli(
        state_dir, "decision", "answer", waiting, "--input-json", '{"choice": "approve"}'
    )
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        "pi-workflows: rejected: the run is paused; resume it, then answer"
    )
    with WorkflowClient(state_dir, autostart=False) as client:
        assert client.call("run.resume", run_id=waiting)["outcome"] == "accepted"
        [after] = client.call("decision.list")["receipt"]["items"]
        assert after["decisionId"] == before["decisionId"]
        assert after["revision"] == before["revision"], "pause and resume keep the revision"
        # The revision a person read before the pause is still the one to answer.
        accepted = client.request(
            "decision.answer", {"answer": {"choice": "approve"}}, run_id=waiting,
            expected_revision=before["revision"],
        )  # fmt: skip
        assert accepted["outcome"] == "accepted", accepted
    [(count,)] = rows(state_dir, "SELECT count(*) FROM human_decisions WHERE run_id = ?", waiting)
    assert count == 1, "pause and resume opened no second decision"


def test_a_stale_expected_revision_is_a_conflict(
    running_server: WorkflowServer, waiting: str
) -> None:
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        stale = client.request(
            "decision.answer", {"answer": {"choice": "approve"}}, run_id=waiting,
            expected_revision=7,
        )  # fmt: skip
        assert stale["outcome"] == "conflict"
        assert stale["error"]["code"] == "revisionConflict"
        unknown = client.request(
            "decision.answer", {"answer": {"choice": "approve"}, "decisionId": "decision-x"},
            run_id=waiting,
        )  # fmt: skip
        assert unknown["outcome"] == "notFound"
        assert unknown["error"]["code"] == "decisionNotFound"
    assert resolutions(running_server.state_dir, waiting) == []


def test_the_run_view_offers_a_persons_answer_and_says_how(
    running_server: WorkflowServer, waiting: str
) -> None:
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        display = client.call("run.get", run_id=waiting)["receipt"]["display"]
    assert display["status"] == "waiting"
    assert display["waitingOn"] == "ask"
    assert display["controls"] == ["human-answer", "pause", "cancel"], "not the model's answer"
    assert display["reasonCode"] == "humanDecision"
    # Says how in words (no command: each renderer names its own) and which step first.
    assert "person answers the decision" in display["action"]
    assert display["next"] == ["human-answer", "cancel"]
    assert display["question"] and display["choices"], "what is asked, with the choices"
