"""The `display` rules of `pi-workflows.run-view.v1`, one by one, on a real database.

Each case of workflow-server.md § Live run view is produced through the storage
transitions a live server uses (a live run cannot reach some of them deterministically):
an ambiguous effect on a nonterminal run, a durable pause, a parked run, a checkpoint
wait, and a terminal result while the runner still cleans up. Every view is checked
against the run-view schema.
"""

from __future__ import annotations

from typing import Any

import pytest

from pi_workflows.domain._run_view import build_run_view
from pi_workflows.storage import (
    Claim,
    Database,
    FailureClass,
    RunnerOutcome,
    complete_run,
    declare_effect_ambiguous,
    fail_run,
    finish_node_attempt,
    mark_runner_live,
    open_checkpoint_decision,
    park_run,
    pause_run,
    record_runner_exit,
    reserve_effect,
    start_node_attempt,
    wait_run,
)
from pi_workflows.storage._interactions import request_interaction
from pi_workflows.wire import protocol
from tests.storage.storage_helpers import INTERACTIVE, enqueue, launch, running

pytestmark = pytest.mark.timeout(30)


def view(db: Database, run_id: str = "run-1") -> dict[str, Any]:
    built = build_run_view(db, run_id)
    assert built is not None
    protocol.validate("run-view.v1", built)
    return built


def _start(db: Database, claim: Claim, attempt_id: str, node: str, kind: str = "action") -> None:
    with db.write() as tx:
        start_node_attempt(tx, claim, attempt_id=attempt_id, node_path=node, node_type=kind)


def _ambiguous_effect(db: Database, claim: Claim) -> None:
    _start(db, claim, "a1", "charge")
    with db.write() as tx:
        reserve_effect(
            tx,
            claim,
            attempt_id="a1",
            effect_type="payment.charge",
            idempotency_key="run-1/charge/1",
            request={"amount": 5},
            executor_epoch="run-1-e1",
        )
        declare_effect_ambiguous(tx, claim, idempotency_key="run-1/charge/1", reason="lost")


def test_a_missing_run_has_no_view(db: Database) -> None:
    assert build_run_view(db, "run-none") is None


def test_rule_2_recovery_is_offered_only_once_the_ambiguous_run_is_parked(
    db: Database,
) -> None:
    claim = running(db)
    _ambiguous_effect(db, claim)  # its runner has not parked the run yet
    display = view(db)["display"]
    assert display["status"] == "ambiguous"
    assert display["controls"] == ["cancel"], "run.recover refuses a run not parked yet"


def test_rule_2_an_ambiguous_effect_on_a_nonterminal_run_is_ambiguous(db: Database) -> None:
    claim = running(db)
    _ambiguous_effect(db, claim)
    with db.write() as tx:
        park_run(tx, claim, reason="effectAmbiguous")
        pause_run(tx, "run-1")  # rule 2 comes before the pause of rule 3
    shown = view(db)
    display = shown["display"]
    assert display["status"] == "ambiguous"
    assert display["controls"] == ["recoverConfirm", "recoverRetry", "cancel"]
    assert display["reasonCode"] == "effectAmbiguous"
    assert "without a receipt" in display["reasonText"]
    # Words without any command (the renderers name theirs), and the advised steps.
    assert "confirm that the effect happened or retry it" in display["action"]
    assert "--" not in display["action"]
    assert display["next"] == ["recoverConfirm", "recoverRetry", "cancel"]
    assert [e["effectType"] for e in shown["ambiguousEffects"]] == ["payment.charge"]


def test_rule_1_a_terminal_run_keeps_its_label_and_a_review_of_its_effect(db: Database) -> None:
    claim = running(db)
    _ambiguous_effect(db, claim)
    with db.write() as tx:
        complete_run(tx, "run-1", claim=claim, payload={"output": {"ok": True}})
    display = view(db)["display"]
    assert display["status"] == "completed"
    assert display["controls"] == ["restart", "review"]


def test_rule_1_a_terminal_result_while_cleanup_runs_stays_terminal(db: Database) -> None:
    claim = running(db)
    with db.write() as tx:
        complete_run(tx, "run-1", claim=claim, payload={"output": {"n": 3}})
    # The runner epoch is still live: it reports and cleans up after the result.
    during = view(db)
    assert during["display"]["status"] == "completed"
    activity = during["display"]["activity"]
    assert (activity["kind"], activity["state"]) == ("runner", "ready")
    assert during["result"] == {"output": {"value": {"n": 3}}}
    with db.write() as tx:
        record_runner_exit(tx, "run-1-e1", outcome=RunnerOutcome.EXITED, exit_code=0)
    after = view(db)["display"]
    assert after["status"] == "completed" and after["activity"] is None


