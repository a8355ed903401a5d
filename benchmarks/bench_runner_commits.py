"""Claim-checked runner step commits per second with 4 busy runners, against raw commits.

Four threads act as four runners of four live runs. Each sends node.started, waits for
its reply, sends node.finished, waits, and so on, exactly as a runner does over its
channel: every message is a real `Transact` to a real `DatabaseActor`, running the
server's real handler (`apply_message` on a typed `RunnerMessage`: generation fence,
stored-reply lookup, `start_node_attempt` / `finish_node_attempt` as a protected write
under the run's live host claim, the stored reply), and the reply is released only after
COMMIT. The baseline, measured in the same run on the same disk: one thread committing
one single-row INSERT per transaction on a raw SQLite connection (WAL, synchronous=FULL).
The same load is also run with group commit off (one COMMIT per unit, as before).

Run: `.venv/bin/python benchmarks/bench_runner_commits.py [--seconds S] [--rounds R]`.
Target: runner step commits/s >= 1.0 x raw commits/s.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from pi_workflows._address import ReplyBox
from pi_workflows.actors import _database
from pi_workflows.actors._database import DatabaseActor, Transact
from pi_workflows.domain import ApplyRunnerMessage
from pi_workflows.domain._runner_handlers import RunnerView, apply_message
from pi_workflows.domain._runner_launch import prepare_launch
from pi_workflows.storage import Database, NewRun, enqueue_run, open_database
from pi_workflows.wire.protocol import LAUNCH_SCHEMA
from pi_workflows.wire.runner import RunnerMessage

TARGET_RATIO = 1.0
RUNNERS = 4

RAW_INSERT = "INSERT INTO raw (payload, at) VALUES (?, ?)"


def raw_rate(path: Path, seconds: float) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS raw (id INTEGER PRIMARY KEY, payload TEXT, at INT)")
    commits, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(RAW_INSERT, (f'{{"i":{commits}}}', commits))
        conn.execute("COMMIT")
        commits += 1
    elapsed = time.perf_counter() - began
    conn.close()
    return commits / elapsed


class BenchRunner:
    """One runner generation of one live run, sending its messages through the actor."""

    def __init__(self, owner_id: str, db: Database, run_id: str) -> None:
        plan = prepare_launch(db, run_id, owner_id)
        assert plan is not None
        self.view, self.epoch, self.envelope = (
            RunnerView.launched(plan),
            plan.runner_epoch,
            plan.envelope,
        )
        self.ids = 0
        digest = "sha256:" + "d" * 64
        ready = self.message("runner.ready", {"protocolVersion": 1, "definitionDigest": digest})
        handled = apply_message(db, self.view, RunnerMessage.from_wire(ready))
        assert handled.frames[0]["outcome"] == "accepted"

    def message(self, kind: str, payload: dict[str, Any], attempt: str | None = None) -> Any:
        self.ids += 1
        body: dict[str, Any] = {
            "schema": LAUNCH_SCHEMA,
            "kind": kind,
            "runId": self.envelope["runId"],
            "generation": self.envelope["generation"],
            "runnerEpoch": self.epoch,
            "expectedRevision": 0,
            "messageId": f"m{self.ids}",
            "payload": payload,
        }
        if attempt is not None:
            body["attemptId"] = attempt
        return body

    def send(self, actor: Any, message: Any) -> None:
        box = ReplyBox()
        actor.tell(Transact(ApplyRunnerMessage(self.view, RunnerMessage.from_wire(message)), box))
        frames = box.wait(30).frames
        assert frames[0]["outcome"] == "accepted", frames[0]

    def steps(self, actor: Any, stop: threading.Event, counter: list[int]) -> None:
        node = 0
        while not stop.is_set():
            node += 1
            attempt = f"{self.epoch}-a{node}"
            started = {"nodePath": "step", "nodeKind": "compute", "visit": node}
            self.send(actor, self.message("node.started", started, attempt))
            finished = {"nodePath": "step", "output": {"n": node}}
            self.send(actor, self.message("node.finished", finished, attempt))
            counter[0] += 2


def runner_rate(path: Path, seconds: float, group_commit: bool) -> tuple[float, float]:
    """Runner step commits per second, and the mean units per COMMIT."""
    commits: list[int] = [0]

    def count(sql: str, _params: object) -> None:
        if sql == "COMMIT":
            commits[0] += 1

    db = open_database(path, tracer=count)
    host = "bench-server"
    run_ids = [f"run-{path.stem}-{index}" for index in range(RUNNERS)]
    for run_id in run_ids:
        with db.write() as tx:
            enqueue_run(
                tx,
                NewRun(
                    run_id=run_id,
                    workflow_name="bench",
                    project_path="/bench",
                    source_identity={"root": {"kind": "builtin"}},
                    definition_digest="sha256:" + "d" * 64,
                    input_hash="sha256:input",
                    input={},
                ),
            )
    runners = [BenchRunner(host, db, run_id) for run_id in run_ids]
    saved = _database.MAX_BATCH_UNITS
    _database.MAX_BATCH_UNITS = saved if group_commit else 1
    actor = DatabaseActor.start(db, lambda name, exc: None)
    stop = threading.Event()
    counters = [[0] for _ in runners]
    threads = [
        threading.Thread(target=runner.steps, args=(actor, stop, counter))
        for runner, counter in zip(runners, counters, strict=True)
    ]
    try:
        commits[0] = 0
        began = time.perf_counter()
        for thread in threads:
            thread.start()
        time.sleep(seconds)  # the measured interval (a benchmark, not a test)
        stop.set()
        for thread in threads:
            thread.join(30)
        elapsed = time.perf_counter() - began
    finally:
        actor.stop(block=True, timeout=30)
        _database.MAX_BATCH_UNITS = saved
    units = sum(counter[0] for counter in counters)
    return units / elapsed, units / max(1, commits[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--dir", type=Path, default=None, help="folder for the database files")
    args = parser.parse_args()

    raw: list[float] = []
    grouped: list[float] = []
    per_unit: list[float] = []
    batch_sizes: list[float] = []
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-runners-") as folder:
        base = Path(folder)
        raw_rate(base / "warm.sqlite", 0.3)
        for n in range(args.rounds):
            raw.append(raw_rate(base / f"raw-{n}.sqlite", args.seconds))
            rate, size = runner_rate(base / f"group-{n}.sqlite", args.seconds, True)
            grouped.append(rate)
            batch_sizes.append(size)
            per_unit.append(runner_rate(base / f"single-{n}.sqlite", args.seconds, False)[0])

    raw_median = statistics.median(raw)
    grouped_median = statistics.median(grouped)
    single_median = statistics.median(per_unit)
    ratio = grouped_median / raw_median
    verdict = "meets" if ratio >= TARGET_RATIO else "MISSES"
    print(
        f"raw single-writer INSERT commits:         {raw_median:9.1f} /s (median of {args.rounds})"
    )
    print(
        f"4 runners, one COMMIT per unit (before):  {single_median:9.1f} /s "
        f"(ratio {single_median / raw_median:.2f})"
    )
    print(
        f"4 runners, group commit:                  {grouped_median:9.1f} /s "
        f"(ratio {ratio:.2f}, {statistics.median(batch_sizes):.1f} units per COMMIT)"
    )
    print(f"ratio group/raw: {ratio:.2f} ({verdict} target {TARGET_RATIO})")


if __name__ == "__main__":
    main()
