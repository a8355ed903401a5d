"""A 3-compute-node run end to end through the daemon against DBOS, in one run.

pi-workflows: a real `server run --max-workers 4` process and `WorkflowClient`; a
workflow `three` (compute nodes a -> b -> c, each returning a small dict) in a temp
project. Latency is `run.start` to `display.status == "completed"` as the run's
subscription shows it (`LiveViews.watch_run`, as `WorkflowClient.wait` waits; the
server sends each committed revision at once) over 200 sequential runs; `--poll`
polls `run.get` every POLL_S instead (how it waited before); throughput is completions in 10 s
with 4 server workers and IN_FLIGHT client threads keeping the workers busy, one
`view.subscribe` runList client reporting completions.

DBOS: a 3-step workflow doing the same work, SQLite system database in WAL with
`synchronous=FULL` (the same durability the server's state database uses), run in
a child process so its background threads and imports stay out of this process.
Latency is `DBOS.start_workflow` to `handle.get_result()` over 200 sequential
workflows; throughput is workflows finished in 10 s by 4 threads doing the same.

Target (issue 5): p50 no slower than DBOS, throughput at least DBOS's.
Install DBOS with `.venv/bin/pip install -e '.[bench]'`; without it the DBOS part is
skipped with the reason printed.
Run: .venv/bin/python benchmarks/bench_runs.py [--runs 200] [--seconds 10]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _server import workflow_server as start_server

from pi_workflows import WorkflowClient
from pi_workflows.errors import PiWorkflowsError

WORKERS = 4
IN_FLIGHT = 8  # client threads for the throughput phase: 4 running + 4 resolving/queued
WARMUP = 3
POLL_S = 0.002  # run.get poll interval of the latency phase with --poll
RUN_TIMEOUT_S = 30.0
SETTLED = ("completed", "failed", "timed_out", "cancelled", "waiting", "paused", "ambiguous")

THREE_WORKFLOW = """
from pi_workflows import compute, define_workflow


def a(ctx):
    return {"x": 1}


def b(ctx):
    return {"y": ctx.outputs["a"]["x"] + 1}


def c(ctx):
    return {"z": ctx.outputs["b"]["y"] + 1}