def test_rule_3_a_durable_pause_is_paused_while_its_runner_stops(db: Database) -> None:
    claim = running(db)
    _start(db, claim, "a1", "work", "compute")
    with db.write() as tx:
        pause_run(tx, "run-1", claim=claim)
    shown = view(db)
    display = shown["display"]
    assert display["status"] == "paused"
    assert display["activity"] is not None, "the runner still stops: activity is separate"
    assert display["controls"] == ["resume", "cancel"]
    assert display["reasonCode"] == "paused" and display["reasonText"] == "Paused by an operator."


def test_rule_3_a_pause_is_never_inferred_from_a_parked_queue(db: Database) -> None:
    claim = running(db)
    with db.write() as tx:
        park_run(tx, claim, reason="serverCrashLoop")
        record_runner_exit(tx, "run-1-e1", outcome=RunnerOutcome.ORPHANED)
    shown = view(db)
    display = shown["display"]
    assert display["status"] == "queued", "rule 6: parked resumable work is queued, not paused"
    assert display["reason"] == "serverCrashLoop"
    assert "died again and again" in display["reasonText"]
    assert "resume or cancel" in display["action"]
    assert display["controls"] == ["resume", "pause", "cancel"]
    assert shown["queue"]["parkReason"] == "serverCrashLoop"


def test_rule_4_a_checkpoint_wait_is_waiting_on_the_completed_checkpoint(db: Database) -> None:
    claim = running(db)
    _start(db, claim, "a1", "ask", "checkpoint")
    with db.write() as tx:
        finish_node_attempt(tx, claim, attempt_id="a1", output={"summary": "Ship it?"})

        def decide(tx: Any) -> None:
            open_checkpoint_decision(tx, "run-1", attempt_id="a1", node_path="ask", request={})

        wait_run(tx, claim, reason="checkpoint", change=decide)
    display = view(db)["display"]
    assert display["status"] == "waiting"
    assert display["waitingOn"] == "ask" and "currentNode" not in display
    assert display["controls"] == ["answer", "pause", "cancel"]
    assert display["reasonText"] == "Waiting for an answer at a checkpoint."


def test_rule_5_a_live_runner_is_running_at_its_unfinished_attempt(db: Database) -> None:
    claim = running(db)
    _start(db, claim, "a1", "work", "compute")
    display = view(db)["display"]
    assert display["status"] == "running"
    assert display["currentNode"] == "work"
    assert display["controls"] == ["pause", "cancel"]
    assert "reason" not in display


def test_rule_6_admitted_work_not_started_is_queued(db: Database) -> None:
    enqueue(db)
    shown = view(db)
    assert shown["display"]["status"] == "queued"
    assert shown["display"]["activity"] is None
    queue = shown["queue"]
    assert set(queue) == {"state", "kind", "priority", "enqueuedAt"}
    assert (queue["state"], queue["kind"]) == ("queued", "workflow")
    assert "private input" not in str(shown["queue"]), "queue metadata only, never the input"
    assert shown["state"]["input"] == {"value": {"topic": "private input"}}


def test_rule_4_a_parked_interactive_step_is_waiting_on_its_unfinished_attempt(
    db: Database,
) -> None:
    enqueue(db, **INTERACTIVE)
    claim = launch(db, epoch="run-1-e1")
    with db.write() as tx:
        mark_runner_live(tx, claim, runner_epoch="run-1-e1", pid=4242, process_start_time=7)
    _start(db, claim, "a1", "draft", "agent")
    with db.write() as tx:
        request_interaction(
            tx, claim, attempt_id="a1", request_id="req-1", kind="agent", contract={}
        )
        wait_run(tx, claim, reason="interaction", attempt_id="a1")
    shown = view(db)
    display = shown["display"]
    assert display["status"] == "waiting"
    assert display["waitingOn"] == "draft" and "currentNode" not in display
    assert display["request"] == {"kind": "agent", "node": "draft"}
    assert display["controls"] == ["submit", "update", "pause", "cancel"]
    assert shown["executionMode"] == "interactive"
    assert shown["trace"]["items"][0]["outcome"] == "waiting"


@pytest.mark.parametrize(
    ("reason", "code", "action"),
    [
        ("nodeFailed: ask: piUnavailable: no pi on PATH", "piUnavailable", "PI_WORKFLOWS_PI"),
        ("nodeFailed: ask: agentUnproductive: 3 turns", "agentUnproductive", "prompt"),
        ("nodeFailed: boom: RuntimeError: x", "nodeFailed", "traceback"),
        ("resourceLimit: big: over 64 MiB", "resourceLimit", "limits"),
    ],
)
def test_a_failed_run_names_its_nodes_own_reason_in_words(
    db: Database, reason: str, code: str, action: str
) -> None:
    enqueue(db)
    failure = FailureClass.RESOURCE_LIMIT if code == "resourceLimit" else FailureClass.NODE_FAILED
    with db.write() as tx:
        fail_run(tx, "run-1", failure_class=failure, reason=reason)
    display = view(db)["display"]
    assert display["status"] == "failed" and "reason" not in display
    assert display["reasonCode"] == code
    assert display["reasonText"] == reason, "a terminal run shows its stored reason"
    assert action in display["action"]
