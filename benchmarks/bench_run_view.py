"""One run view (`run.get`'s `pi-workflows.run-view.v1`) in a big database against a small one.

Issue 13 target (the run-view half): one run view with 100,000 runs and 1,000,000
events costs at most 1.5x the same view with 100 runs. Both databases hold the same
measured run (40 attempts, a failed node with a stored traceback, a restart), built
through the storage transitions; the big one adds filler runs and events with bulk
inserts. `build_run_view` runs in one read transaction, as the reader actor runs it.
Prints the median and p99 of each and their ratio.

Run: .venv/bin/python benchmarks/bench_run_view.py [--runs 100000] [--events 1000000]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from pi_workflows.domain._run_view import build_run_view
from pi_workflows.storage import (
    Database,
    NewRun,
    claim_for_launch,
    complete_run,
    enqueue_run,
    fail_node_attempt,
    finish_node_attempt,
    mark_runner_live,
    open_database,
    put_traceback,
    start_node_attempt,
)

SAMPLES = 300
ATTEMPTS = 40
RUN_ID = "run-measured"


def _new_run(run_id: str, **fields: object) -> NewRun:
    return NewRun(
        run_id=run_id,
        workflow_name="bench",
        project_path="/project",
        source_identity={"root": {"kind": "file", "path": "/p/bench.workflow.py", "hash": "h"}},
        definition_digest="sha256:def",
        input_hash="sha256:input",
        input={"n": 1},
        **fields,  # type: ignore[arg-type]
    )


def _measured_run(db: Database) -> None:
    with db.write() as tx:
        enqueue_run(tx, _new_run(RUN_ID))
        launch = claim_for_launch(
            tx, RUN_ID, owner_id="srv", runner_epoch="e1", launch_envelope_hash="h"
        )
        claim = launch.claim
        mark_runner_live(tx, claim, runner_epoch="e1", pid=2, process_start_time=2)
    for number in range(ATTEMPTS):
        with db.write() as tx:
            attempt = f"a{number}"
            start_node_attempt(
                tx, claim, attempt_id=attempt, node_path=f"n{number % 7}", node_type="compute"
            )
            if number % 10 == 9:
                ref = put_traceback(tx, RUN_ID, "Traceback (most recent call last):\n" * 20)
                fail_node_attempt(
                    tx,
                    claim,
                    attempt_id=attempt,
                    error="nodeFailed: boom",
                    payload={"traceback": ref},
                )
            else:
                finish_node_attempt(tx, claim, attempt_id=attempt, output={"i": number})
    with db.write() as tx:
        complete_run(tx, RUN_ID, claim=claim, payload={"output": {"done": True}})
        enqueue_run(tx, _new_run("run-restart", restart_of=RUN_ID))


def _filler(db: Database, runs: int, events: int) -> None:
    """Bulk filler: `runs` queued runs with `events` events in all (spread evenly)."""
    per_run = max(1, events // max(runs, 1))
    batch = 5_000
    for start in range(0, runs, batch):
        with db.write() as tx:
            for index in range(start, min(start + batch, runs)):
                enqueue_run(tx, _new_run(f"run-{index:07d}"))
            rows = [
                (f"run-{index:07d}", revision, "node_started", 0, "{}", 0)
                for index in range(start, min(start + batch, runs))
                for revision in range(2, per_run + 1)
            ]
            tx.connection.executemany(
                "INSERT INTO events (run_id, revision, event_type, generation, payload,"
                " recorded_at) VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )


def _measure(db: Database) -> list[float]:
    times = []
    for _ in range(SAMPLES):
        began = time.perf_counter()
        view = build_run_view(db, RUN_ID)
        times.append(time.perf_counter() - began)
        assert view is not None and view["trace"]["count"] == ATTEMPTS
    return times


def _p99(times: list[float]) -> float:
    return sorted(times)[int(len(times) * 0.99) - 1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        results = {}
        for label, runs, events in (("small", 100, 1_000), ("big", args.runs, args.events)):
            db = open_database(Path(folder) / label / "state.sqlite")
            try:
                began = time.perf_counter()
                _filler(db, runs, events)
                _measured_run(db)
                built = time.perf_counter() - began
                times = _measure(db)
            finally:
                db.close()
            results[label] = times
            print(
                f"{label:>5}: {runs} runs, ~{events} events (built in {built:.1f} s): "
                f"median {statistics.median(times) * 1e3:.3f} ms, p99 {_p99(times) * 1e3:.3f} ms"
            )
        ratio = statistics.median(results["big"]) / statistics.median(results["small"])
        p99 = _p99(results["big"]) / _p99(results["small"])
        print(f"ratio big/small: median {ratio:.2f}x, p99 {p99:.2f}x (target <= 1.5x)")


if __name__ == "__main__":
    main()
