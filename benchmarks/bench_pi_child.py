"""One headless pi step through `PiChild` against a bare RPC driver, in one run.

Both start the npm-installed `pi --mode rpc` with the same argv, environment and bridge,
against the same fake provider and script (one `workflow` submit), send the same prompt,
wait for `agent_end`, then end pi. The baseline is the minimal driver of pi-rpc.md § 5
(write the prompt, read lines until `agent_end`, close stdin). Prints p50/p90 of both
and their ratio, and the peak RSS (VmHWM) of the pi child. The issue 12 benchmark (a
whole one-agent-step run, target <= 1.15x at p50) builds on this once the node is wired.
Run: make node_modules && .venv/bin/python benchmarks/bench_pi_child.py
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from pi_workflows.engine._pi_child import PI_BINARY_ENV, PiChild, PiLaunch, PiOptions
from pi_workflows.pi import BridgeConfig, bridge_extension_path, write_bridge_config
from pi_workflows.testing import FAKE_MODEL, FAKE_PROVIDER, FakeProvider, workflow_submit_turn

RUNS = 10
REPO = Path(__file__).resolve().parents[1]
PROMPT = "Do the plan step and submit its output with the workflow tool."


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def make_launch(root: Path, provider: FakeProvider) -> PiLaunch:
    for folder in ("project", "tmp"):
        (root / folder).mkdir(exist_ok=True)
    provider.write_agent_dir(root / "agent")
    config = BridgeConfig("run-1", "request-1", "plan", "attempt-1", "bench")
    return PiLaunch.build(
        environ={**os.environ, PI_BINARY_ENV: str(REPO / "node_modules" / ".bin" / "pi")},
        bridge=bridge_extension_path(),
        cwd=root / "project",
        options=PiOptions(provider=FAKE_PROVIDER, model=FAKE_MODEL),
        agent_dir=root / "agent",
        tmpdir=root / "tmp",
        extra_env=write_bridge_config(root / "bridge.json", config),
        stderr_path=root / "pi.stderr.log",
    )


def with_pi_child(launch: PiLaunch) -> tuple[float, float]:
    start = time.perf_counter()
    child = PiChild.spawn(launch)
    outcome = child.run_turn(PROMPT, 60)
    assert outcome.workflow_calls()[0].is_error is False
    rss = peak_rss_mb(child.pi_pid or child.pid)  # pi itself, below its keeper
    child.stop()
    return time.perf_counter() - start, rss


def bare_driver(launch: PiLaunch) -> tuple[float, float]:
    start = time.perf_counter()
    proc = subprocess.Popen(
        list(launch.argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=launch.cwd,
        env=dict(launch.env),
        start_new_session=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(
        (json.dumps({"id": "p1", "type": "prompt", "message": PROMPT}) + "\n").encode()
    )
    proc.stdin.flush()
    for line in proc.stdout:
        if json.loads(line).get("type") == "agent_end":
            break
    rss = peak_rss_mb(proc.pid)
    proc.stdin.close()
    proc.wait(30)
    return time.perf_counter() - start, rss


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="piw-bench-", dir="/tmp"))
    try:
        with FakeProvider() as provider:
            launch = make_launch(root, provider)
            results: dict[str, list[tuple[float, float]]] = {"PiChild": [], "bare": []}
            for _ in range(RUNS):  # interleaved, so both see the same machine load
                for name, drive in (("bare", bare_driver), ("PiChild", with_pi_child)):
                    provider.script(workflow_submit_turn("plan", "attempt-1", {"summary": "ok"}))
                    results[name].append(drive(launch))
        base = statistics.median(t for t, _ in results["bare"])
        for name, samples in results.items():
            times = sorted(t for t, _ in samples)
            p50, p90 = statistics.median(times), times[int(0.9 * (len(times) - 1))]
            rss = max(r for _, r in samples)
            print(
                f"{name:8} p50 {p50 * 1000:7.0f} ms  p90 {p90 * 1000:7.0f} ms  "
                f"ratio p50 {p50 / base:4.2f}x  pi peak RSS {rss:5.0f} MB"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
