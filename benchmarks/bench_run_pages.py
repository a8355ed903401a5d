"""A run view and its `view.page` windows for a long history against a short one.

Issue 13 items 2 and 5: the server counts a history first and reads only the selected
range, so one view or one page of a run with 30,000 attempts should cost about what it
costs for 300 (LIMIT/OFFSET still walks the skipped index entries, which is cheap but
not free). Both runs are built through the storage transitions in one database;
`build_run_view` and `run_page` run in one read transaction each, as the reader actor
runs them. Prints medians and the ratio of each long history to the 300-attempt one.

Run: .venv/bin/python benchmarks/bench_run_pages.py [--long 30000]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pi_workflows.domain._run_view import build_run_view
from pi_workflows.domain._view_pages import run_page
from pi_workflows.storage import (
    Database,
    NewRun,
    claim_for_launch,
    enqueue_run,
    finish_node_attempt,
    mark_runner_live,
    open_database,
    start_node_attempt,
)

SAMPLES = 100
SHORT = 300


def _history(db: Database, run_id: str, attempts: int) -> None:
    with db.write() as tx:
        enqueue_run(
            tx,
            NewRun(
                run_id=run_id,
                workflow_name="bench",
                project_path="/project",
                source_identity={"root": {"kind": "file", "path": "/p/b.workflow.py", "hash": "h"}},
                definition_digest="sha256:def",
                input_hash="sha256:input",
                input={"n": 1},
            ),
        )
        claim = claim_for_launch(
            tx, run_id, owner_id="srv", runner_epoch=f"{run_id}-e", launch_envelope_hash="h"
        ).claim
        mark_runner_live(tx, claim, runner_epoch=f"{run_id}-e", pid=2, process_start_time=2)
    for first in range(0, attempts, 1000):
        with db.write() as tx:
            for number in range(first, min(first + 1000, attempts)):
                attempt = f"{run_id}-a{number}"
                start_node_attempt(
                    tx, claim, attempt_id=attempt, node_path=f"n{number % 7}", node_type="compute"
                )
                finish_node_attempt(
                    tx, claim, attempt_id=attempt, output={"i": number}, next_node_path="n0"
                )


def _median(db: Database, work: Callable[[], Any]) -> float:
    for _ in range(5):  # warm the page cache and the statement cache first
        with db.read():
            work()
    times = []
    for _ in range(SAMPLES):
        began = time.perf_counter()
        with db.read():
            work()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def _costs(db: Database, run_id: str, attempts: int) -> dict[str, float]:
    middle = f"{run_id}-a{attempts // 2}"
    return {
        "run view": _median(db, lambda: build_run_view(db, run_id)),
        "newest page": _median(db, lambda: run_page(db, run_id, {"list": "trace", "revision": 1})),
        "oldest page": _median(
            db, lambda: run_page(db, run_id, {"list": "trace", "cursor": "trace>0", "revision": 1})
        ),
        "step-centred page": _median(
            db,
            lambda: run_page(db, run_id, {"list": "trace", "attemptId": middle, "revision": 1}),
        ),
        "graphSteps page": _median(
            db, lambda: run_page(db, run_id, {"list": "graphSteps", "revision": 1})
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--long", type=int, default=30_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        db = open_database(Path(folder) / "state.sqlite")
        try:
            sizes = (SHORT, 3_000, args.long)
            for size in sizes:
                _history(db, f"run-{size}", size)
            results = {size: _costs(db, f"run-{size}", size) for size in sizes}
        finally:
            db.close()
    for measure, base in results[SHORT].items():
        ratios = ", ".join(
            f"{size} attempts {results[size][measure] / base:.2f}x" for size in sizes[1:]
        )
        print(f"{measure:>18}: {SHORT} attempts {base * 1e3:.2f} ms; {ratios}")


if __name__ == "__main__":
    main()
