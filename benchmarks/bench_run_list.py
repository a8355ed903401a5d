"""The first run-list page with 100,000 runs against the same with 100 runs, in one run.

Measures `run_list_page` (what `run.list` and the run-list subscription read: the
revision and one keyset page of status and source facts) on real database files:
unfiltered, filtered by a workflow that 1 in 100 runs has, and by a project that
1 in 100 runs has, plus the last page reached by cursor (100 runs a page). The same reads on a 100-run
database are the baseline. Issue 13's target for the first page (with one run view,
measured elsewhere): <= 1.5x. "revision alone" and "page alone" split the first page:
the keyset page reads O(page) rows, but today's revision is `sum(revision)` over every
run (storage/_reads.py `run_list_revision`), O(runs); a counter kept by the database
(a schema change) would make the whole read O(page).

Run: .venv/bin/python benchmarks/bench_run_list.py [--runs N] [--samples S]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pi_workflows.server._operations import _summary_item
from pi_workflows.server._run_list import RunListQuery, run_list_page
from pi_workflows.storage import (
    Database,
    NewRun,
    RunListFilter,
    enqueue_run,
    list_runs_filtered,
    open_database,
    run_list_revision,
)

BATCH = 5000
TARGET = 1.5


def populate(db: Database, runs: int) -> None:
    """`runs` queued runs; every 100th is of workflow `rare` in project `/rare`."""
    for start in range(0, runs, BATCH):
        with db.write() as tx:
            for i in range(start, min(runs, start + BATCH)):
                rare = i % 100 == 0
                enqueue_run(
                    tx,
                    NewRun(
                        run_id=f"run-{i:08}",
                        workflow_name="rare" if rare else "common",
                        project_path="/rare" if rare else "/common",
                        source_identity={"root": {"kind": "builtin"}},
                        definition_digest="sha256:bench",
                        input_hash="sha256:bench",
                        input={"i": i, "padding": "x" * 200},
                    ),
                )


def timed(read: Callable[[], Any], samples: int) -> float:
    """Median seconds of `read` in one read transaction each."""
    durations = []
    for _ in range(samples):
        began = time.perf_counter()
        read()
        durations.append(time.perf_counter() - began)
    return statistics.median(durations)


def last_cursor(db: Database, query: RunListQuery) -> str | None:
    cursor = None
    while True:
        _, page = run_list_page(db, RunListQuery(query.run_filter, 100, cursor), _summary_item)
        if "nextCursor" not in page:
            return cursor
        cursor = page["nextCursor"]


def measure(folder: Path, runs: int, samples: int) -> dict[str, float]:
    db = open_database(folder / "state.sqlite")
    try:
        populate(db, runs)
        queries = {
            "first page": RunListQuery(),
            "workflow filter (1%)": RunListQuery(RunListFilter(workflow="rare")),
            "project filter (1%)": RunListQuery(RunListFilter(project="/rare")),
        }
        results = {}
        for name, query in queries.items():

            def read(query: RunListQuery = query) -> Any:
                with db.read() as reader:
                    return run_list_page(reader, query, _summary_item)

            results[name] = timed(read, samples)
        last = RunListQuery(cursor=last_cursor(db, RunListQuery()))

        def read_last() -> Any:
            with db.read() as reader:
                return run_list_page(reader, last, _summary_item)

        results["last page by cursor"] = timed(read_last, samples)
        results["revision alone"] = timed(lambda: run_list_revision(db), samples)
        results["page alone"] = timed(
            lambda: list_runs_filtered(db, RunListFilter(), limit=101), samples
        )
        return results
    finally:
        db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=30)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="piw-bench-list-"))
    try:
        (root / "small").mkdir()
        (root / "big").mkdir()
        small = measure(root / "small", 100, args.samples)
        big = measure(root / "big", args.runs, args.samples)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"run-list page reads, {args.runs} runs against 100 runs (median of {args.samples})")
    for name, base in small.items():
        ratio = big[name] / base
        print(f"  {name:<24} {base * 1e3:8.2f} ms -> {big[name] * 1e3:8.2f} ms  = {ratio:6.2f}x")
    ratio = big["first page"] / small["first page"]
    verdict = "meets" if ratio <= TARGET else "misses"
    print(f"first page: {ratio:.2f}x ({verdict} the <= {TARGET}x target)")


if __name__ == "__main__":
    main()
