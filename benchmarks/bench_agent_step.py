"""One agent step through the server against the same pi driven directly, in one run.

Server: a real `server run` process (runners on), a workflow whose only node is an
`agent` step; each sample is `run.start` -> the run seen `completed` on a run-list
subscription (WorkflowClient), so it holds the definition lookup, the runner, the
interaction request, pi's spawn, ready probe and turn, the submission's validation, the
node result and pi's stop. Direct: a Python script spawns the same `pi --mode rpc`
(`PiLaunch.build`, `PiChild`, the bridge extension, a fresh private folder per run as
the runner makes), waits for it to be ready, sends the same prompt (the one the server's
first run sent, step contract included, with the attempt ID swapped), waits for
`agent_end`, and stops pi. Both use one FakeProvider scripted the same way: the model
calls `workflow submit` with a valid output, naming the attempt from the prompt.

Runs are interleaved (server, direct, server, ...) so both see the same machine load,
one pi at a time, holding one of the machine-wide real-pi slots (tests/pi/conftest.py).
Prints p50/p90 of both, the ratio server/direct at p50 (target, issue 12: <= 1.15x),
and the peak RSS (VmHWM) of the pi child and of the runner, sampled from /proc while
the step runs. On a busy machine the figures are indicative.
Run: make node_modules && .venv/bin/python benchmarks/bench_agent_step.py [--runs 20]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import psutil
from _server import workflow_server as start_server

from pi_workflows import WorkflowClient
from pi_workflows.engine._pi_child import PI_BINARY_ENV, PiChild, PiLaunch, PiOptions
from pi_workflows.engine.runner import RUNNER_PROCESS_NAME
from pi_workflows.pi import BridgeConfig, bridge_extension_path, write_bridge_config
from pi_workflows.testing import (
    FAKE_MODEL,
    FAKE_PROVIDER,
    FakeProvider,
    ScriptedTurn,
    workflow_submit_turn,
)
from pi_workflows.wire.protocol import CLIENT_SCHEMA, encode_client_message

RUNS = 20
WARMUP = 2
REPO = Path(__file__).resolve().parents[1]
PI_BIN = REPO / "node_modules" / ".bin" / "pi"
PI_SLOTS = 2  # tests/pi/conftest.py: at most two real pi children machine-wide
RUN_TIMEOUT_S = 120.0
SAMPLE_EVERY_S = 0.05
TARGET = 1.15

PROMPT = "Summarise the release notes and submit the summary."
OUTPUT = {"summary": "three fixes, one feature"}
OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"summary": {"type": "string"}},
    "required": ["summary"],
}
WORKFLOW = f"""
from pi_workflows import agent, define_workflow

