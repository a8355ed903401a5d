"""Output caps at the issue's sizes (issue 11, item 2), each against a baseline in the run.

An embedded server runs real runners:

- a compute node prints 200 MB, and another prints as fast as it can for 10 s while the
  runner log's size is sampled: the log's final and peak size, against what was printed
  (before the change: a 200 MiB log, a 3.36 GiB peak);
- a shell command prints 1.5 GB: the runner's peak RSS (VmHWM, read by the runner in
  the next node), against the same runner around a command that prints nothing
  (before: 2.63 GiB);
- a shell command prints 200 KB of NUL bytes (1.2 MB of JSON, by reference): the time
  to a completed run, against 200 KB of plain text (inline);
- a command exits after 1 s and leaves `sleep 600 &` holding its stdout: the time to its
  result, against the same command without the background process.

Run: .venv/bin/python benchmarks/bench_output.py
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.actors._process_supervisor import LOG_CAP_BYTES

MB = 1_000_000
MIB = 1024 * 1024

WORKFLOWS = {
    "prints": """
import sys, time
from pi_workflows import compute, define_workflow

def flood(ctx):
    chunk = "p" * (1024 * 1024 - 1)
    if ctx.input.get("seconds"):
        printed, end = 0, time.monotonic() + ctx.input["seconds"]
        while time.monotonic() < end:
            print(chunk)
            printed += 1024 * 1024
        return {"printed": printed}
    for _ in range(ctx.input["mib"]):
        print(chunk)
    return {"printed": ctx.input["mib"] * 1024 * 1024}

workflow = define_workflow(name="prints", start_at="flood", nodes={"flood": compute(flood)})
""",
    "loud": """
from pathlib import Path
from pi_workflows import compute, define_workflow, shell

def peak(ctx):
    status = Path("/proc/self/status").read_text()
    kib = int(next(l for l in status.splitlines() if l.startswith("VmHWM:")).split()[1])
    Path(ctx.input["report"]).write_text(str(kib))
    return {"kept": len(ctx.outputs["noise"]["stdout"])}

workflow = define_workflow(
    name="loud",
    start_at="noise",
    nodes={
        "noise": shell(lambda ctx: ["sh", "-c", ctx.input["script"]], timeout=600),
        "peak": compute(peak),
    },
    edges=[{"from": "noise", "to": "peak"}],
)
""",
}


def _run(client: WorkflowClient, project: Path, name: str, given: dict[str, Any]) -> float:
    """Start a run and wait until it is terminal; the seconds it took."""
    started = time.monotonic()
    run_id = client.call(
        "run.start", {"workflow": name, "input": given, "projectPath": str(project)}
    )["receipt"]["runId"]
    view = client.wait(run_id, timeout=600)  # the run's subscription, not a poll
    assert view["display"]["status"] == "completed", view
    return time.monotonic() - started


def _newest_log(state: Path) -> Path:
    return max((state / "logs" / "runners").glob("*.log"), key=lambda p: p.stat().st_mtime)


def _sampled_peak(state: Path, stop: threading.Event, peak: list[int]) -> None:
    while not stop.is_set():
        for log in (state / "logs" / "runners").glob("*.log"):
            try:
                peak[0] = max(peak[0], log.stat().st_size)
            except OSError:
                continue
        time.sleep(0.02)


def _logs(client: WorkflowClient, project: Path, state: Path) -> None:
    _run(client, project, "prints", {"mib": 200})
    size = _newest_log(state).stat().st_size
    print(
        f"compute prints 200 MiB: runner log {size / MIB:7.2f} MiB "
        f"({size / (200 * MIB):.4f}x printed; cap {LOG_CAP_BYTES / MIB:.0f} MiB "
        f"{'HELD' if size <= LOG_CAP_BYTES + 200 else 'NOT HELD'})"
    )
    stop, peak = threading.Event(), [0]
    sampler = threading.Thread(target=_sampled_peak, args=(state, stop, peak), daemon=True)
    sampler.start()
    server_before = psutil.Process().memory_info().rss
    _run(client, project, "prints", {"seconds": 10})
    stop.set()
    sampler.join()
    server_growth = psutil.Process().memory_info().rss - server_before
    print(
        f"compute prints for 10 s: peak runner log {peak[0] / MIB:7.2f} MiB "
        f"(cap {LOG_CAP_BYTES / MIB:.0f} MiB {'HELD' if peak[0] <= LOG_CAP_BYTES + 200 else 'NOT HELD'}); "
        f"server RSS grew {server_growth / MIB:.1f} MiB"
    )


def _shell_memory(client: WorkflowClient, project: Path, root: Path) -> None:
    report = root / "vmhwm"
    quiet = {"script": "true", "report": str(report)}
    _run(client, project, "loud", quiet)
    baseline = int(report.read_text())
    loud = {
        "script": "head -c 1500000000 /dev/zero | tr '\\0' x",
        "report": str(report),
    }
    took = _run(client, project, "loud", loud)
    peak = int(report.read_text())
    print(
        f"shell prints 1.5 GB: runner peak RSS {peak / 1024:6.1f} MiB "
        f"({peak / baseline:.2f}x a silent command's {baseline / 1024:.1f} MiB; "
        f"target < 100 MB {'MET' if peak * 1024 < 100 * MB else 'NOT MET'}; {took:.1f} s)"
    )


def _references(client: WorkflowClient, project: Path, root: Path) -> None:
    report = str(root / "vmhwm")
    text = {"script": "head -c 200000 /dev/zero | tr '\\0' x", "report": report}
    nul = {"script": "head -c 200000 /dev/zero", "report": report}
    inline = min(_run(client, project, "loud", text) for _ in range(5))
    by_reference = min(_run(client, project, "loud", nul) for _ in range(5))
    print(
        f"200 KB of NUL (by reference) completes in {by_reference * 1000:6.1f} ms "
        f"({by_reference / inline:.2f}x 200 KB of text inline, {inline * 1000:.1f} ms)"
    )


def _background(client: WorkflowClient, project: Path, root: Path) -> None:
    report = str(root / "vmhwm")
    pid_file = root / "background.pid"
    plain = _run(client, project, "loud", {"script": "echo done; sleep 1", "report": report})
    script = f"sleep 600 & echo $! > {pid_file}; echo done; sleep 1"
    held = _run(client, project, "loud", {"script": script, "report": report})
    leftover = psutil.Process(int(pid_file.read_text()))
    if leftover.name() == "sleep":
        leftover.kill()
    print(
        f"a command that exits after 1 s with `sleep 600 &` on its stdout: result in "
        f"{held:.2f} s ({held / plain:.2f}x the same command alone, {plain:.2f} s)"
    )


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="piw-out-", dir="/tmp") as folder:
        root = Path(folder)
        state = root / "state"
        project = root / "project"
        workflows = project / ".pi" / "workflows"
        workflows.mkdir(parents=True)
        for name, source in WORKFLOWS.items():
            (workflows / f"{name}.workflow.py").write_text(source)
        server = WorkflowServer(state, idle_exit_s=None, execute_runs=True)
        server.start()
        try:
            with WorkflowClient(state, autostart=False, timeout=600) as client:
                _logs(client, project, state)
                _shell_memory(client, project, root)
                _references(client, project, root)
                _background(client, project, root)
        finally:
            server.stop("benchmark done")


if __name__ == "__main__":
    main()
