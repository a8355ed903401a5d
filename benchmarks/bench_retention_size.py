"""The database file after a sweep and `VACUUM`, against a fresh one of the retained runs.

What is measured: a state database seeded (storage API, manual clock) with E expired
root runs (31 days old) and K retained ones (one day old), each completed with an
attempt, a unique ~20 KB output blob, events and a runner epoch, every other one after
a failed attempt with its stored traceback. A real embedded server starts on it (manual
clock, no runner execution, the VACUUM threshold at 0 bytes), sweeps after recovery and
compacts; it is stopped (the WAL checkpointed). A second state folder is seeded with the
same K retained runs only, and a server is started and stopped on it the same way (no
sweep: nothing is old enough). Reported: both files' sizes and page counts, and the
ratio.

Target (issue 26): the swept and vacuumed file <= 1.2x the fresh one.

Run: `.venv/bin/python -m benchmarks.bench_retention_size [E] [K]` (default 20,000 and
2,000).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.storage import DAY_MS, ManualClock, open_database
from tests.storage.test_prune import _finished_run

NOW = 1_800_000_000_000


def _seed(state: Path, expired: int, kept: int) -> None:
    state.mkdir(parents=True)
    clock = ManualClock(NOW - 31 * DAY_MS)
    db = open_database(state / "state.sqlite", clock=clock)
    try:
        for i in range(expired):
            output: dict[str, object] = {"i": i, "pad": f"e{i:07d}" * 2500}
            _finished_run(db, f"exp-{i}", output, failing=i % 2 == 1)
        clock.set(NOW - DAY_MS)
        for i in range(kept):
            output = {"i": i, "pad": f"k{i:07d}" * 2500}
            _finished_run(db, f"keep-{i}", output, failing=i % 2 == 1)
    finally:
        db.close()


def _serve_once(state: Path) -> dict[str, Any] | None:
    """Start a server, wait for its startup sweep (if any) to complete, stop it."""
    server = WorkflowServer(
        state, idle_exit_s=None, tick_s=0.05, execute_runs=False, clock=ManualClock(NOW)
    )
    server.start()
    try:
        with WorkflowClient(state, autostart=False, timeout=600) as client:
            while True:
                retention = client.call("state.status")["receipt"]["retention"]
                if retention["lastSweep"] is not None and retention["state"] == "idle":
                    return dict(retention["lastSweep"])
                time.sleep(0.05)
    finally:
        server.stop()


def _file(state: Path) -> tuple[int, int]:
    """Bytes (the database and any WAL beside it) and pages."""
    path = state / "state.sqlite"
    wal = Path(f"{path}-wal")
    size = path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
    conn = sqlite3.connect(path.as_uri() + "?mode=ro", uri=True)
    try:
        pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
    finally:
        conn.close()
    return size, pages


def main(expired: int, kept: int) -> None:
    os.environ["PI_WORKFLOWS_RETENTION_DAYS"] = "30"
    os.environ["PI_WORKFLOWS_RETENTION_VACUUM_MIN_BYTES"] = "0"
    root = Path(tempfile.mkdtemp(prefix="piw-bench-"))
    try:
        swept, fresh = root / "swept" / "state", root / "fresh" / "state"
        began = time.perf_counter()
        _seed(swept, expired, kept)
        _seed(fresh, 0, kept)
        print(
            f"seeded {expired} expired and {kept} retained runs in "
            f"{time.perf_counter() - began:.1f} s"
        )
        before = _file(swept)
        last = _serve_once(swept)
        _serve_once(fresh)
        after, reference = _file(swept), _file(fresh)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert last is not None
    print(
        f"sweep: {last['treesDeleted']} trees deleted, vacuumed {last['vacuumed']}; "
        f"file {before[0] / 2**20:.1f} MiB ({before[1]} pages) before"
    )
    print(
        f"after sweep + VACUUM: {after[0] / 2**20:.2f} MiB ({after[1]} pages); fresh with the "
        f"retained runs only: {reference[0] / 2**20:.2f} MiB ({reference[1]} pages); "
        f"ratio {after[0] / reference[0]:.3f}x (target <= 1.2x)"
    )


if __name__ == "__main__":
    arguments = [int(value) for value in sys.argv[1:3]]
    main(*(arguments + [20_000, 2_000][len(arguments) :]))