workflow = define_workflow(
    name="three",
    start_at="a",
    nodes={"a": compute(a), "b": compute(b), "c": compute(c)},
    edges=[{"from": "a", "to": "b"}, {"from": "b", "to": "c"}],
)
"""


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


# --- pi-workflows --------------------------------------------------------------------


def workflow_server(state_dir: Path) -> contextlib.AbstractContextManager[object]:
    return start_server(state_dir, ["--max-workers", str(WORKERS)])


class Runner:
    """One client connection that starts `three` runs and waits for them."""

    def __init__(self, state_dir: Path, project: Path, name: str) -> None:
        self.client = WorkflowClient(state_dir, autostart=False, client_id=f"bench-{name}")
        self.client.connect()
        self.live = self.client.live(autostart=False)
        self.project = str(project)

    def start(self) -> str:
        payload = {"workflow": "three", "input": {}, "projectPath": self.project}
        response = self.client.call("run.start", payload)
        return str(response["receipt"]["runId"])

    def wait(self, run_id: str, poll_s: float, marks: dict[str, float] | None = None) -> str:
        """Until the run settles: by its subscription, or by polling when `poll_s` > 0."""
        if poll_s <= 0:
            for view in self.live.watch_run(run_id, timeout=RUN_TIMEOUT_S):
                status = view["display"]["status"]
                if marks is not None and status not in marks:
                    marks[status] = time.perf_counter()
                if status in SETTLED:
                    return str(status)
        deadline = time.perf_counter() + RUN_TIMEOUT_S
        while True:
            status = self.client.call("run.get", run_id=run_id)["receipt"]["display"]["status"]
            if marks is not None and status not in marks:
                marks[status] = time.perf_counter()
            if status in SETTLED:
                return str(status)
            if time.perf_counter() > deadline:
                raise TimeoutError(f"run {run_id} still {status} after {RUN_TIMEOUT_S:.0f} s")
            time.sleep(poll_s)

    def one(self, poll_s: float) -> tuple[float, dict[str, float]]:
        """Start one run and wait for it; return its latency and phase offsets."""
        began = time.perf_counter()
        run_id = self.start()
        accepted = time.perf_counter()
        marks: dict[str, float] = {}
        status = self.wait(run_id, poll_s, marks)
        ended = time.perf_counter()
        if status != "completed":
            raise RuntimeError(f"run {run_id} ended {status}, not completed")
        phases = {"run.start (resolver)": accepted - began}
        if "running" in marks:
            phases["accepted -> running seen"] = marks["running"] - accepted
            phases["running -> completed seen"] = ended - marks["running"]
        return ended - began, phases

    def close(self) -> None:
        self.live.close()
        self.client.close()


def piw_latency(state_dir: Path, project: Path, runs: int, poll_s: float) -> dict[str, Any]:
    runner = Runner(state_dir, project, "latency")
    try:
        for _ in range(WARMUP):
            runner.one(poll_s)
        samples: list[float] = []
        phases: dict[str, list[float]] = {}
        for _ in range(runs):
            latency, marks = runner.one(poll_s)
            samples.append(latency)
            for name, value in marks.items():
                phases.setdefault(name, []).append(value)
    finally:
        runner.close()
    return {"samples": samples, "phases": phases}


class Watcher:
    """A dedicated client subscribed to `runList`: settles waiters as runs finish.

    One push subscription instead of a poller per thread keeps the client's own CPU
    and request load off a small machine; events come on the server's tick, which
    delays noticing a completion (and so the next start) but not the run itself.
    """

    def __init__(self, state_dir: Path) -> None:
        self.client = WorkflowClient(state_dir, autostart=False, client_id="bench-watcher")
        self.client.connect()
        self.client.call("view.subscribe", {"kind": "runList"})
        self.client.set_read_timeout(0.5)
        self.settled: dict[str, tuple[str, float]] = {}
        self.waiters: dict[str, threading.Event] = {}
        self.lock = threading.Lock()
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while not self.closing.is_set():
            try:
                message = self.client.read_message()
            except TimeoutError:
                continue
            except OSError:
                return
            if message is None:
                return
            if message.get("type") != "event":
                continue
            now = time.perf_counter()
            with self.lock:
                for item in message["payload"].get("items", []):
                    status = item["display"]["status"]
                    if status in SETTLED and item["runId"] not in self.settled:
                        self.settled[item["runId"]] = (status, now)
                        waiter = self.waiters.pop(item["runId"], None)
                        if waiter is not None:
                            waiter.set()

    def wait(self, run_id: str) -> tuple[str, float]:
        with self.lock:
            if run_id not in self.settled:
                waiter = self.waiters.setdefault(run_id, threading.Event())
            else:
                waiter = None
        if waiter is not None and not waiter.wait(RUN_TIMEOUT_S):
            raise TimeoutError(f"run {run_id} did not settle in {RUN_TIMEOUT_S:.0f} s")
        return self.settled[run_id]

    def close(self) -> None:
        self.closing.set()
        self.thread.join(5)
        self.client.close()


def piw_throughput(state_dir: Path, project: Path, seconds: float) -> dict[str, Any]:
    stop = threading.Event()
    window: dict[str, float] = {}
    completed: list[float] = []
    other: list[str] = []
    errors: list[str] = []
    lock = threading.Lock()
    ready = threading.Barrier(IN_FLIGHT + 1)
    watcher = Watcher(state_dir)

    def work(index: int) -> None:
        runner = Runner(state_dir, project, f"tp{index}")
        try:
            ready.wait()
            while not stop.is_set():
                status, seen = watcher.wait(runner.start())
                with lock:
                    if status == "completed":
                        completed.append(seen)
                    else:
                        other.append(status)
        except (PiWorkflowsError, OSError) as exc:  # reported; the phase goes on without it
            with lock:
                errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            runner.close()

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(IN_FLIGHT)]
    try:
        for thread in threads:
            thread.start()
        ready.wait()
        window["start"] = time.perf_counter()
        time.sleep(seconds)
        window["end"] = time.perf_counter()
        stop.set()
        for thread in threads:
            thread.join(RUN_TIMEOUT_S)
    finally:
        watcher.close()
    inside = [t for t in completed if window["start"] <= t <= window["end"]]
    return {
        "completed": len(inside),
        "per_s": len(inside) / seconds,
        "other": other,
        "errors": errors,
    }


def run_piw(folder: Path, runs: int, seconds: float, poll_s: float) -> dict[str, Any]:
    state_dir = folder / "agent" / "workflows"
    project = folder / "project"
    (project / ".pi" / "workflows").mkdir(parents=True)
    (project / ".pi" / "workflows" / "three.workflow.py").write_text(THREE_WORKFLOW)
    with workflow_server(state_dir):
        latency = piw_latency(state_dir, project, runs, poll_s)
        throughput = piw_throughput(state_dir, project, seconds)
    return {**latency, **throughput}


def cold_import_s() -> dict[str, float]:
    """Wall time of a fresh interpreter, bare and importing the runner's modules."""
    result = {}
    for label, code in (
        ("bare interpreter", "pass"),
        ("interpreter + import pi_workflows.engine.runner", "import pi_workflows.engine.runner"),
        ("interpreter + import pi_workflows.engine.resolve", "import pi_workflows.engine.resolve"),
    ):
        samples = []
        for _ in range(5):
            began = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True)
            samples.append(time.perf_counter() - began)
        result[label] = percentile(samples, 0.5)
    return result