workflow = define_workflow(
    name="bench",
    start_at="ask",
    nodes={{
        "ask": agent(
            prompt={PROMPT!r},
            output_schema={OUTPUT_SCHEMA!r},
            provider={FAKE_PROVIDER!r},
            model={FAKE_MODEL!r},
            timeout=120,
        ),
    }},
)
"""
# The step contract the runner appends to the prompt names the attempt (whatever its
# wording, an attempt ID is `attempt-` and 32 hex digits).
ATTEMPT_IN_PROMPT = re.compile(r"\b(attempt-[0-9a-f]{32})\b")
DIRECT_ATTEMPT = "attempt-" + "d" * 32


# --- the fake model: submit a valid output for the attempt the prompt names ----------


def _user_text(body: Mapping[str, Any]) -> str:
    parts = []
    for message in body.get("messages") or []:
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            parts.append(str(content))
    return "\n".join(parts)


def submit_for_prompt(body: Mapping[str, Any]) -> ScriptedTurn:
    found = ATTEMPT_IN_PROMPT.search(_user_text(body))
    attempt = found.group(1) if found else "attempt-unknown"
    return workflow_submit_turn("ask", attempt, OUTPUT)


# --- the machine-wide real-pi slot ------------------------------------------------------


@contextlib.contextmanager
def pi_slot() -> Iterator[None]:
    """Hold one real-pi slot (the same lock files as tests/pi/conftest.py)."""
    folder = Path(tempfile.gettempdir())
    handles: list[IO[str]] = [
        (folder / f"pi-workflows-real-pi-{i}.lock").open("a") for i in range(PI_SLOTS)
    ]
    try:
        if not any(_try_lock(handle) for handle in handles):
            print("waiting for a real-pi slot ...", flush=True)
            fcntl.flock(handles[os.getpid() % PI_SLOTS], fcntl.LOCK_EX)
        yield
    finally:
        for handle in handles:
            handle.close()


def _try_lock(handle: IO[str]) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


# --- peak RSS of the pi child and the runner --------------------------------------------


def _peak_rss_mb(pid: int) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


class RssSampler:
    """Samples VmHWM of the pi children and runners below `root` while a step runs.

    VmHWM is the process's own peak, so a sample taken any time before it exits is
    its peak so far; the last sample is kept. A runner's figure counts the pages it
    shares with the zygote it was forked from.
    """

    def __init__(self, root: int) -> None:
        self.root = psutil.Process(root)
        self.peaks: dict[str, float] = {"pi": 0.0, "runner": 0.0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY_S):
            self.sample()

    def sample(self) -> None:
        with contextlib.suppress(psutil.Error):
            for process in self.root.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    kind = self._kind(process)
                    if kind is not None:
                        self.peaks[kind] = max(self.peaks[kind], _peak_rss_mb(process.pid))

    @staticmethod
    def _kind(process: psutil.Process) -> str | None:
        if process.name() == RUNNER_PROCESS_NAME:
            return "runner"
        cmdline = process.cmdline()
        if "--mode" in cmdline and "rpc" in cmdline:
            return "pi"
        return None


# --- the server path ------------------------------------------------------------------


def workflow_server(state_dir: Path) -> contextlib.AbstractContextManager[subprocess.Popen[str]]:
    return start_server(state_dir, env={PI_BINARY_ENV: str(PI_BIN)})


class ServerPath:
    """Starts `bench` runs and waits for each on one run-list subscription."""

    def __init__(self, state_dir: Path, project: Path, server_pid: int) -> None:
        self.state_dir = state_dir
        self.project = str(project)
        self.server_pid = server_pid
        self.client = WorkflowClient(state_dir, autostart=False, client_id="bench-agent")
        self.client.connect()
        self.watcher = WorkflowClient(state_dir, autostart=False, client_id="bench-watch")
        self.watcher.connect()
        self.watcher.call("view.subscribe", {"kind": "runList"})
        self.run_ids: list[str] = []

    def one(self) -> tuple[float, dict[str, float]]:
        with RssSampler(self.server_pid) as sampler:
            began = time.perf_counter()
            answer = self.client.call(
                "run.start", {"workflow": "bench", "input": {}, "projectPath": self.project}
            )
            run_id = str(answer["receipt"]["runId"])
            status = self._settled(run_id)
            elapsed = time.perf_counter() - began
        if status != "completed":
            raise RuntimeError(f"run {run_id} ended {status}, not completed{self._pi_log()}")
        self.run_ids.append(run_id)
        return elapsed, sampler.peaks

    def _settled(self, run_id: str) -> str:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while True:
            self.watcher.set_read_timeout(max(0.1, deadline - time.monotonic()))
            event = self.watcher.read_message()
            if event is None:
                raise RuntimeError("the server closed the subscription")
            if event.get("type") != "event":
                continue
            for item in event["payload"].get("items", []):
                status = item["display"]["status"]
                if item["runId"] == run_id and status in ("completed", "failed", "cancelled"):
                    return str(status)

    def _pi_log(self) -> str:
        logs = sorted(self.state_dir.rglob("pi.stderr.log"), key=lambda p: p.stat().st_mtime)
        return f"; pi stderr: {logs[-1].read_text()[-1500:]}" if logs else ""

    def close(self) -> None:
        self.watcher.close()
        self.client.close()


def stored_outputs(state_dir: Path, run_ids: list[str]) -> list[Any]:
    """The `ask` outputs the server stored for `run_ids` (read after it stopped)."""
    database = sqlite3.connect(f"file:{state_dir / 'state.sqlite'}?mode=ro", uri=True)
    try:
        rows = database.execute(
            "SELECT a.run_id, b.content FROM node_attempts a JOIN blobs b"
            " ON b.digest = a.output_hash WHERE a.node_path = 'ask' AND a.status = 'completed'"
        ).fetchall()
    finally:
        database.close()
    by_run = {run_id: json.loads(content) for run_id, content in rows}
    return [by_run.get(run_id) for run_id in run_ids]


# --- the direct path ------------------------------------------------------------------


class AcceptingEndpoint:
    """What a minimal script needs so that the bridge's submit succeeds: a Unix socket
    that greets each connection with a `client.v1` hello and accepts every request at
    once (no storage, no validation child). The baseline does the same model turns as a
    run through the server, and none of the server's work."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(path))
        self._sock.listen(8)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        hello = {
            "schema": CLIENT_SCHEMA,
            "type": "hello",
            "connectionId": "bench-direct",
            "packageVersion": "0.1.0",
        }
        with conn, conn.makefile("rb") as lines:
            conn.sendall(encode_client_message(hello) + b"\n")
            for line in lines:
                request = json.loads(line)
                answer = {
                    "schema": CLIENT_SCHEMA,
                    "type": "response",
                    "requestId": request["requestId"],
                    "outcome": "accepted",
                    "receipt": {"submissionId": "bench", "status": "accepted"},
                }
                conn.sendall(encode_client_message(answer) + b"\n")

    def close(self) -> None:
        self._sock.close()


