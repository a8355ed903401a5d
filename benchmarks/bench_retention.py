"""Automatic retention sweep throughput: expired trees deleted per second, in one run.

What is measured: a state database seeded (storage API, manual clock) with N completed
root runs 31 days old, each with an attempt, an output blob, events and a runner epoch,
plus one recent run. A real embedded server starts on it (manual clock, no runner
execution); its startup sweep selects the N trees and deletes them one per transaction,
collects their blobs and truncates the WAL (no VACUUM: its cost is the file's, not
the trees'). Reported:

- **sweep**: from the end of `start()` (the sweep is requested then) until `state.status`
  shows the completed sweep, polled every 5 ms; trees per second and ms per tree;
- **empty transaction**: the mean round trip of a unit that opens a write and writes
  nothing, through the same database actor (`call_database`), 200 times; and of one that
  writes (so it commits, with its fsync);
- the ratio of one tree's cost (the whole sweep over its trees) to each.

Run: `.venv/bin/python -m benchmarks.bench_retention [N]` (default 2,000).
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.storage import DAY_MS, Database, ManualClock, put_blob
from pi_workflows.testing import CallUnit, perform_with_calls
from tests.server.retention_seed import seed_expired_trees

NOW = 1_800_000_000_000


def _empty(db: Database) -> None:
    with db.write():
        pass


def _one_write(db: Database) -> None:
    """A transaction that writes and so commits (a blob stored and deleted again)."""
    with db.write() as tx:
        digest = put_blob(tx, b"bench-retention-scratch")
        tx.execute("DELETE FROM blobs WHERE digest = :d", {"d": digest})


def _mean_ms(server: WorkflowServer, fn: Any) -> float:
    rounds = []
    for _ in range(200):
        begun = time.perf_counter()
        server.call_database(CallUnit(fn))
        rounds.append(time.perf_counter() - begun)
    return statistics.mean(rounds) * 1000


def _sweep_seconds(server: WorkflowServer, started: float) -> tuple[float, dict[str, Any]]:
    with WorkflowClient(server.state_dir, autostart=False, timeout=60) as client:
        while True:
            retention = client.call("state.status")["receipt"]["retention"]
            if retention["lastSweep"] is not None:
                return time.perf_counter() - started, dict(retention["lastSweep"])
            time.sleep(0.005)


def main(count: int) -> None:
    # Deletion and blob collection only: a VACUUM of the whole file is not per tree.
    os.environ["PI_WORKFLOWS_RETENTION_VACUUM_MIN_BYTES"] = str(1 << 62)
    root = Path(tempfile.mkdtemp(prefix="piw-bench-"))
    try:
        state = root / "state"
        seeded = time.perf_counter()
        seed_expired_trees(state, count, now_ms=NOW)
        print(f"seeded {count} expired trees in {time.perf_counter() - seeded:.1f} s")
        server = WorkflowServer(
            state,
            idle_exit_s=None,
            tick_s=0.05,
            execute_runs=False,
            units=perform_with_calls,
            clock=ManualClock(NOW + DAY_MS),
        )
        server.start()
        try:
            started = time.perf_counter()
            seconds, last = _sweep_seconds(server, started)
            empty_ms = _mean_ms(server, _empty)
            write_ms = _mean_ms(server, _one_write)
        finally:
            server.stop()
        per_tree_ms = seconds * 1000 / max(1, last["treesDeleted"])
        print(
            f"sweep: {last['treesDeleted']} trees ({last['runsDeleted']} runs, "
            f"{last['blobsDeleted']} blobs) in {seconds:.2f} s = "
            f"{last['treesDeleted'] / seconds:.0f} trees/s, {per_tree_ms:.2f} ms per tree; "
            f"vacuumed {last['vacuumed']}"
        )
        print(
            f"empty transaction: {empty_ms:.3f} ms, one committed write: {write_ms:.3f} ms; "
            f"one tree costs {per_tree_ms / empty_ms:.1f}x an empty transaction, "
            f"{per_tree_ms / write_ms:.1f}x a committed one"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
