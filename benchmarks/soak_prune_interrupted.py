"""An interrupted `state prune --apply` at 20,000 runs, then a second prune (issue 26).

What is run: a state database seeded (storage API, manual clock) with N completed root
runs 31 days old, each with its own output blob. A real `server run` is armed to SIGKILL
itself right after the commit of tree N/2 (`server.lifecycle.prune_tree.after_commit`).
Then, through the real CLI:
1. `state prune --apply --backup` over the armed server: it must exit 3 and say that the
   server went away during the deletions and that some trees may already be gone;
2. the database is read: no tree is half-deleted;
3. `state prune --json` (a new server, unarmed) lists exactly the runs left;
4. a second `state prune --apply`; then `state prune --json` lists nothing and counts no
   blob that no row names; every blob left is named by a row; `state verify` is clean.

It checks promises, not speed, but takes minutes at 20,000 runs, so it is a script, not
a test: `make test` runs the same scenario at 2,000 runs in the crash matrix
(`tests/crash/test_crash_matrix.py`, variant `manual-prune`). Prints the counts and the
time of each stage; exits 1 if a promise fails.

Run: `.venv/bin/python -m benchmarks.soak_prune_interrupted [N]` (default 20,000).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pi_workflows.supervision import CRASH_ENV, CRASH_ONCE_ENV
from tests.server.retention_seed import assert_whole_trees, seed_expired_trees

PIW = [sys.executable, "-m", "pi_workflows.cli"]
STAGE_TIMEOUT_S = 1800


def _env(state: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (CRASH_ENV, CRASH_ONCE_ENV)}
    env["PI_CODING_AGENT_DIR"] = str(state.parent)
    env["PI_WORKFLOWS_RETENTION_DAYS"] = "0"  # only the manual prune deletes
    env.update(extra)
    return env


def _cli(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [*PIW, "--state-dir", str(state), *args]
    return subprocess.run(
        argv, check=False, env=_env(state), capture_output=True, text=True, timeout=STAGE_TIMEOUT_S
    )


def _check(ok: bool, what: str, detail: Any = "") -> None:
    print(f"  {'ok  ' if ok else 'FAIL'} {what}" + (f": {detail}" if not ok and detail else ""))
    if not ok:
        raise SystemExit(1)


def _unnamed_rows(state: Path) -> int:
    """Blobs whose digest no other row holds anywhere (any column of any table, event
    payloads included): counted independently of the server's own SQL."""
    digest = re.compile(r"sha256:[0-9a-f]{64}")
    db = sqlite3.connect(f"file:{state / 'state.sqlite'}?mode=ro", uri=True)
    try:
        blobs = {row[0] for row in db.execute("SELECT digest FROM blobs")}
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in (t for t in tables if t != "blobs"):
            for row in db.execute(f"SELECT * FROM {table}"):
                for value in row:
                    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
                    if isinstance(text, str):
                        blobs.difference_update(digest.findall(text))
        return len(blobs)
    finally:
        db.close()


def main(count: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="piw-soak-"))
    state = root / "state"
    server: subprocess.Popen[str] | None = None
    try:
        begun = time.monotonic()
        seed_expired_trees(state, count, now_ms=int(time.time() * 1000), pad_chars=200)
        print(f"seeded {count} expired runs in {time.monotonic() - begun:.1f} s")
        marker = root / "crashed"
        armed = _env(
            state,
            **{
                CRASH_ENV: f"server.lifecycle.prune_tree.after_commit@{count // 2}",
                CRASH_ONCE_ENV: str(marker),
            },
        )
        argv = [*PIW, "--state-dir", str(state), "server", "run", "--idle-exit", "0"]
        server = subprocess.Popen(
            argv, env=armed, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            start_new_session=True,
        )  # fmt: skip
        assert server.stdout is not None
        _check("running" in server.stdout.readline(), "the armed server started")
        begun = time.monotonic()
        first = _cli(state, "state", "prune", "--older-than", "30", "--apply", "--backup",
                     str(root / "before.sqlite"))  # fmt: skip
        print(f"first prune (killed at tree {count // 2}) took {time.monotonic() - begun:.1f} s")
        _check(server.wait(60) == -signal.SIGKILL, "the server died by SIGKILL at its point")
        server = None
        _check(first.returncode == 3, "the interrupted prune exits 3", first.returncode)
        said = first.stderr
        _check("went away during the deletions" in said, "it says the server went away", said)
        _check("some trees may already be gone" in said, "it says trees may be gone", said)
        db = sqlite3.connect(f"file:{state / 'state.sqlite'}?mode=ro", uri=True)
        try:
            assert_whole_trees(db)
            left = sorted(
                r[0] for r in db.execute("SELECT run_id FROM runs WHERE run_id != 'recent'")
            )
            blobs_before = db.execute("SELECT count(*) FROM blobs").fetchone()[0]
        finally:
            db.close()
        print(
            f"  ok   no tree is half-deleted; {len(left)} expired runs left, {blobs_before} blobs"
        )
        _check(len(left) == count - count // 2, "exactly the trees after the killed one are left")
        unnamed = _unnamed_rows(state)
        print(f"  blobs no row names after the kill: {unnamed}")
        listed = json.loads(_cli(state, "state", "prune", "--older-than", "30", "--json").stdout)
        # The dry run names the first 1,000 runs and counts them all.
        shown = set(listed["runIds"])
        only_left = listed["runCount"] == len(left) and shown <= set(left) and len(shown) > 0
        _check(only_left, "the second prune lists only what is left", listed["runCount"])
        begun = time.monotonic()
        second = _cli(state, "state", "prune", "--older-than", "30", "--apply", "--backup",
                      str(root / "second.sqlite"), "--json")  # fmt: skip
        print(f"second prune took {time.monotonic() - begun:.1f} s")
        _check(second.returncode == 0, "the second prune completes", second.stderr)
        after = json.loads(_cli(state, "state", "prune", "--older-than", "30", "--json").stdout)
        _check(after["treeCount"] == 0, "nothing is left to prune", after["treeCount"])
        _check(after["unnamedBlobs"] == 0, "the dry run counts no unnamed blob", after)
        _check(_unnamed_rows(state) == 0, "no blob that no row names remains")
        verify = _cli(state, "state", "verify", "--json")
        _check(json.loads(verify.stdout)["consistent"], "state verify is clean", verify.stdout)
        print(f"PASS: {count} runs, prune killed at tree {count // 2}, nothing left behind")
    finally:
        if server is not None and server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        _cli(state, "server", "stop")
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000)
