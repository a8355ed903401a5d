"""`run.start` latency while an automatic sweep deletes expired runs, against idle.

What is measured: a state database seeded (storage API, manual clock) with N completed
root runs 31 days old (each with attempts, an output blob, events and a runner epoch).
A real embedded server starts on it two days earlier by its manual clock (runs
executed, no VACUUM: its cost is the file's, not the starts'), so its startup sweep
finds nothing old enough; three starts warm it up (the workflow's first load). Then the
clock moves on three days: the daily check sweeps, one tree per transaction. While the
retention report says `sweeping`, the benchmark sends one
`run.start` of a one-node workflow and times its answer; the sweep stops between two
trees for the run, and goes on when its runner exits (the benchmark waits for the run to
finish before the next sample; at most 200 samples, each after a random pause up to
50 ms). Once the sweep has completed, the same loop runs on the
idle server (the runs deleted, nothing sweeping) for as many starts. Reported: p50 and
p99 of each, and the ratio of the p99s.

Target (issue 26): p99 during the sweep <= 1.5x idle, at N = 100,000.

Run: `.venv/bin/python -m benchmarks.bench_retention_start [N]` (default 100,000).
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.storage import DAY_MS, ManualClock
from tests.conftest import write_workflow
from tests.server.retention_seed import seed_expired_trees
from tests.server.runs import TERMINAL

NOW = 1_800_000_000_000
MIN_SAMPLES = 20
"""Idle starts at least (as many as the sweep gave, if more)."""
MAX_SAMPLES = 200
"""Starts during the sweep at most; then it finishes undisturbed."""
PAUSE_S = 0.05
"""Each start waits a random pause up to this, so the samples meet the sweep at every
point of a tree's transaction (seeded: the same pauses each run)."""


def _p(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def _start(client: WorkflowClient, project: Path, index: int) -> tuple[float, str]:
    payload = {"workflow": "echo", "input": {"i": index}, "projectPath": str(project)}
    begun = time.perf_counter()
    answer = client.call("run.start", payload)
    return time.perf_counter() - begun, str(answer["receipt"]["runId"])


def _last_sweep(client: WorkflowClient) -> dict[str, Any] | None:
    last = client.call("state.status")["receipt"]["retention"]["lastSweep"]
    return None if last is None else dict(last)


def _finish(client: WorkflowClient, run_id: str) -> None:
    """Wait on the run's own subscription (the run list's window, all runs at one
    manual-clock time, may not show a new run) until the run is terminal."""
    status = client.wait(run_id, timeout=600)["display"]["status"]
    assert status in TERMINAL, status


def _during_sweep(
    client: WorkflowClient, project: Path, before: dict[str, Any] | None
) -> tuple[list[float], dict[str, Any]]:
    """A start each time the sweep is under way; each run finished before the next."""
    samples: list[float] = []
    pauses = random.Random(26)
    while True:
        retention = client.call("state.status")["receipt"]["retention"]
        if retention["lastSweep"] not in (None, before):
            return samples, dict(retention["lastSweep"])
        if retention["state"] != "sweeping" or len(samples) >= MAX_SAMPLES:
            time.sleep(0.002)
            continue
        time.sleep(pauses.uniform(0, PAUSE_S))
        took, run_id = _start(client, project, len(samples))
        samples.append(took)
        _finish(client, run_id)


def _idle(client: WorkflowClient, project: Path, count: int) -> list[float]:
    samples = []
    for index in range(count):
        took, run_id = _start(client, project, index)
        samples.append(took)
        _finish(client, run_id)
    return samples


def main(count: int) -> None:
    os.environ["PI_WORKFLOWS_RETENTION_DAYS"] = "30"
    os.environ["PI_WORKFLOWS_RETENTION_VACUUM_MIN_BYTES"] = str(1 << 62)
    root = Path(tempfile.mkdtemp(prefix="piw-bench-"))
    try:
        state, project = root / "state", root / "project"
        write_workflow(project, "echo")
        seeded = time.perf_counter()
        seed_expired_trees(state, count, now_ms=NOW)
        print(f"seeded {count} expired trees in {time.perf_counter() - seeded:.1f} s")
        clock = ManualClock(NOW - 2 * DAY_MS)
        server = WorkflowServer(
            state, idle_exit_s=None, tick_s=0.05, execute_runs=True, clock=clock
        )
        server.start()
        try:
            with WorkflowClient(state, autostart=False, timeout=120) as client:
                while (before := _last_sweep(client)) is None:  # the startup sweep: none
                    time.sleep(0.01)
                _idle(client, project, 3)
                began = time.perf_counter()
                clock.advance(3 * DAY_MS)  # the daily check: the trees are 31 days old
                busy, last = _during_sweep(client, project, before)
                swept_s = time.perf_counter() - began
                idle = _idle(client, project, max(MIN_SAMPLES, len(busy)))
        finally:
            server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"sweep: {last['treesDeleted']} trees in {swept_s:.1f} s (with the starts); "
        f"{len(busy)} starts during it, {len(idle)} on the idle server"
    )
    if not busy:
        print("the sweep finished before a start could be sent: use a larger N")
        return
    for name, values in (("during the sweep", busy), ("idle", idle)):
        shares = ", ".join(f"p{int(q * 100)} {_p(values, q) * 1000:.2f}" for q in (0.5, 0.9, 0.95))
        print(f"  {name}: {shares}, max {max(values) * 1000:.2f} ms")
    busy_p99, idle_p99 = _p(busy, 0.99), _p(idle, 0.99)
    print(
        f"run.start during the sweep: p50 {statistics.median(busy) * 1000:.2f} ms, "
        f"p99 {busy_p99 * 1000:.2f} ms; idle: p50 {statistics.median(idle) * 1000:.2f} ms, "
        f"p99 {idle_p99 * 1000:.2f} ms; p99 ratio {busy_p99 / idle_p99:.2f}x (target <= 1.5x)"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
