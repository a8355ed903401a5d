"""The run-list filters drive indexes, and every filter variant returns the right rows.

A filter that few of many runs match must still read about one page: each filter that
is on (status, workflow, project, since/until) appears in the query text only then, so
SQLite searches an index instead of scanning `runs`. The plan is checked for every
variant; the rows are checked against a plain Python filter over a mixed set of runs.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from pi_workflows.domain._display_status import summary_status
from pi_workflows.storage import (
    Database,
    ManualClock,
    RunListFilter,
    cancel_run,
    list_runs_filtered,
    open_database,
    pause_run,
)
from pi_workflows.storage import _queries as q
from tests.storage.storage_helpers import enqueue, running

pytestmark = pytest.mark.timeout(60)

STATUS_SETS: tuple[tuple[str, ...], ...] = (
    (),
    ("failed",),
    ("paused",),
    ("ambiguous",),
    ("running",),
    ("queued",),
    ("waiting",),
    ("paused", "queued"),
    ("ambiguous", "cancelled", "running"),
)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def db(tmp_path: Path, clock: ManualClock) -> Iterator[Database]:
    database = open_database(tmp_path / "state.sqlite", clock=clock)
    try:
        yield database
    finally:
        database.close()


def _variant_sql(flags: tuple[bool, ...], statuses: tuple[str, ...]) -> str:
    drivers = tuple(sorted({d for s in statuses for d in q.DRIVERS_OF_DISPLAY[s]}))
    workflow, project, since, until = flags
    return q.filtered_run_summaries_sql(
        workflow=workflow, project=project, since=since, until=until, drivers=drivers
    )


@pytest.mark.parametrize("statuses", STATUS_SETS)
def test_no_filter_variant_scans_the_runs_table(db: Database, statuses: tuple[str, ...]) -> None:
    params = {
        "before_created_at": 2**62,
        "before_run_id": "",
        "limit": 101,
        "workflow": "w",
        "project": "/p",
        "since": 0,
        "until": 2**40,
        "statuses": json.dumps(list(statuses)),
    }
    for flags in itertools.product((False, True), repeat=4):
        sql = _variant_sql(flags, statuses)
        plan = [str(row[-1]) for row in db.connection.execute("EXPLAIN QUERY PLAN " + sql, params)]
        scans = [step for step in plan if step == "SCAN r" or step.startswith("SCAN r ")]
        assert not scans, (flags, statuses, plan)
        assert any(step.startswith("SEARCH r USING") for step in plan), (flags, statuses, plan)


def test_every_filter_returns_what_a_plain_filter_over_all_runs_returns(
    db: Database, clock: ManualClock
) -> None:
    for i in range(40):
        run_id = f"run-{i:03}"
        if i % 4 == 1:
            running(db, run_id)
        else:
            enqueue(
                db,
                run_id,
                workflow_name="rare" if i % 7 == 0 else "common",
                project_path="/rare" if i % 5 == 0 else "/common",
            )
        if i % 6 == 2:
            with db.write() as tx:
                pause_run(tx, run_id)
        if i % 9 == 3 and i % 4 != 1:
            with db.write() as tx:
                cancel_run(tx, run_id)
        clock.advance(10)
    everything = list_runs_filtered(db, RunListFilter(), limit=100)
    assert len(everything) == 40
    by_id = {row.run_id: row for row in everything}
    middle = everything[20].created_at
    for statuses, workflow, project, since in itertools.product(
        STATUS_SETS, (None, "rare"), (None, "/rare"), (None, middle)
    ):
        run_filter = RunListFilter(
            statuses=statuses or None, workflow=workflow, project=project, since=since
        )
        got = [row.run_id for row in list_runs_filtered(db, run_filter, limit=100)]
        expected = [
            row.run_id
            for row in everything
            if (not statuses or summary_status(by_id[row.run_id]) in statuses)
            and (workflow is None or row.workflow_name == workflow)
            and (since is None or row.created_at >= since)
            and (project is None or _project(db, row.run_id) == project)
        ]
        assert got == expected, run_filter
        # Paged three at a time, the same rows in the same order.
        paged: list[str] = []
        before = None
        while True:
            page = list_runs_filtered(db, run_filter, limit=3, before=before)
            paged += [row.run_id for row in page]
            if len(page) < 3:
                break
            before = (page[-1].created_at, page[-1].run_id)
        assert paged == expected, run_filter


def _project(db: Database, run_id: str) -> str:
    return str(db.fetch_value("SELECT project_path FROM runs WHERE run_id = :r", {"r": run_id}))
