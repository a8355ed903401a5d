"""A `VACUUM` that fails for lack of space, in a real server process (conformance 51).

The server runs in a user and mount namespace of its own, with `SQLITE_TMPDIR` on a
28 MiB tmpfs mounted there: its sweep deletes the expired trees, and the compaction's
`VACUUM` (which builds the new file in a temporary database that spills to
`SQLITE_TMPDIR` once it outgrows its page cache) fails with SQLite's "database or disk is
full". The deletions stay committed, the server carries on, and the next inserts reuse
the free pages: the file does not grow. Skipped where no namespace can be made.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient
from pi_workflows.storage import DAY_MS, ManualClock, open_database
from tests.conftest import Processes, write_workflow
from tests.storage.test_prune import _finished_run

pytestmark = pytest.mark.timeout(180)

TREES = 250
"""Expired trees; each run holds a unique ~20 KB output (some 64 KB of pages in all)."""
KEPT = 800
"""Retained trees: the `VACUUM` copy (about 50 MiB) outgrows the temporary database's
2 MiB page cache and the tmpfs, while the sweep's own statement journals fit (the blob
collection's needed more than 12 MiB and less than 20 in one group commit; a larger
group under load needs more); the deletions free over a fifth of
the pages. A tmpfs too small for the journals fails the sweep itself, and it retries."""
_MOUNT = 'mount -t tmpfs -o size=28m piw-tiny "$0" && exec "$@"'
_UNSHARE = ["unshare", "-U", "--map-current-user", "-m", "sh", "-c", _MOUNT]


def _tiny_tmpfs_or_skip(folder: Path) -> None:
    probe = subprocess.run(
        [*_UNSHARE, str(folder), "true"], capture_output=True, text=True, timeout=30, check=False
    )
    if probe.returncode != 0:
        pytest.skip(f"no user and mount namespace for a tiny tmpfs: {probe.stderr.strip()}")


def _seed(state_dir: Path, now_ms: int) -> None:
    state_dir.mkdir(parents=True)
    clock = ManualClock(now_ms - 31 * DAY_MS)
    db = open_database(state_dir / "state.sqlite", clock=clock)
    try:
        for i in range(TREES):
            _finished_run(db, f"exp-{i}", {"pad": os.urandom(10_000).hex()}, failing=False)
        clock.set(now_ms - DAY_MS)
        for i in range(KEPT):
            _finished_run(db, f"keep-{i}", {"pad": os.urandom(10_000).hex()}, failing=False)
    finally:
        db.close()


def _rows(state_dir: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect((state_dir / "state.sqlite").as_uri() + "?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _serve_on_tiny_tmpfs(
    processes: Processes, state_dir: Path, tiny: Path
) -> subprocess.Popen[str]:
    env = dict(
        os.environ,
        PI_CODING_AGENT_DIR=str(state_dir.parent),
        PI_WORKFLOWS_RETENTION_DAYS="30",
        PI_WORKFLOWS_RETENTION_VACUUM_MIN_BYTES="0",
        SQLITE_TMPDIR=str(tiny),
    )
    argv = [sys.executable, "-m", "pi_workflows.cli", "--state-dir", str(state_dir)]
    child = subprocess.Popen(
        [*_UNSHARE, str(tiny), *argv, "server", "run", "--idle-exit", "0", "--no-execute"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    processes.started.append(child)  # killed by PID at teardown if still there
    assert child.stdout is not None
    line = child.stdout.readline()
    assert "running" in line, f"server did not start: {line!r}"
    return child


def _status(state_dir: Path) -> dict[str, Any]:
    with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
        return dict(client.call("state.status")["receipt"])


def test_a_vacuum_that_finds_the_disk_full_leaves_the_deletions_and_reusable_pages(
    processes: Processes, short_tmp: Path
) -> None:
    tiny = short_tmp / "tiny"
    tiny.mkdir()
    _tiny_tmpfs_or_skip(tiny)
    state, project = short_tmp / "agent" / "workflows", short_tmp / "project"
    write_workflow(project, "echo")
    _seed(state, int(time.time() * 1000))
    [(pages_before,)] = _rows(state, "PRAGMA page_count")
    server = _serve_on_tiny_tmpfs(processes, state, tiny)
    deadline = time.monotonic() + 90
    while (last := (retention := _status(state)["retention"]).get("lastSweep")) is None:
        assert time.monotonic() < deadline and not retention.get("lastFailure"), retention
        time.sleep(0.1)
    assert last["treesDeleted"] == TREES
    assert (last["vacuumed"], last["compactionSkipped"]) == (False, "OperationalError")
    status = _status(state)
    assert status["pageCount"] == pages_before, "no compaction"
    assert status["freePages"] / status["pageCount"] >= 0.2, "the deletions freed pages"
    assert _rows(state, "SELECT count(*) FROM runs WHERE run_id LIKE 'exp-%'") == [(0,)]
    assert _rows(state, "SELECT count(*) FROM runs WHERE run_id LIKE 'keep-%'") == [(KEPT,)]
    free = status["freePages"]
    with WorkflowClient(state, autostart=False, timeout=30) as client:
        for _ in range(20):  # new rows and input blobs, through the server
            payload = {"workflow": "echo", "input": {"pad": os.urandom(20_000).hex()}}
            client.call("run.start", {**payload, "projectPath": str(project)})
    after = _status(state)
    assert after["pageCount"] == pages_before, "the new rows went into the free pages"
    assert after["freePages"] < free
    with WorkflowClient(state, autostart=False, timeout=30) as client:
        assert client.call("state.verify")["receipt"]["findingCount"] == 0
    server.send_signal(signal.SIGTERM)
    assert server.wait(30) == 0, "a failed compaction does not stop the server"
    log = (state / "logs" / "server.log").read_text()
    failures = [line for line in log.splitlines() if "retention.vacuum_failed" in line]
    assert len(failures) == 1 and str(state) not in failures[0] and str(tiny) not in failures[0]