def zygote_fork_s(samples: int = 50) -> dict[str, float]:
    """p50 of forking a pre-imported child through the zygote, against a cold interpreter.

    The child is the resolver module given an empty request (it exits at once): `spawn`
    is the fork round trip the server waits for; `spawn to exit reported` includes the
    child running and the zygote reaping and reporting it.
    """
    import socket  # noqa: PLC0415
    from concurrent.futures import Future  # noqa: PLC0415

    from pi_workflows.supervision._zygote_client import Zygote  # noqa: PLC0415

    zygote = Zygote(["pi_workflows.engine.resolve"])
    spawns: list[float] = []
    lives: list[float] = []
    try:
        for _ in range(samples + 3):
            ours, theirs = socket.socketpair()
            exited: Future[int | None] = Future()
            began = time.perf_counter()
            zygote.spawn(
                "pi_workflows.engine.resolve",
                env=os.environ,
                cwd=None,
                fds=[("stdin", theirs.fileno()), ("stdout", theirs.fileno())],
                on_exit=exited.set_result,
            )
            spawned = time.perf_counter()
            theirs.close()
            ours.close()  # empty request: the child exits at once
            exited.result(30)
            spawns.append(spawned - began)
            lives.append(time.perf_counter() - began)
    finally:
        zygote.close()
    cold = []
    for _ in range(5):
        began = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import pi_workflows.engine.resolve"], check=True)
        cold.append(time.perf_counter() - began)
    return {
        "zygote spawn (fork round trip)": percentile(spawns[3:], 0.5),
        "zygote spawn to exit reported": percentile(lives[3:], 0.5),
        "cold interpreter + imports to exit": percentile(cold, 0.5),
    }


# --- DBOS (runs in a child process: `bench_runs.py --dbos-child FOLDER SECONDS RUNS`) ---


def dbos_child(folder: Path, runs: int, seconds: float) -> None:
    # optional: only the `bench` extra installs them
    import sqlalchemy as sa  # noqa: PLC0415
    from dbos import DBOS  # noqa: PLC0415

    database = folder / "dbos.sqlite"
    checked: dict[str, Any] = {}

    @sa.event.listens_for(sa.engine.Engine, "connect")
    def durable(dbapi_conn: Any, record: Any) -> None:
        if isinstance(dbapi_conn, sqlite3.Connection):
            dbapi_conn.execute("PRAGMA journal_mode=WAL")
            dbapi_conn.execute("PRAGMA synchronous=FULL")
            checked["journal_mode"] = dbapi_conn.execute("PRAGMA journal_mode").fetchone()[0]
            checked["synchronous"] = dbapi_conn.execute("PRAGMA synchronous").fetchone()[0]

    @DBOS.step()
    def step_a() -> dict[str, int]:
        return {"x": 1}

    @DBOS.step()
    def step_b(a: dict[str, int]) -> dict[str, int]:
        return {"y": a["x"] + 1}

    @DBOS.step()
    def step_c(b: dict[str, int]) -> dict[str, int]:
        return {"z": b["y"] + 1}

    @DBOS.workflow()
    def three() -> dict[str, int]:
        return step_c(step_b(step_a()))

    DBOS(
        config={
            "name": "bench-runs",
            "system_database_url": f"sqlite:///{database}",
            "log_level": "WARNING",
        }
    )
    DBOS.launch()
    try:

        def one() -> float:
            began = time.perf_counter()
            result = DBOS.start_workflow(three).get_result()
            elapsed = time.perf_counter() - began
            assert result == {"z": 3}, result
            return elapsed

        for _ in range(WARMUP):
            one()
        samples = [one() for _ in range(runs)]

        stop = threading.Event()
        finished: list[float] = []
        lock = threading.Lock()
        ready = threading.Barrier(WORKERS + 1)

        def work() -> None:
            ready.wait()
            while not stop.is_set():
                one()
                now = time.perf_counter()
                with lock:
                    finished.append(now)

        threads = [threading.Thread(target=work, daemon=True) for _ in range(WORKERS)]
        for thread in threads:
            thread.start()
        ready.wait()
        start = time.perf_counter()
        time.sleep(seconds)
        end = time.perf_counter()
        stop.set()
        for thread in threads:
            thread.join(RUN_TIMEOUT_S)
        inside = [t for t in finished if start <= t <= end]
    finally:
        DBOS.destroy()
    output = {
        "samples": samples,
        "completed": len(inside),
        "per_s": len(inside) / seconds,
        "pragmas": checked,
    }
    (folder / "dbos.json").write_text(json.dumps(output))


