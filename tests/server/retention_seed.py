"""Seed a state database with expired run trees before a server starts (retention tests).

Runs reach their states through the storage transitions a live server uses, on a manual
clock set in the past, so the trees are as old as the test needs.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from pi_workflows.storage import DAY_MS, ManualClock, open_database
from tests.storage.test_prune import _finished_run

__all__ = ["assert_whole_trees", "run_files", "seed_expired_trees"]


def seed_expired_trees(
    state_dir: Path, count: int, *, now_ms: int, days_old: int = 31, pad_chars: int = 20_000
) -> None:
    """`count` completed root runs `exp-<i>` finished `days_old` days before `now_ms`, each
    with a unique output blob of about `pad_chars` bytes (so deleting them frees pages),
    every other one after a failed attempt with its stored traceback; and one run
    `recent` finished a day ago."""
    state_dir.mkdir(parents=True, exist_ok=True)
    clock = ManualClock(now_ms - days_old * DAY_MS)
    db = open_database(state_dir / "state.sqlite", clock=clock)
    # No fsync per seeded transaction: nothing runs on this file until it is closed, and
    # a crash while seeding fails the test anyway (thousands of runs seed in seconds).
    db.connection.execute("PRAGMA synchronous = OFF")
    try:
        for i in range(count):
            output: dict[str, object] = {"i": i, "pad": f"{i:04d}" * (pad_chars // 4)}
            _finished_run(db, f"exp-{i}", output, failing=i % 2 == 1)
        clock.set(now_ms - DAY_MS)
        _finished_run(db, "recent", {"recent": True}, failing=False)
    finally:
        db.close()
    for run_id in [f"exp-{i}" for i in range(count)] + ["recent"]:
        (state_dir / "pi" / run_id / f"{run_id}-a1").mkdir(parents=True)
        (state_dir / "logs" / "runners").mkdir(parents=True, exist_ok=True)
        (state_dir / "logs" / "runners" / f"{run_id}-e1.log").write_text("runner log")


def run_files(state_dir: Path) -> set[str]:
    """The runs that still have a pi folder or a runner log (by the seed's names)."""
    folders = {p.name for p in (state_dir / "pi").iterdir()}
    logs = {p.name.removesuffix("-e1.log") for p in (state_dir / "logs" / "runners").iterdir()}
    return folders | logs


_PER_RUN = ("node_attempts", "events", "run_queue", "runner_epochs")


def assert_whole_trees(db: sqlite3.Connection) -> None:
    """No tree is half-deleted: every run has its rows, and no row outlives its run."""
    runs = {row[0] for row in db.execute("SELECT run_id FROM runs")}
    for table in _PER_RUN:
        owners = {row[0] for row in db.execute(f"SELECT DISTINCT run_id FROM {table}")}
        assert owners <= runs, f"{table} rows outlive their run"
        if table != "events":
            assert runs <= owners, f"a run lost its {table} rows"
    assert db.execute("PRAGMA foreign_key_check").fetchall() == []