class DirectPath:
    """Drives the same pi with PiChild, as a minimal script would, one fresh folder a run;
    its bridge submits to an `AcceptingEndpoint`."""

    def __init__(
        self, root: Path, project: Path, agent_dir: Path, prompt: str, endpoint: Path
    ) -> None:
        self.root = root
        self.project = project
        self.agent_dir = agent_dir
        self.prompt = prompt
        self.endpoint = endpoint
        self.count = 0
        self.accepted = 0

    def _launch(self) -> PiLaunch:
        self.count += 1
        folder = self.root / f"direct-{self.count}"
        (folder / "tmp").mkdir(parents=True, mode=0o700)  # a cold jiti cache, as a runner's
        config = BridgeConfig(
            run_id="run-direct",
            interaction_id=f"request-{DIRECT_ATTEMPT}",
            step="ask",
            attempt=DIRECT_ATTEMPT,
            client_id=f"bridge-{DIRECT_ATTEMPT}",
            output_schema=OUTPUT_SCHEMA,
            socket_path=str(self.endpoint),
        )
        return PiLaunch.build(
            environ={**os.environ, PI_BINARY_ENV: str(PI_BIN)},
            bridge=bridge_extension_path(),
            cwd=self.project,
            # The node's tools=None: only the `workflow` tool, as the runner passes it.
            options=PiOptions(FAKE_PROVIDER, FAKE_MODEL, None, ()),
            agent_dir=self.agent_dir,
            tmpdir=folder / "tmp",
            extra_env=write_bridge_config(folder / "bridge.json", config),
            stderr_path=folder / "pi.stderr.log",
        )

    def one(self) -> tuple[float, dict[str, float]]:
        with RssSampler(os.getpid()) as sampler:
            began = time.perf_counter()
            child = PiChild.spawn(self._launch())
            try:
                child.wait_ready(60)
                outcome = child.run_turn(self.prompt, RUN_TIMEOUT_S)
                sampler.sample()  # pi's peak after its turn, before it exits
            finally:
                child.stop()
            elapsed = time.perf_counter() - began
        calls = outcome.workflow_calls()
        if not calls:
            raise RuntimeError("the direct pi made no workflow call")
        # Count the submits the endpoint accepted (each refusal costs a model round trip).
        self.accepted += calls[-1].is_error is False
        return elapsed, sampler.peaks


