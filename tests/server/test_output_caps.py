"""Captured streams are capped as they are written (issue 11, item 2), through real runs.

A compute node that prints far more than the runner log's cap leaves a log within the
cap plus its marker line; a shell command that prints hundreds of megabytes leaves the
runner's peak resident memory (VmHWM, read by the runner itself after the command)
small. The sizes here are small enough for `make test`; `benchmarks/bench_output.py`
runs the issue's sizes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.actors._process_supervisor import LOG_CAP_BYTES
from pi_workflows.supervision._log_drain import MARKER_MAX_BYTES
from tests.conftest import write_workflow
from tests.server.runs import TERMINAL, start_run, wait_for

pytestmark = pytest.mark.timeout(180)

PRINTS = """
import sys

from pi_workflows import compute, define_workflow


def flood(ctx):
    print("FIRST LINE", flush=True)
    chunk = "p" * (1024 * 1024 - 1)
    for _ in range(ctx.input["mib"]):
        print(chunk)
    print("LAST LINE", file=sys.stderr, flush=True)
    return {"printed": ctx.input["mib"]}


workflow = define_workflow(name="prints", start_at="flood", nodes={"flood": compute(flood)})
"""


def test_a_compute_that_prints_50_mb_leaves_a_runner_log_within_its_cap(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "prints", PRINTS)
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "prints", {"mib": 50})
        view = wait_for(client, run_id, TERMINAL)
    assert view["display"]["status"] == "completed", view
    logs = list((running_server.state_dir / "logs" / "runners").glob("*.log"))
    assert len(logs) == 1
    data = _settled(logs[0], b"LAST LINE\n")
    assert len(data) <= LOG_CAP_BYTES + MARKER_MAX_BYTES, "50 MiB printed, the cap held"
    assert b"FIRST LINE\n" in data[:4096], "the head is kept"
    assert data.endswith(b"LAST LINE\n"), "and the tail"
    marker = re.search(rb"\[pi-workflows: (\d+) bytes of output were dropped", data)
    assert marker is not None and int(marker.group(1)) > 40 * 1024 * 1024


def _settled(log: Path, tail: bytes) -> bytes:
    """The log once its tail is written (just after the runner was reaped) and it no
    longer changes: the drain rewrites the marker and the tail in place, so a read that
    overlaps that rewrite can see the new tail with the old marker."""
    import time  # noqa: PLC0415 - only this wait needs it

    deadline = time.monotonic() + 30
    previous = b""
    while True:
        data = log.read_bytes()
        if (data.endswith(tail) and data == previous) or time.monotonic() > deadline:
            return data
        previous = data
        time.sleep(0.05)


LOUD_SHELL = """
from pathlib import Path

from pi_workflows import compute, define_workflow, shell


def peak(ctx):
    status = Path("/proc/self/status").read_text()
    kib = int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1])
    noise = ctx.outputs["noise"]
    report = {
        "vmhwmKib": kib,
        "stdout": len(noise["stdout"]),
        "stdoutTruncatedBytes": noise.get("stdoutTruncatedBytes", 0),
        "stderr": noise["stderr"],
        "exitCode": noise["exitCode"],
        "truncated": noise["truncated"],
    }
    Path(ctx.input["report"]).write_text(__import__("json").dumps(report))
    return {}


workflow = define_workflow(
    name="loud",
    start_at="noise",
    nodes={
        "noise": shell(
            lambda ctx: ["sh", "-c", f"head -c {ctx.input['bytes']} /dev/zero | tr '\\\\0' x;"
                         " echo done >&2"],
            timeout=120,
        ),
        "peak": compute(peak),
    },
    edges=[{"from": "noise", "to": "peak"}],
)
"""


def test_a_shell_printing_300_mb_keeps_the_runner_under_100_mb(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "loud", LOUD_SHELL)
    report = short_tmp / "report.json"
    total = 300_000_000
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "loud", {"bytes": total, "report": str(report)})
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
    assert view["display"]["status"] == "completed", view
    seen = json.loads(report.read_text())
    assert seen["vmhwmKib"] < 100 * 1024, f"the runner peaked at {seen['vmhwmKib']} KiB"
    assert seen["exitCode"] == 0 and seen["stderr"] == "done\n"
    assert seen["truncated"] is True
    assert seen["stdout"] + seen["stdoutTruncatedBytes"] == total, "all kept or counted"
