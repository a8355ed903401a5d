"""Restart after SIGKILL with 1,000 runs in flight against the same with 10, in one run.

What is measured (issue 6): how long a replacement server takes, after the previous one
was SIGKILLed, until

- **accepting**: from spawning the replacement `pi-workflows server run` process until a
  `server.status` request on its socket is answered. It includes the interpreter start,
  the zygote, the epoch takeover and startup recovery, which runs before the socket is
  bound;
- **rescheduled**: from the same moment until the database (read through a read-only
  connection, polled every 2 ms) shows all of:
  1. the server epoch is newer than the dead server's;
  2. no runner epoch of the dead server is still open (`runner_epochs` `starting`/`ready`);
  3. no run is `starting`/`running` in `run_queue` unless the new server owns its claim:
     every run the dead server held was requeued (`queued`, claimable by the scheduler;
     a paused one parked), or was already admitted again under the new server's claim.

**The state** (built afresh for each sample, the same mix for both sizes):

1. A real server runs real runs: two `bench-gate` runs reach their checkpoint for real
   (waiting), and one `bench-sleepy` run has a live runner in a long compute node. The
   `bench-gate` run is the template for the bulk runs (source identity, definition digest
   and the stored definition snapshot are real).
2. That server is SIGKILLed (its zygote then kills its runner) and its zygote has gone.
3. With the storage API (`pi_workflows.storage`), the state is made to look as if the
   dead server had held N more runs: a new server epoch with a live lease owned by a dead
   owner, then N runs in ten equal groups (by `i % 10`):
   - 0, 1: `queued`;
   - 2, 3: `running` with a live runner record: claim for launch (a live host claim of the
     dead owner), runner live, node `prep` running, the runner process recorded for
     stopping. One of these per 100 runs (at least one) is a real live process (`sleep`,
     in its own session) that recovery must stop by exact identity; the others name
     exited processes (the dead server's zygote already stopped its runners);
   - 4: `starting`: a stale claim for launch whose runner never became ready;
   - 5: `running` under a stale claim, with no recorded process;
   - 6: parked `paused` (a running run paused: no claim);
   - 7: `queued` and paused (the pause flag only);
   - 8, 9: `waiting` at the `gate` checkpoint with a pending decision.
   So 40 % of the runs are claimable stale runs that recovery must requeue.
4. A replacement server starts (executing, `--max-workers 4`, like `server start`), and
   both times are taken. Then `state verify` must be clean, and the recovery report in
   `logs/server.log` must count every stale run and every live recorded process.

Targets (issue 6), at 1,000 runs: accepting within 1 s, every claimable run rescheduled
within 5 s. The ratios 1,000 vs 10 show how recovery scales.

Run: `.venv/bin/python benchmarks/bench_recovery.py [--runs 1000] [--small 10] [--samples 3]`.
Every process it starts is stopped by PID (servers by process group) before it exits.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from pi_workflows import WorkflowClient
from pi_workflows.storage import (
    NewRun,
    OwnerType,
    acquire_server_epoch,
    claim_for_launch,
    enqueue_run,
    finish_node_attempt,
    mark_runner_live,
    open_checkpoint_decision,
    open_database,
    pause_run,
    record_process,
    start_node_attempt,
    wait_run,
)
from pi_workflows.supervision import identity_of

ACCEPT_TARGET_S = 1.0
RESCHEDULE_TARGET_S = 5.0
DEAD_LEASE_TTL_MS = 600_000
BATCH = 100
POLL_S = 0.002

GATE = """
from pi_workflows import checkpoint, compute, define_workflow

workflow = define_workflow(
    name="bench-gate",
    start_at="prep",
    nodes={
        "prep": compute(lambda ctx: {"n": ctx.input.get("n", 0)}),
        "gate": checkpoint(summary="bench checkpoint"),
        "after": compute(lambda ctx: {"done": True}),
    },
    edges=[{"from": "prep", "to": "gate"}, {"from": "gate", "to": "after"}],
)
"""

SLEEPY = """
import time

from pi_workflows import compute, define_workflow

