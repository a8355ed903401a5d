"""`piw` on a long run against a short one, and idle (issue 27).

Prints, for a 30,000-step loop against a 30-step one, run in one invocation:
- `piw RUN_ID --once` wall time (median of 5; target ≤ 2×);
- the RSS of a `piw RUN_ID` that followed the run to its end in a real terminal (tmux;
  target ≤ 1.5×);
- then the CPU that `piw` uses over 60 s with nothing changing (target ≤ 1 % of one core;
  `PIW_BENCH_IDLE_S` shortens it).

A real server (`server run`), real runs, the real `piw` program; nothing is mocked.
Run it on a quiet machine: `python benchmarks/bench_piw.py`.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _server import workflow_server

from pi_workflows.wire.client import WorkflowClient
from tests.viewer.tmux_piw import TmuxPane

LONG = 30_000
SHORT = 30
ONCE_REPEATS = 5
PIW = Path(sys.executable).parent / "piw"
IDLE_S = float(os.environ.get("PIW_BENCH_IDLE_S", "60"))

LOOP = """
from pi_workflows import compute, define_workflow


def step(ctx):
    done = ctx.outputs.get("step", {"i": 0})["i"] + 1
    return {"i": done, "more": done < ctx.input["steps"]}


workflow = define_workflow(
    name="loop",
    start_at="step",
    nodes={"step": compute(step), "done": compute(lambda ctx: {"steps": ctx.input["steps"]})},
    edges=[{"from": "step", "switch": {"on": "$.more", "cases": {True: "step"}, "default": "done"}}],
    max_steps=40_000,
)
"""


def _start(client: WorkflowClient, project: Path, steps: int) -> str:
    answer = client.call(
        "run.start", {"workflow": "loop", "input": {"steps": steps}, "projectPath": str(project)}
    )
    return str(answer["receipt"]["runId"])


def _wait_done(client: WorkflowClient, run_id: str, timeout: float = 1800.0) -> None:
    deadline = time.monotonic() + timeout
    with client.live(timeout=60) as live:
        for view in live.watch_run(run_id, timeout=timeout):
            if view["display"]["status"] in ("completed", "failed", "cancelled"):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(run_id)


def _once_seconds(state_dir: Path, run_id: str) -> float:
    samples = []
    command = [str(PIW), "--state-dir", str(state_dir)]
    for _ in range(ONCE_REPEATS):
        began = time.perf_counter()
        subprocess.run([*command, run_id, "--once"], check=True, capture_output=True, timeout=120)
        samples.append(time.perf_counter() - began)
    return statistics.median(samples)


def _follow(
    root: Path, state_dir: Path, client: WorkflowClient, project: Path, steps: int
) -> tuple[float, float]:
    """Start a run, follow it in `piw` to its end; (RSS MiB at the end, idle CPU %)."""
    run_id = _start(client, project, steps)
    pane = TmuxPane(root / f"tmux-{steps}")
    (root / f"tmux-{steps}").mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(root), "TERM": "xterm-256color",
           "PIW_CONFIG_PATH": str(root / "piw.toml")}  # fmt: skip
    try:
        viewer = pane.launch(
            [str(PIW), "--state-dir", str(state_dir), run_id],
            env,
        )
        _wait_done(client, run_id)
        pane.wait_screen(lambda text: "completed" in text, "the completed run", timeout=300)
        rss = viewer.memory_info().rss / 2**20
        before = viewer.cpu_times()
        time.sleep(IDLE_S)  # the measurement itself: nothing changes meanwhile
        after = viewer.cpu_times()
        cpu = (after.user + after.system - before.user - before.system) / IDLE_S * 100
        return rss, cpu
    finally:
        pane.close()


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="piw-bench-", dir="/tmp"))
    state_dir = root / "workflows"
    project = root / "project"
    (project / ".pi" / "workflows").mkdir(parents=True)
    (project / ".pi" / "workflows" / "loop.workflow.py").write_text(LOOP)
    with workflow_server(state_dir), WorkflowClient(state_dir, autostart=False) as client:
        runs = {}
        for steps in (SHORT, LONG):
            began = time.perf_counter()
            runs[steps] = _start(client, project, steps)
            _wait_done(client, runs[steps])
            print(f"{steps:>6}-step run executed in {time.perf_counter() - began:.1f} s")
        once = {steps: _once_seconds(state_dir, run_id) for steps, run_id in runs.items()}
        print(f"piw --once: {SHORT} steps {once[SHORT] * 1000:.0f} ms, {LONG} steps "
              f"{once[LONG] * 1000:.0f} ms: {once[LONG] / once[SHORT]:.2f}x (target <= 2x)")  # fmt: skip
        followed = {
            steps: _follow(root, state_dir, client, project, steps) for steps in (SHORT, LONG)
        }
        rss = {steps: figures[0] for steps, figures in followed.items()}
        print(f"piw RSS after following: {SHORT} steps {rss[SHORT]:.1f} MiB, {LONG} steps "
              f"{rss[LONG]:.1f} MiB: {rss[LONG] / rss[SHORT]:.2f}x (target <= 1.5x)")  # fmt: skip
        idle = max(figures[1] for figures in followed.values())
        print(f"piw idle CPU over {IDLE_S:.0f} s: {idle:.2f} % of one core (target <= 1 %)")


if __name__ == "__main__":
    main()