# --- report ---------------------------------------------------------------------------


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=RUNS, help="measured runs of each path")
    args = parser.parse_args()
    if not PI_BIN.exists():
        raise SystemExit("node_modules/.bin/pi is missing: run `make node_modules` first")
    root = Path(tempfile.mkdtemp(prefix="piw-bench-agent-", dir="/tmp"))
    times: dict[str, list[float]] = {"server": [], "direct": []}
    peaks: dict[str, dict[str, float]] = {"server": {}, "direct": {}}
    state_dir = root / "agent" / "workflows"
    project = root / "project"
    (project / ".pi" / "workflows").mkdir(parents=True)
    (project / ".pi" / "workflows" / "bench.workflow.py").write_text(WORKFLOW)
    began = time.perf_counter()
    try:
        with pi_slot(), FakeProvider() as provider:
            provider.write_agent_dir(state_dir.parent)  # the agent dir the server's pi gets
            with workflow_server(state_dir) as server:
                server_path = ServerPath(state_dir, project, server.pid)
                try:
                    provider.script(submit_for_prompt)
                    server_path.one()  # warm-up; its request carries the prompt pi gets
                    sent = _user_text(provider.chat_requests()[0].body)
                    found = ATTEMPT_IN_PROMPT.search(sent)
                    assert found is not None, "the server's prompt carries the step contract"
                    prompt = sent.replace(found.group(1), DIRECT_ATTEMPT)
                    endpoint = AcceptingEndpoint(root / "direct.sock")
                    direct = DirectPath(root, project, state_dir.parent, prompt, endpoint.path)
                    paths = {"server": server_path.one, "direct": direct.one}
                    for index in range(WARMUP - 1 + args.runs * 2):
                        name = ("direct", "server")[index % 2]  # direct first: one warm-up
                        provider.script(submit_for_prompt)
                        elapsed, peak = paths[name]()
                        if index >= WARMUP - 1:
                            times[name].append(elapsed)
                            for kind, value in peak.items():
                                peaks[name][kind] = max(peaks[name].get(kind, 0.0), value)
                finally:
                    server_path.close()
            measured = server_path.run_ids[-args.runs :]
            outputs = stored_outputs(state_dir, measured)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    wall = time.perf_counter() - began

    print(f"--- one agent step, start -> completed: {args.runs} interleaved runs each ---")
    for name, label in (("server", "through the server"), ("direct", "pi driven directly")):
        p50, p90 = percentile(times[name], 0.5), percentile(times[name], 0.9)
        print(f"  {label:<20} p50 {p50 * 1e3:7.0f} ms   p90 {p90 * 1e3:7.0f} ms")
    ratio = percentile(times["server"], 0.5) / percentile(times["direct"], 0.5)
    verdict = "MET" if ratio <= TARGET else "NOT MET"
    print(f"ratio server/direct at p50: {ratio:5.2f}x   (target <= {TARGET}x: {verdict})")
    p90_ratio = percentile(times["server"], 0.9) / percentile(times["direct"], 0.9)
    print(f"ratio server/direct at p90: {p90_ratio:5.2f}x")
    print("peak RSS (VmHWM, sampled every 50 ms while the step runs):")
    print(f"  pi child, through the server  {peaks['server'].get('pi', 0.0):6.0f} MB")
    print(f"  pi child, driven directly     {peaks['direct'].get('pi', 0.0):6.0f} MB")
    print(
        f"  runner (incl. pages shared with the zygote) {peaks['server'].get('runner', 0.0):6.0f} MB"
    )
    good = sum(1 for output in outputs if output == OUTPUT)
    print(f"server runs whose stored output is the submitted one: {good}/{len(outputs)}")
    print(f"direct submits the bridge accepted: {direct.accepted}/{direct.count}")
    if direct.accepted < direct.count:
        print("  (a rejected direct submit costs the baseline one more model round trip)")
    print(
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores: a busy machine "
        "makes these figures indicative"
    )
    print(f"(benchmark wall time {wall:.0f} s)")


if __name__ == "__main__":
    main()
