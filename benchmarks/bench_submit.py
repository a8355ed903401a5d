"""A held `interaction.submit` (one validation child per candidate) against `interaction.update`,
and a refused `interaction.submit` (a stale attempt) against `server.status`.

Both go to the same pending agent request of a real run on an embedded server: the
update is one committed run event with its receipt (the baseline); the submit records a
`validating` candidate, forks a `piw-validator` through the zygote (it loads the
workflow and runs `output_schema` and `validate`), settles the rejection in a second
commit and only then answers. Each submit is rejected by `validate`, so the request
stays pending for the next one. Prints p50/p99 of each and the ratio.

The refusal (issue 25, item 4): a submission to the request of a cancelled run (its
attempt is over) is refused `claimLost` before anything is written, so it should cost
about what a `server.status` round trip does (target: at most 2x). Measured with a
small output and a 256 KiB one (which a server that stored it first paid to write).
Run: .venv/bin/python benchmarks/bench_submit.py [refusal]
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from pi_workflows import WorkflowClient, WorkflowServer

SAMPLES = 60

WORKFLOW = """
from pi_workflows import agent, compute, define_workflow


def check(output, ctx):
    raise ValueError("not yet")


workflow = define_workflow(
    name="bench",
    start_at="prep",
    nodes={
        "prep": compute(lambda ctx: {"ready": True}),
        "ask": agent(prompt="Give n", output_schema={"type": "object"}, validate=check,
                     provider="fake", model="fake-model", timeout=600),
    },
    edges=[{"from": "prep", "to": "ask"}],
)
"""


def _pending_request(database: Path, run_id: str) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(sqlite3.OperationalError):
            with contextlib.closing(sqlite3.connect(database)) as conn:
                row = conn.execute(
                    "SELECT request_id FROM interactive_requests WHERE run_id = ?", (run_id,)
                ).fetchone()
            if row:
                return str(row[0])
        time.sleep(0.05)
    raise RuntimeError("no pending request")


def _timed(samples: int, call: Callable[[], None]) -> list[float]:
    times: list[float] = []
    for _ in range(samples):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return times


def _summary(name: str, times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    print(f"{name:<22} p50 {p50:8.2f} ms   p99 {p99:8.2f} ms")
    return p50, p99


def _refusal(client: WorkflowClient, project: Path, database: Path) -> None:
    """A stale attempt's submission (its run cancelled) against `server.status`."""
    start = {"workflow": "bench", "input": {}, "projectPath": str(project)}
    run_id = client.call("run.start", start)["receipt"]["runId"]
    request_id = _pending_request(database, run_id)
    cancelled = client.request("run.cancel", {}, run_id=run_id)
    assert cancelled["outcome"] == "accepted", cancelled

    def status() -> None:
        answer = client.request("server.status", {})
        assert answer["outcome"] == "accepted", answer

    def refused(pad: int) -> Callable[[], None]:
        def call() -> None:
            # A new output each time (like a race's losers): a server that stored the
            # payload before refusing wrote new bytes for every one.
            value = {"n": uuid.uuid4().hex, "pad": "x" * pad}
            payload = {
                "interactionId": request_id,
                "submissionId": uuid.uuid4().hex,
                "value": value,
            }
            answer = client.request(
                "interaction.submit", payload, run_id=run_id, idempotency_key=uuid.uuid4().hex
            )
            assert answer["outcome"] == "claimLost", answer

        return call

    small = refused(0)
    large = refused(256 * 1024)
    for call in (status, small, large):
        _timed(10, call)  # warm
    base50, base99 = _summary("server.status", _timed(SAMPLES * 4, status))
    small50, small99 = _summary("submit refused (small)", _timed(SAMPLES * 4, small))
    large50, large99 = _summary("submit refused (256K)", _timed(SAMPLES, large))
    print(f"ratio refused/status   p50 {small50 / base50:6.1f}x   p99 {small99 / base99:6.1f}x")
    print(f"ratio 256K/status      p50 {large50 / base50:6.1f}x   p99 {large99 / base99:6.1f}x")


def main() -> None:
    only_refusal = sys.argv[1:] == ["refusal"]
    root = Path(tempfile.mkdtemp(prefix="piw-bench-"))
    try:
        stand_in = root / "silent-pi"  # keeps the agent step pending (never answers)
        stand_in.write_text("#!/bin/sh\nexec sleep 600\n")
        stand_in.chmod(0o755)
        os.environ["PI_WORKFLOWS_PI"] = str(stand_in)
        project = root / "project"
        (project / ".pi" / "workflows").mkdir(parents=True)
        (project / ".pi" / "workflows" / "bench.workflow.py").write_text(WORKFLOW)
        state = root / "agent" / "workflows"
        with (
            WorkflowServer(state, idle_exit_s=None, tick_s=0.05) as server,
            WorkflowClient(server.state_dir, autostart=False, timeout=60) as client,
        ):
            (database,) = Path(server.state_dir).rglob("*.sqlite")
            if only_refusal:
                _refusal(client, project, database)
                return
            start = {"workflow": "bench", "input": {}, "projectPath": str(project)}
            run_id = client.call("run.start", start)["receipt"]["runId"]
            request_id = _pending_request(database, run_id)

            def update() -> None:
                payload = {
                    "interactionId": request_id,
                    "update": {"type": "progress", "key": "k", "data": {}},
                }
                answer = client.request(
                    "interaction.update",
                    payload,
                    run_id=run_id,
                    idempotency_key=uuid.uuid4().hex,
                )
                assert answer["outcome"] == "accepted", answer

            def submit() -> None:
                payload = {
                    "interactionId": request_id,
                    "submissionId": uuid.uuid4().hex,
                    "value": {"n": 1},
                }
                answer = client.request(
                    "interaction.submit",
                    payload,
                    run_id=run_id,
                    idempotency_key=uuid.uuid4().hex,
                )
                assert answer["outcome"] == "rejected", answer

            _timed(5, update)
            _timed(5, submit)  # warm: the zygote's validator spare exists
            base50, base99 = _summary("interaction.update", _timed(SAMPLES, update))
            sub50, sub99 = _summary("interaction.submit", _timed(SAMPLES, submit))
            print(f"ratio submit/update    p50 {sub50 / base50:6.1f}x   p99 {sub99 / base99:6.1f}x")
            _refusal(client, project, database)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
