"""The Pi extension in the real pi: a command's round trip, and the memory it adds.

Latency: `/workflow status RUN_ID` sent to `pi --mode rpc` as a prompt, timed from the
write to the `notify` that answers it (pi parses the command, the extension sends one
`run.get` over the server's socket and formats the display), against the raw round trip
of the same `run.get` on the same socket with `WorkflowClient` in this process.
Memory: pi's RSS with the extension loaded, holding its `run` subscription, against pi
with the headless bridge only (same argv, environment and agent dir otherwise).
Prints p50/p99 and ratios. Takes one of the machine's two real-pi slots (the lock files
tests/pi/conftest.py uses).
Run: make node_modules && .venv/bin/python benchmarks/bench_extension.py
"""

from __future__ import annotations

import fcntl
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.engine._pi_child import PI_BINARY_ENV, PiChild, PiLaunch, PiOptions
from pi_workflows.pi import (
    BridgeConfig,
    bridge_extension_path,
    extension_path,
    write_bridge_config,
)
from pi_workflows.testing import FAKE_MODEL, FAKE_PROVIDER, FakeProvider

SAMPLES = 60
MEMORY_RUNS = 3
REPO = Path(__file__).resolve().parents[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def launch(root: Path, entry: Path, extra: dict[str, str]) -> PiLaunch:
    return PiLaunch.build(
        environ={**os.environ, PI_BINARY_ENV: str(REPO / "node_modules" / ".bin" / "pi")},
        bridge=entry,
        cwd=root / "project",
        options=PiOptions(provider=FAKE_PROVIDER, model=FAKE_MODEL),
        agent_dir=root / "agent",
        tmpdir=root / "tmp",
        extra_env=extra,
        stderr_path=root / "pi.stderr.log",
    )


def prompt_to_notify(child: PiChild, text: str) -> float:
    start = time.perf_counter()
    child.send({"type": "prompt", "message": text})
    while True:
        event = child.next_event(30)
        if event.get("type") == "extension_ui_request" and event.get("method") == "notify":
            assert event.get("notifyType") != "error", event
            return time.perf_counter() - start


def started_run(child: PiChild) -> str:
    child.send({"type": "prompt", "message": "/workflow start hello"})
    while True:
        event = child.next_event(30)
        if event.get("method") == "notify":
            return str(event["message"]).rsplit(" ", 1)[-1]


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="piw-bx-", dir="/tmp"))
    slot = (Path(tempfile.gettempdir()) / "pi-workflows-real-pi-0.lock").open("a")
    fcntl.flock(slot, fcntl.LOCK_EX)
    server: WorkflowServer | None = None
    try:
        for folder in ("project", "tmp"):
            (root / folder).mkdir()
        with FakeProvider() as provider:
            provider.write_agent_dir(root / "agent")
            state = root / "agent" / "workflows"
            server = WorkflowServer(state, idle_exit_s=None, tick_s=0.05, execute_runs=True)
            server.start()
            bridge_env = write_bridge_config(
                root / "bridge.json", BridgeConfig("run-1", "request-1", "plan", "a-1", "bench")
            )
            with_ext: list[float] = []
            bridge_only: list[float] = []
            ext_child = None
            for _ in range(MEMORY_RUNS):
                plain = PiChild.spawn(launch(root, bridge_extension_path(), bridge_env))
                plain.wait_ready(60)
                time.sleep(1.0)  # settle: a benchmark's pause, not a test's wait
                bridge_only.append(rss_mb(plain.pi_pid or plain.pid))
                plain.stop()
                child = PiChild.spawn(launch(root, extension_path(), {}))
                child.wait_ready(60)
                run_id = started_run(child)
                prompt_to_notify(child, f"/workflow status {run_id}")
                time.sleep(1.0)
                with_ext.append(rss_mb(child.pi_pid or child.pid))
                if ext_child is None:
                    ext_child = child
                else:
                    child.stop()
            assert ext_child is not None
            through_pi = [
                prompt_to_notify(ext_child, f"/workflow status {run_id}") for _ in range(SAMPLES)
            ]
            ext_child.stop()
            raw: list[float] = []
            with WorkflowClient(state, autostart=False) as client:
                for _ in range(SAMPLES):
                    start = time.perf_counter()
                    client.call("run.get", run_id=run_id)
                    raw.append(time.perf_counter() - start)
    finally:
        if server is not None:
            server.stop("benchmark done")
        slot.close()
        shutil.rmtree(root, ignore_errors=True)
    for name, values in (("/workflow status via pi", through_pi), ("raw run.get", raw)):
        print(
            f"{name:<26} p50 {pct(values, 0.5) * 1000:7.2f} ms  p99 {pct(values, 0.99) * 1000:7.2f} ms"
        )
    print(
        f"ratio p50 {pct(through_pi, 0.5) / pct(raw, 0.5):.1f}x  "
        f"p99 {pct(through_pi, 0.99) / pct(raw, 0.99):.1f}x"
    )
    plain_mb, ext_mb = statistics.median(bridge_only), statistics.median(with_ext)
    print(
        f"pi RSS: bridge only {plain_mb:.0f} MB, with the extension and a live subscription "
        f"{ext_mb:.0f} MB: +{ext_mb - plain_mb:.1f} MB ({ext_mb / plain_mb:.2f}x)"
    )


if __name__ == "__main__":
    main()
