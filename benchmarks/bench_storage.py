"""Protected writes per second against raw single-row INSERT commits per second.

Measures workflow-server.md § Claim rules' protected write (claim check and renewal, one
domain change, event, revision; one `BEGIN IMMEDIATE` transaction each) against the
floor: one single-row INSERT per transaction, same pragmas (WAL, synchronous=FULL), on
real files in the same folder, interleaved in rounds so disk drift hits all alike.

The headline change is one single-row UPDATE (a node attempt's deadline), so the ratio
isolates what protection costs. A second variant stores a new content-addressed blob
as its change (a row plus its digest index: two more b-tree pages per commit).

Run: `.venv/bin/python benchmarks/bench_storage.py [--ops N] [--rounds R] [--dir DIR]`.
Target: protected rate >= 0.7 x raw rate.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from pi_workflows.storage import (
    Claim,
    Database,
    NewRun,
    Tx,
    claim_for_launch,
    enqueue_run,
    mark_runner_live,
    open_database,
    protected_write,
    put_blob,
    start_node_attempt,
)

TARGET_RATIO = 0.7

# The raw floor: a table shaped like a small event row, one INSERT per commit.
RAW_DDL = "CREATE TABLE raw (id INTEGER PRIMARY KEY, payload TEXT NOT NULL, at INTEGER NOT NULL)"
RAW_INSERT = "INSERT INTO raw (payload, at) VALUES (?, ?)"
# The headline protected write's domain change: one existing row, one page.
EXTEND_DEADLINE = (
    "UPDATE node_attempts SET deadline_at = :deadline_at WHERE attempt_id = :attempt_id"
)
ATTEMPT_ID = "bench-attempt"


def open_raw(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute(RAW_DDL)
    return conn


def raw_round(conn: sqlite3.Connection, ops: int, start: int) -> float:
    began = time.perf_counter()
    for i in range(start, start + ops):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(RAW_INSERT, (f'{{"i":{i}}}', i))
        conn.execute("COMMIT")
    return ops / (time.perf_counter() - began)


def prepare_protected(db: Database) -> Claim:
    with db.write() as tx:
        enqueue_run(
            tx,
            NewRun(
                run_id="bench-run",
                workflow_name="bench",
                project_path="/bench",
                source_identity={"root": {"kind": "builtin"}},
                definition_digest="sha256:bench",
                input_hash="sha256:bench",
                input={},
            ),
        )
        launch = claim_for_launch(
            tx, "bench-run", owner_id="bench", runner_epoch="epoch-1", launch_envelope_hash="h"
        )
        mark_runner_live(
            tx, launch.claim, runner_epoch="epoch-1", pid=None, process_start_time=None
        )
        start_node_attempt(
            tx, launch.claim, attempt_id=ATTEMPT_ID, node_path="bench", node_type="compute"
        )
    return launch.claim


def protected_round(db: Database, claim: Claim, ops: int, start: int) -> float:
    began = time.perf_counter()
    for i in range(start, start + ops):
        params = {"deadline_at": i, "attempt_id": ATTEMPT_ID}

        def extend(tx: Tx, params: dict[str, object] = params) -> None:
            tx.execute(EXTEND_DEADLINE, params)

        with db.write() as tx:
            protected_write(tx, claim, event_type="node_update", payload={"i": i}, change=extend)
    return ops / (time.perf_counter() - began)


def protected_blob_round(db: Database, claim: Claim, ops: int, start: int) -> float:
    began = time.perf_counter()
    for i in range(start, start + ops):
        data = f'{{"i":{i}}}'.encode()

        def store(tx: Tx, data: bytes = data) -> None:
            put_blob(tx, data)

        with db.write() as tx:
            protected_write(tx, claim, event_type="node_update", payload={"i": i}, change=store)
    return ops / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1000, help="transactions per round")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds")
    parser.add_argument("--dir", type=Path, default=None, help="folder for the database files")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-storage-") as folder:
        raw = open_raw(Path(folder) / "raw.sqlite")
        db = open_database(Path(folder) / "state.sqlite")
        claim = prepare_protected(db)
        raw_round(raw, 50, 0)  # warm both files and caches
        protected_round(db, claim, 50, 0)
        raw_rates: list[float] = []
        protected_rates: list[float] = []
        blob_rates: list[float] = []
        for n in range(args.rounds):
            start = 1_000 + n * args.ops
            raw_rates.append(raw_round(raw, args.ops, start))
            protected_rates.append(protected_round(db, claim, args.ops, start))
            blob_rates.append(protected_blob_round(db, claim, args.ops, start))
        raw.close()
        db.close()

    raw_rate = statistics.median(raw_rates)
    protected_rate = statistics.median(protected_rates)
    blob_rate = statistics.median(blob_rates)
    ratio = protected_rate / raw_rate
    verdict = "meets" if ratio >= TARGET_RATIO else "MISSES"
    print(f"raw single-row INSERT commits:    {raw_rate:9.1f} /s (median of {args.rounds} rounds)")
    print(f"protected writes, one-row change: {protected_rate:9.1f} /s")
    print(
        f"protected writes, new blob:       {blob_rate:9.1f} /s (ratio {blob_rate / raw_rate:.2f})"
    )
    print(f"ratio protected/raw:              {ratio:9.2f} ({verdict} target {TARGET_RATIO})")


if __name__ == "__main__":
    main()
