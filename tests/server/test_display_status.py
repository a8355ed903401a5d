"""One display-status rule for the run list and the run view.

The list's item, the list's status filter (SQL) and the view's `display.status` come
from the same rule (domain/_display_status.py). Each case of workflow-server.md § Live
run view is produced through the storage transitions a live server uses, as in
tests/server/test_run_view_rules.py, and the three must agree in each; the SQL form of
the rule must agree with the Python one for every combination of facts.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Callable
from typing import Any

import pytest

from pi_workflows.domain._display_status import StatusFacts, display_status
from pi_workflows.domain._operations import _summary_item
from pi_workflows.domain._run_list import RunListQuery, run_list_page
from pi_workflows.domain._run_view import build_run_view
from pi_workflows.storage import (
    Database,
    RunListFilter,
    RunnerOutcome,
    complete_run,
    finish_node_attempt,
    list_runs_filtered,
    open_checkpoint_decision,
    park_run,
    pause_run,
    record_runner_exit,
    wait_run,
)
from pi_workflows.storage._queries import display_status_sql
from pi_workflows.wire.protocol import DISPLAY_STATUSES
from tests.server.test_run_view_rules import _ambiguous_effect, _start
from tests.storage.storage_helpers import enqueue, running

pytestmark = pytest.mark.timeout(30)


def _terminal_with_effect_and_cleanup(db: Database) -> None:
    claim = running(db)
    _ambiguous_effect(db, claim)
    with db.write() as tx:
        complete_run(tx, "run-1", claim=claim, payload={"output": {"ok": True}})


def _ambiguous_then_paused(db: Database) -> None:
    """The case the list got wrong: paused after its effect became ambiguous, parked
    with no `effectAmbiguous` reason left on the queue row."""
    claim = running(db)
    _ambiguous_effect(db, claim)
    with db.write() as tx:
        park_run(tx, claim, reason="workerCrashed")
        pause_run(tx, "run-1")


def _paused_while_running(db: Database) -> None:
    claim = running(db)
    _start(db, claim, "a1", "work", "compute")
    with db.write() as tx:
        pause_run(tx, "run-1", claim=claim)


def _checkpoint_wait(db: Database) -> None:
    claim = running(db)
    _start(db, claim, "a1", "ask", "checkpoint")
    with db.write() as tx:
        finish_node_attempt(tx, claim, attempt_id="a1", output={"summary": "Ship it?"})

        def decide(tx: Any) -> None:
            open_checkpoint_decision(tx, "run-1", attempt_id="a1", node_path="ask", request={})

        wait_run(tx, claim, reason="checkpoint", change=decide)


def _running(db: Database) -> None:
    claim = running(db)
    _start(db, claim, "a1", "work", "compute")


def _parked(db: Database) -> None:
    claim = running(db)
    with db.write() as tx:
        park_run(tx, claim, reason="serverCrashLoop")
        record_runner_exit(tx, "run-1-e1", outcome=RunnerOutcome.ORPHANED)


def _admitted(db: Database) -> None:
    enqueue(db)


CASES: dict[str, tuple[Callable[[Database], None], str]] = {
    "rule 1: terminal while cleanup runs, with an ambiguous effect": (
        _terminal_with_effect_and_cleanup,
        "completed",
    ),
    "rule 2: ambiguous effect on a paused, parked run": (_ambiguous_then_paused, "ambiguous"),
    "rule 3: durable pause while the runner stops": (_paused_while_running, "paused"),
    "rule 4: checkpoint wait": (_checkpoint_wait, "waiting"),
    "rule 5: live runner at its attempt": (_running, "running"),
    "rule 6: parked resumable work": (_parked, "queued"),
    "rule 6: admitted work not started": (_admitted, "queued"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_list_and_the_view_show_the_same_status(db: Database, case: str) -> None:
    build, expected = CASES[case]
    build(db)
    shown = build_run_view(db, "run-1")
    assert shown is not None
    with db.read() as reader:
        _, page = run_list_page(reader, RunListQuery(), _summary_item)
    (item,) = page["items"]
    assert shown["display"]["status"] == expected
    assert item["display"]["status"] == expected, "the list's item"
    assert item["revision"] == shown["revision"], "one presentation revision"
    for status in DISPLAY_STATUSES:
        found = list_runs_filtered(db, RunListFilter(statuses=(status,)), limit=10)
        assert ([r.run_id for r in found] == ["run-1"]) == (status == expected), status


def test_the_sql_rule_and_the_python_rule_agree_in_every_case() -> None:
    """`display_status_sql` (the list's filter) equals `display_status` for every
    combination of run status, pause flag, queue state, ambiguous effect, runner and open
    origin-session turn."""
    statuses = ("queued", "running", "waiting", "completed", "failed", "timed_out", "cancelled")
    queue_states = (None, "queued", "starting", "running", "parked", "done", "failed")
    sql = "SELECT " + display_status_sql("?1", "?2", "?3", "?4", "?5", turn="?6")
    db = sqlite3.connect(":memory:")
    checked = set()
    try:
        for status, paused, state, ambiguous, runner, turn in itertools.product(
            statuses, (0, 1), queue_states, (0, 1), (0, 1), (0, 1)
        ):
            row = (status, paused, state, ambiguous, runner, turn)
            (from_sql,) = db.execute(sql, row).fetchone()
            facts = StatusFacts(
                status, bool(paused), state, bool(ambiguous), bool(runner), bool(turn)
            )
            assert from_sql == display_status(facts), facts
            checked.add(from_sql)
    finally:
        db.close()
    assert checked == set(DISPLAY_STATUSES)