workflow = define_workflow(
    name="bench-sleepy",
    start_at="nap",
    nodes={"nap": compute(lambda ctx: time.sleep(300) or {}, timeout=600)},
)
"""


@dataclass
class Sample:
    runs: int
    accept_s: float
    ready_line_s: float
    reschedule_s: float
    requeued: int
    processes_stopped: int
    expected_requeued: int
    expected_stopped: int


@dataclass
class Children:
    """Every process this benchmark started, stopped by PID at the end."""

    servers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    others: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def stop(self) -> None:
        for child in self.servers:
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    child.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(20)
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(10)
            if child.stdout is not None:
                child.stdout.close()
        for child in self.others:
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(10)
        self.servers.clear()
        self.others.clear()


def server_env(state: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PI_WORKFLOWS_CRASH")}
    env["PI_CODING_AGENT_DIR"] = str(state.parent)
    return env


def spawn_server(state: Path, children: Children) -> subprocess.Popen[bytes]:
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pi_workflows.cli",
            "--state-dir",
            str(state),
            "server",
            "run",
            "--idle-exit",
            "0",
            "--max-workers",
            "4",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=server_env(state),
        start_new_session=True,
    )
    children.servers.append(child)
    return child


def readonly(state: Path) -> sqlite3.Connection:
    return sqlite3.connect(
        f"file:{state / 'state.sqlite'}?mode=ro", uri=True, timeout=30, isolation_level=None
    )


def wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        threading.Event().wait(0.02)


# --- building the state -------------------------------------------------------------------


def real_phase(state: Path, project: Path, children: Children) -> tuple[dict[str, Any], int]:
    """Run real runs on a real server, SIGKILL it; return the template run and the PID."""
    server = spawn_server(state, children)
    assert server.stdout is not None
    line = server.stdout.readline().decode()
    if "running" not in line:
        raise RuntimeError(f"the first server did not start: {line!r}")
    with WorkflowClient(state, autostart=False, timeout=60) as client:
        gates = [
            client.call(
                "run.start",
                {"workflow": "bench-gate", "input": {"n": i}, "projectPath": str(project)},
            )["receipt"]["runId"]
            for i in range(2)
        ]
        client.call(
            "run.start", {"workflow": "bench-sleepy", "input": {}, "projectPath": str(project)}
        )

    def settled() -> bool:
        with contextlib.closing(readonly(state)) as db:
            waiting = db.execute("SELECT COUNT(*) FROM runs WHERE status = 'waiting'").fetchone()
            running = db.execute(
                "SELECT COUNT(*) FROM run_queue WHERE state = 'running'"
            ).fetchone()
        return bool(waiting[0] == 2 and running[0] == 1)

    wait_until(settled, 60, "the real runs to wait and run")
    zygotes = [p for p in psutil.Process(server.pid).children() if p.name() == "piw-zygote"]
    os.killpg(server.pid, signal.SIGKILL)
    server.wait(10)
    psutil.wait_procs(zygotes, timeout=10)  # it kills its runners when its channel closes
    with contextlib.closing(readonly(state)) as db:
        db.row_factory = sqlite3.Row
        row = db.execute(
            "SELECT workflow_name, project_path, source_identity, definition_digest, input_hash, "
            "input FROM runs WHERE run_id = ?",
            (gates[0],),
        ).fetchone()
        template = dict(row)
    return template, server.pid


def write_in_flight(
    state: Path, template: dict[str, Any], runs: int, dead_pid: int, children: Children
) -> tuple[int, int]:
    """Add `runs` runs that a dead server held (see the module docstring)."""
    db = open_database(state / "state.sqlite")
    dead_owner = f"server-dead{uuid.uuid4().hex[:8]}"
    expected_requeued = 1  # the real bench-sleepy run
    expected_stopped = 0
    try:
        with db.write() as tx:
            acquire_server_epoch(
                tx,
                owner_id=dead_owner,
                pid=dead_pid,
                ttl_ms=DEAD_LEASE_TTL_MS,
                previous_owner_gone=True,
            )
        for start in range(0, runs, BATCH):
            with db.write() as tx:
                for i in range(start, min(runs, start + BATCH)):
                    group = i % 10
                    run_id = f"run-bench-{i:05d}"
                    enqueue_run(
                        tx,
                        NewRun(
                            run_id=run_id,
                            workflow_name=template["workflow_name"],
                            project_path=template["project_path"],
                            source_identity=json.loads(template["source_identity"]),
                            definition_digest=template["definition_digest"],
                            input_hash=template["input_hash"],
                            input=json.loads(template["input"]),
                        ),
                    )
                    if group in (0, 1):
                        continue
                    if group == 7:
                        pause_run(tx, run_id)
                        continue
                    epoch = f"epoch-{uuid.uuid4().hex}"
                    launch = claim_for_launch(
                        tx,
                        run_id,
                        owner_id=dead_owner,
                        owner_type=OwnerType.HOST,
                        runner_epoch=epoch,
                        launch_envelope_hash=f"sha256:{uuid.uuid4().hex}",
                        ttl_ms=DEAD_LEASE_TTL_MS,
                    )
                    if group == 4:
                        expected_requeued += 1
                        continue
                    pid, ticks, boot = dead_pid, 1, "gone"
                    if group == 2 and (i // 10) % 10 == 0:
                        sleeper = subprocess.Popen(
                            ["sleep", "600"], start_new_session=True, stdin=subprocess.DEVNULL
                        )
                        children.others.append(sleeper)
                        identity = identity_of(sleeper.pid)
                        assert identity is not None
                        pid, ticks, boot = identity.pid, identity.start_ticks, identity.boot_id
                        expected_stopped += 1
                    mark_runner_live(
                        tx,
                        launch.claim,
                        runner_epoch=epoch,
                        pid=pid if group != 5 else None,
                        process_start_time=ticks if group != 5 else None,
                    )
                    if group in (2, 3):
                        record_process(
                            tx, epoch, pid=pid, start_ticks=ticks, boot_id=boot, role="runner"
                        )
                    prep = start_node_attempt(
                        tx,
                        launch.claim,
                        attempt_id=f"attempt-{uuid.uuid4().hex}",
                        node_path="prep",
                        node_type="compute",
                    )
                    if group in (2, 3, 5):
                        expected_requeued += 1
                        continue
                    if group == 6:
                        pause_run(tx, run_id, claim=launch.claim)
                        continue
                    finish_node_attempt(
                        tx,
                        launch.claim,
                        attempt_id=prep.attempt_id,
                        output={"n": i},
                        next_node_path="gate",
                    )
                    gate = start_node_attempt(
                        tx,
                        launch.claim,
                        attempt_id=f"attempt-{uuid.uuid4().hex}",
                        node_path="gate",
                        node_type="checkpoint",
                    )
                    finish_node_attempt(
                        tx,
                        launch.claim,
                        attempt_id=gate.attempt_id,
                        output={"summary": "bench checkpoint"},
                        next_node_path="after",
                    )

                    def open_decision(
                        tx: Any, run_id: str = run_id, attempt: str = gate.attempt_id
                    ) -> None:
                        open_checkpoint_decision(
                            tx,
                            run_id,
                            attempt_id=attempt,
                            node_path="gate",
                            request={"summary": "bench checkpoint"},
                        )

                    wait_run(tx, launch.claim, reason="checkpoint", change=open_decision)
    finally:
        db.close()
    return expected_requeued, expected_stopped


# --- measuring ------------------------------------------------------------------------------


def rescheduled(state: Path, dead_epoch: int) -> bool:
    try:
        db = readonly(state)
    except sqlite3.Error:
        return False
    try:
        db.execute("BEGIN")
        lease = db.execute("SELECT epoch, owner_id FROM server_lease").fetchone()
        if lease is None or lease[0] <= dead_epoch:
            return False
        orphaned_open = db.execute(
            "SELECT COUNT(*) FROM runner_epochs w WHERE w.status IN ('starting', 'ready') "
            "AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.resource = w.run_id "
            "AND l.owner_id = ?)",
            (lease[1],),
        ).fetchone()[0]
        held = db.execute(
            "SELECT COUNT(*) FROM run_queue q LEFT JOIN leases l ON l.resource = q.run_id "
            "WHERE q.state IN ('starting', 'running') "
            "AND (l.owner_id IS NULL OR l.owner_id != ?)",
            (lease[1],),
        ).fetchone()[0]
        db.execute("COMMIT")
        return bool(orphaned_open == 0 and held == 0)
    except sqlite3.Error:
        return False
    finally:
        db.close()


def accepts(state: Path) -> bool:
    try:
        with WorkflowClient(state, autostart=False, timeout=5) as client:
            client.call("server.status")
    except Exception:  # noqa: BLE001 - not up yet, whatever the reason
        return False
    return True


def poll(condition: Any, began: float, timeout: float, out: list[float]) -> None:
    deadline = began + timeout
    while time.perf_counter() < deadline:
        if condition():
            out.append(time.perf_counter() - began)
            return
        time.sleep(POLL_S)


def recovery_report(state: Path) -> dict[str, Any]:
    report: dict[str, Any] = {}
    for line in (state / "logs" / "server.log").read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            record = json.loads(line)
            if record.get("action") == "server.recovered":
                report = record
    return report


def one_sample(runs: int, root: Path) -> Sample:
    state = root / "agent" / "workflows"
    project = root / "project"
    folder = project / ".pi" / "workflows"
    folder.mkdir(parents=True)
    (folder / "bench-gate.workflow.py").write_text(GATE)
    (folder / "bench-sleepy.workflow.py").write_text(SLEEPY)
    children = Children()
    try:
        template, dead_pid = real_phase(state, project, children)
        expected_requeued, expected_stopped = write_in_flight(
            state, template, runs, dead_pid, children
        )
        with contextlib.closing(readonly(state)) as db:
            dead_epoch = db.execute("SELECT epoch FROM server_lease").fetchone()[0]
        accepted: list[float] = []
        recovered: list[float] = []
        began = time.perf_counter()
        server = spawn_server(state, children)
        threads = [
            threading.Thread(target=poll, args=(lambda: accepts(state), began, 60, accepted)),
            threading.Thread(
                target=poll,
                args=(lambda: rescheduled(state, dead_epoch), began, 60, recovered),
            ),
        ]
        for thread in threads:
            thread.start()
        assert server.stdout is not None
        line = server.stdout.readline().decode()
        ready_line = time.perf_counter() - began
        for thread in threads:
            thread.join()
        if "running" not in line or not accepted or not recovered:
            raise RuntimeError(f"the replacement server did not recover: {line!r}")
        with WorkflowClient(state, autostart=False, timeout=120) as client:
            verify = client.call("state.verify")["receipt"]
        if not verify["consistent"]:
            raise RuntimeError(f"state verify after recovery: {verify['findings'][:5]}")
        report = recovery_report(state)
        return Sample(
            runs=runs,
            accept_s=accepted[0],
            ready_line_s=ready_line,
            reschedule_s=recovered[0],
            requeued=int(report.get("runs_requeued", -1)),
            processes_stopped=int(report.get("processes_stopped", -1)),
            expected_requeued=expected_requeued,
            expected_stopped=expected_stopped,
        )
    finally:
        children.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--small", type=int, default=10)
    parser.add_argument("--samples", type=int, default=3)
    args = parser.parse_args(argv)
    results: dict[int, list[Sample]] = {args.small: [], args.runs: []}
    for index in range(args.samples):
        for runs in (args.small, args.runs):
            root = Path(tempfile.mkdtemp(prefix="piw-brec-", dir="/tmp"))
            try:
                sample = one_sample(runs, root)
            finally:
                shutil.rmtree(root, ignore_errors=True)
            results[runs].append(sample)
            print(
                f"sample {index + 1} runs {runs:5d}: accepting {sample.accept_s * 1000:7.1f} ms "
                f"(ready line {sample.ready_line_s * 1000:7.1f} ms), rescheduled "
                f"{sample.reschedule_s * 1000:7.1f} ms; requeued {sample.requeued}/"
                f"{sample.expected_requeued}, processes stopped {sample.processes_stopped}/"
                f"{sample.expected_stopped}",
                flush=True,
            )
    failures = []
    medians: dict[int, tuple[float, float]] = {}
    for runs, samples in results.items():
        medians[runs] = (
            statistics.median(s.accept_s for s in samples),
            statistics.median(s.reschedule_s for s in samples),
        )
        for s in samples:
            if s.requeued != s.expected_requeued or s.processes_stopped != s.expected_stopped:
                failures.append(f"{runs} runs: recovery report {s}")
    small, large = medians[args.small], medians[args.runs]
    print()
    print(f"median of {args.samples} samples")
    print(f"{'runs':>6} {'accepting':>12} {'rescheduled':>12}")
    for runs in (args.small, args.runs):
        print(f"{runs:>6} {medians[runs][0] * 1000:>9.1f} ms {medians[runs][1] * 1000:>9.1f} ms")
    print(
        f"ratio {args.runs} vs {args.small}: accepting {large[0] / small[0]:.2f}x, "
        f"rescheduled {large[1] / small[1]:.2f}x"
    )
    accept_ok = large[0] <= ACCEPT_TARGET_S
    resched_ok = large[1] <= RESCHEDULE_TARGET_S
    print(
        f"target at {args.runs} runs: accepting <= {ACCEPT_TARGET_S:.0f} s: "
        f"{'met' if accept_ok else 'MISSED'} ({large[0]:.3f} s); all rescheduled <= "
        f"{RESCHEDULE_TARGET_S:.0f} s: {'met' if resched_ok else 'MISSED'} ({large[1]:.3f} s)"
    )
    for failure in failures:
        print(f"FAILED: {failure}")
    return 0 if accept_ok and resched_ok and not failures else 1


if __name__ == "__main__":
    sys.exit(main())
