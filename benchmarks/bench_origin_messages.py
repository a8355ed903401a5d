"""Origin-session workflow messages in the real pi: how fast the extension's coordinator
sends a step message, and how fast a model turn's end is settled on the server.

One interactive run of a chain of `STEPS` agent steps, started with `/workflow start` in
`pi --mode rpc` with the extension; the fake model submits each step's output at once.

- send: from the step message's commit (its `created_at`, the server clock, which is
  this process's clock: the server is embedded) to pi's `message_start` of that custom
  message on pi's stdout (the coordinator's `pi.sendMessage()`; it includes the
  session-view event, the coordinator's checks and pi's stdout);
- settle: from pi's `agent_end` on its stdout to the turn's `ended_at` commit on the
  server (the coordinator's `workflowTurn.report` and its transaction); turns the run's
  own progress closed first are left out;
- baseline: a raw round trip on the same socket (`server.status` with `WorkflowClient`).

Prints p50/p99 in ms and their ratios to the baseline. Takes one of the machine's two
real-pi slots (the lock files tests/pi/conftest.py uses).
Run: make node_modules && .venv/bin/python benchmarks/bench_origin_messages.py
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.engine._pi_child import PI_BINARY_ENV, PiChild, PiLaunch, PiOptions, PiTimeout
from pi_workflows.pi import extension_path
from pi_workflows.testing import FAKE_MODEL, FAKE_PROVIDER, FakeProvider, workflow_submit_turn
from pi_workflows.testing._fake_provider import Turn

STEPS = 30
BASELINE_SAMPLES = 300
REPO = Path(__file__).resolve().parents[1]
MESSAGE_TYPE = "pi-workflows.message"
CONTRACT = re.compile(r"step: (s\d+), attempt: (attempt-[0-9a-f]+)\)")


def chain_workflow(steps: int) -> str:
    nodes = ",\n".join(
        f'        "s{i}": agent(prompt="Step {i}: say ok", output_schema=SCHEMA, timeout=600)'
        for i in range(steps)
    )
    edges = ", ".join(f'{{"from": "s{i}", "to": "s{i + 1}"}}' for i in range(steps - 1))
    return (
        "from pi_workflows import agent, define_workflow\n\n"
        'SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, '
        '"required": ["ok"]}\n\n'
        f'workflow = define_workflow(name="chain", start_at="s0", nodes={{\n{nodes}\n}}, '
        f"edges=[{edges}])\n"
    )


def submit_newest_step(body: Mapping[str, Any]) -> Turn:
    """Submit the newest step contract in the conversation."""
    found = CONTRACT.findall(json.dumps(body.get("messages")))
    step, attempt = found[-1]
    return workflow_submit_turn(step, attempt, {"ok": True})


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def take_slot() -> Any:
    folder = Path(tempfile.gettempdir())
    handles = [(folder / f"pi-workflows-real-pi-{i}.lock").open("a") for i in range(2)]
    for handle in handles:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return handle
        except BlockingIOError:
            continue
    fcntl.flock(handles[0], fcntl.LOCK_EX)
    return handles[0]


def spawn(root: Path) -> PiChild:
    launch = PiLaunch.build(
        environ={**os.environ, PI_BINARY_ENV: str(REPO / "node_modules" / ".bin" / "pi")},
        bridge=extension_path(),
        cwd=root / "project",
        options=PiOptions(provider=FAKE_PROVIDER, model=FAKE_MODEL),
        agent_dir=root / "agent",
        tmpdir=root / "tmp",
        extra_env={},
        stderr_path=root / "pi.stderr.log",
    )
    child = PiChild.spawn(launch)
    child.wait_ready(60)
    return child


def rows(state: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{state / 'state.sqlite'}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def drive(
    child: PiChild, client: WorkflowClient, run_id: str
) -> tuple[dict[str, float], list[float]]:
    """Pi's events until the run is terminal: message_start times by message ID and
    agent_end times in order (ms, this process's clock)."""
    sent: dict[str, float] = {}
    ends: list[float] = []
    deadline = time.monotonic() + 60 * STEPS
    while time.monotonic() < deadline:
        try:
            event = child.next_event(1.0)
        except PiTimeout:
            status = client.call("run.get", run_id=run_id)["receipt"]["display"]["status"]
            if status in {"completed", "failed", "cancelled", "timed_out"}:
                return sent, ends
            continue
        now = time.time() * 1000
        message = event.get("message") or {}
        if event.get("type") == "message_start" and message.get("customType") == MESSAGE_TYPE:
            sent.setdefault(str(message["details"]["messageId"]), now)
        elif event.get("type") == "agent_end":
            ends.append(now)
    raise TimeoutError("the chain did not finish")


def main() -> None:
    slot = take_slot()
    root = Path(tempfile.mkdtemp(prefix="piw-bench-origin-", dir="/tmp"))
    try:
        for folder in ("project", "tmp"):
            (root / folder).mkdir()
        workflows = root / "project" / ".pi" / "workflows"
        workflows.mkdir(parents=True)
        (workflows / "chain.workflow.py").write_text(chain_workflow(STEPS))
        state = root / "agent" / "workflows"
        with FakeProvider() as provider:
            provider.write_agent_dir(root / "agent")
            provider.script(*([submit_newest_step] * STEPS))
            server = WorkflowServer(state, idle_exit_s=None, tick_s=0.05, execute_runs=True)
            server.start()
            child = spawn(root)
            try:
                with WorkflowClient(state, autostart=False, timeout=60) as client:
                    baseline = []
                    for _ in range(BASELINE_SAMPLES):
                        start = time.perf_counter()
                        client.call("server.status")
                        baseline.append((time.perf_counter() - start) * 1000)
                    child.send({"type": "prompt", "message": "/workflow start chain"})
                    run_id = ""
                    while not run_id:
                        event = child.next_event(60)
                        if event.get("method") == "notify":
                            run_id = str(event["message"]).rsplit(" ", 1)[-1]
                    sent, ends = drive(child, client, run_id)
                    status = client.call("run.get", run_id=run_id)["receipt"]["display"]["status"]
            finally:
                child.stop()
                server.stop("benchmark done")
        created = dict(rows(state, "SELECT message_id, created_at FROM workflow_messages"))
        send = [sent[m] - float(c) for m, c in created.items() if m in sent]
        turns = rows(
            state,
            "SELECT status, ended_at FROM workflow_turns ORDER BY started_at, rowid",
        )
        settle = [
            float(ended) - end
            for (status_, ended), end in zip(turns, ends, strict=False)
            if status_ == "completed" and ended is not None and float(ended) >= end
        ]
    finally:
        shutil.rmtree(root, ignore_errors=True)
        slot.close()
    b50, b99 = statistics.median(baseline), pct(baseline, 0.99)
    print(f"chain of {STEPS} agent steps: {status}; {len(send)} sends, {len(settle)} settled ends")
    print(f"raw round trip (server.status)   p50 {b50:7.2f} ms  p99 {b99:7.2f} ms")
    for name, values in (
        ("eligible -> pi.sendMessage", send),
        ("agent_end -> settled turn", settle),
    ):
        if not values:
            print(f"{name}: no samples")
            continue
        p50, p99 = statistics.median(values), pct(values, 0.99)
        print(
            f"{name:32} p50 {p50:7.2f} ms  p99 {p99:7.2f} ms  "
            f"({p50 / b50:5.1f}x / {p99 / b99:5.1f}x the raw round trip)"
        )


if __name__ == "__main__":
    main()