def run_dbos(folder: Path, runs: int, seconds: float) -> tuple[dict[str, Any] | None, str]:
    """Run the DBOS part in a child; return (figures, "") or (None, why it was skipped)."""
    probe = subprocess.run(
        [sys.executable, "-c", "import dbos, sqlalchemy; print(dbos.__file__)"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return None, (
            f"DBOS is not importable here ({last}); install it with "
            "`.venv/bin/pip install -e '.[bench]'`"
        )
    dbos_folder = folder / "dbos"
    dbos_folder.mkdir()
    try:
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                "--dbos-child",
                str(dbos_folder),
                "--runs",
                str(runs),
                "--seconds",
                str(seconds),
            ],
            capture_output=True,
            text=True,
            timeout=seconds + 120,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None, "the DBOS child did not finish in time"
    result_file = dbos_folder / "dbos.json"
    if child.returncode != 0 or not result_file.exists():
        tail = " | ".join(child.stderr.strip().splitlines()[-3:]) or "no output"
        return None, f"the DBOS child failed (exit {child.returncode}): {tail}"
    return json.loads(result_file.read_text()), ""


# --- report --------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="sequential runs for p50")
    parser.add_argument("--seconds", type=float, default=10.0, help="throughput window")
    parser.add_argument(
        "--poll", action="store_true", help="wait by polling run.get, not the subscription"
    )
    parser.add_argument("--dbos-child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dbos_child is not None:
        dbos_child(args.dbos_child, args.runs, args.seconds)
        return

    folder = Path(tempfile.mkdtemp(dir="/tmp", prefix="piw-"))
    try:
        began = time.perf_counter()
        ours = run_piw(folder, args.runs, args.seconds, POLL_S if args.poll else 0.0)
        dbos, skipped = run_dbos(folder, args.runs, args.seconds)
        imports = cold_import_s()
        forks = zygote_fork_s()
        total = time.perf_counter() - began
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    p50, p90 = percentile(ours["samples"], 0.5), percentile(ours["samples"], 0.9)
    waited = "polling run.get" if args.poll else "the run subscription"
    print(
        f"--- pi-workflows: 3 compute nodes, run.start -> completed ({args.runs} sequential, "
        f"seen through {waited}) ---"
    )
    print(f"p50 {ms(p50)}   p90 {ms(p90)}   min {ms(min(ours['samples']))}")
    print("where the time goes (p50 of each phase, one run at a time):")
    for name, values in ours["phases"].items():
        print(f"  {name:<28} {ms(percentile(values, 0.5))}")
    for label, value in imports.items():
        print(f"  (cold {label}: {ms(value)})")
    print("spawning a runner-like child (p50):")
    for label, value in forks.items():
        print(f"  {label:<36} {ms(value)}")
    cold_child = forks["cold interpreter + imports to exit"]
    print(
        f"  zygote fork is {cold_child / forks['zygote spawn (fork round trip)']:.0f}x faster "
        "than a cold interpreter with the same imports"
    )
    print(
        f"throughput: {ours['completed']} runs completed in {args.seconds:.0f} s "
        f"= {ours['per_s']:.1f} runs/s ({WORKERS} server workers, {IN_FLIGHT} in flight)"
    )
    if ours["other"]:
        print(f"  runs that ended otherwise: {sorted(set(ours['other']))} x{len(ours['other'])}")
    if ours["errors"]:
        print(f"  client errors: {ours['errors'][:3]}")

    if dbos is None:
        print(f"--- DBOS skipped: {skipped} ---")
    else:
        d50, d90 = percentile(dbos["samples"], 0.5), percentile(dbos["samples"], 0.9)
        pragmas = dbos["pragmas"]
        print(
            f"--- DBOS: 3 steps, start_workflow -> get_result ({args.runs} sequential), SQLite "
            f"journal_mode={pragmas.get('journal_mode')} synchronous={pragmas.get('synchronous')} "
            "(2 = FULL) ---"
        )
        print(f"p50 {ms(d50)}   p90 {ms(d90)}   min {ms(min(dbos['samples']))}")
        print(
            f"throughput: {dbos['completed']} workflows in {args.seconds:.0f} s "
            f"= {dbos['per_s']:.1f} workflows/s ({WORKERS} threads)"
        )
        latency_ratio = p50 / d50
        throughput_ratio = ours["per_s"] / dbos["per_s"] if dbos["per_s"] else float("inf")
        print("--- ratios (ours / DBOS) ---")
        print(
            f"p50 latency: {latency_ratio:8.1f}x   target <= 1.0 (lower is better)  "
            f"{'MET' if latency_ratio <= 1.0 else 'NOT MET'}"
        )
        print(
            f"throughput:  {throughput_ratio:8.3f}x   target >= 1.0 (higher is better) "
            f"{'MET' if throughput_ratio >= 1.0 else 'NOT MET'}"
        )
    print(f"(benchmark wall time {total:.0f} s)")


if __name__ == "__main__":
    main()
