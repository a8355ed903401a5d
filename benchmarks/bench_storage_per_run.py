"""What one finished 3-compute-node run leaves in the state database, and what it writes.

A real `server run` process and `WorkflowClient` run the `three` workflow of
bench_runs.py (compute nodes a -> b -> c, each returning a small dict) one run at a
time. Before each measured run this process checkpoints the WAL (`TRUNCATE`, from its
own connection); after the run has completed and its runner epoch has ended it reads
the WAL file: its frames are the pages that run wrote, its commit frames the
transactions. Used bytes per table and index come from the `dbstat` virtual table
(page size less unused bytes), compared before the first and after the last measured
run, and divided by the runs.

Reference: DBOS keeps about 1.2 KB per finished 3-step workflow in its SQLite system
database (issue 30's measure); the target is at most 3x that. The reference is a
constant here because DBOS is optional (the `bench` extra); bench_runs.py runs it.
Run: .venv/bin/python benchmarks/bench_storage_per_run.py [--runs 20]
"""

from __future__ import annotations

import argparse
import sqlite3
import struct
import tempfile
import time
from pathlib import Path

from _server import workflow_server
from bench_runs import THREE_WORKFLOW, Runner

DBOS_BYTES_PER_RUN = 1200  # issue 30: DBOS's system database per finished 3-step workflow
TARGET_RATIO = 3.0
WAL_HEADER = 32
FRAME_HEADER = 24
SETTLE_TIMEOUT_S = 30.0
CHECKPOINT_TIMEOUT_S = 10.0


def used_by_name(db: sqlite3.Connection) -> dict[str, int]:
    """Used bytes (page size less unused) of every table and index, from `dbstat`."""
    rows = db.execute("SELECT name, sum(pgsize) - sum(unused) FROM dbstat GROUP BY name")
    return {name: int(used) for name, used in rows}


def truncate_wal(db: sqlite3.Connection) -> None:
    """Checkpoint the whole WAL and empty it (retried while the server holds a snapshot)."""
    deadline = time.monotonic() + CHECKPOINT_TIMEOUT_S
    while True:
        busy, _log, _done = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy == 0:
            return
        if time.monotonic() > deadline:
            raise TimeoutError("the WAL could not be checkpointed")
        time.sleep(0.01)


def wal_frames(wal: Path) -> tuple[int, int, int]:
    """(frames, commit frames, page size) of the WAL's current generation (its salts)."""
    data = wal.read_bytes() if wal.exists() else b""
    if len(data) < WAL_HEADER:
        return 0, 0, 0
    page_size = struct.unpack(">I", data[8:12])[0]
    salts = data[16:24]
    frames = commits = 0
    offset = WAL_HEADER
    while offset + FRAME_HEADER + page_size <= len(data):
        header = data[offset : offset + FRAME_HEADER]
        if header[8:16] != salts:  # a frame left over from an earlier generation
            break
        frames += 1
        if struct.unpack(">I", header[4:8])[0] != 0:  # database size set: a commit frame
            commits += 1
        offset += FRAME_HEADER + page_size
    return frames, commits, page_size


def wait_runner_ended(db: sqlite3.Connection, run_id: str) -> None:
    """Wait until every runner epoch of the run has its terminal outcome recorded."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    query = "SELECT count(*) FROM runner_epochs WHERE run_id = ? AND finished_at IS NULL"
    while db.execute(query, (run_id,)).fetchone()[0]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the runner of {run_id} did not end")
        time.sleep(0.01)


def measure(folder: Path, runs: int) -> tuple[dict[str, int], int, int, int]:
    """(used-bytes growth by name, WAL frames, commits, page size) over `runs` runs."""
    state_dir = folder / "agent" / "workflows"
    project = folder / "project"
    (project / ".pi" / "workflows").mkdir(parents=True)
    (project / ".pi" / "workflows" / "three.workflow.py").write_text(THREE_WORKFLOW)
    with workflow_server(state_dir, ["--max-workers", "1"]):
        database = state_dir / "state.sqlite"
        db = sqlite3.connect(database, isolation_level=None, timeout=10)
        runner = Runner(state_dir, project, "storage")
        try:
            # The first run stores what every later run shares (the definition snapshot).
            warm = runner.start()
            runner.wait(warm, 0.005)
            wait_runner_ended(db, warm)
            truncate_wal(db)
            before = used_by_name(db)
            frames = commits = page_size = 0
            for _ in range(runs):
                truncate_wal(db)
                run_id = runner.start()
                if runner.wait(run_id, 0.005) != "completed":
                    raise RuntimeError(f"run {run_id} did not complete")
                wait_runner_ended(db, run_id)
                more, done, page_size = wal_frames(database.with_name(database.name + "-wal"))
                frames += more
                commits += done
            truncate_wal(db)
            after = used_by_name(db)
        finally:
            runner.close()
            db.close()
    growth = {name: after.get(name, 0) - before.get(name, 0) for name in after | before}
    return growth, frames, commits, page_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="piw-bench-storage-") as folder:
        growth, frames, commits, page_size = measure(Path(folder), args.runs)
    runs = args.runs
    print(f"{runs} finished 3-compute-node runs, one at a time")
    print("used bytes per run by table and index (dbstat growth / runs):")
    for name, grown in sorted(growth.items(), key=lambda item: -item[1]):
        if grown:
            print(f"  {name:<48} {grown / runs:>9.0f}")
    total = sum(growth.values()) / runs
    print(f"  {'total':<48} {total:>9.0f}")
    print(f"commits per run: {commits / runs:.1f}")
    print(f"WAL pages per commit: {frames / max(commits, 1):.1f}")
    print(f"WAL bytes per run: {frames * (page_size + FRAME_HEADER) / runs:.0f}")
    ratio = total / DBOS_BYTES_PER_RUN
    print(
        f"bytes per run / DBOS reference ({DBOS_BYTES_PER_RUN} B): {ratio:.2f}"
        f" (target <= {TARGET_RATIO:.0f})"
    )


if __name__ == "__main__":
    main()
