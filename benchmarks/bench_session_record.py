"""Model turn time with the session record on, against off (issue 29: at most 1.05x).

Three real `pi --mode rpc` with the extension, on session files, against one fake
provider and one workflow server (`server run`, a child process): `on` records (the
default), `off` and `off'` run with `PI_WORKFLOWS_SESSION_RECORD=off`; `off'` / `off` is
the noise floor of the shared machine. Each run is `/workflow start bench`: one
`assistant_message` step whose turn streams a reply in 200 small chunks, calls pi's
`bash` tool and streams a final reply in 100 chunks; the run's terminal message then
starts its own short turn (timed apart). A turn is timed from pi's `agent_start` to its
`agent_end` on pi's stdout. One pi works at a time: rounds of one run per pi, the order
rotated each round, so the machine's drift falls on all three. Prints p50/p90, the ratios
and what was recorded per turn (read-only from state.sqlite). Takes one real-pi slot.

Run: make node_modules && .venv/bin/python benchmarks/bench_session_record.py [--runs 40]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from _server import workflow_server
from bench_origin_messages import pct, rows, take_slot

from pi_workflows.engine._pi_child import PI_BINARY_ENV, PiChild, PiLaunch, PiOptions, PiTimeout
from pi_workflows.pi import extension_path
from pi_workflows.testing import (
    FAKE_MODEL,
    FAKE_PROVIDER,
    FakeProvider,
    ScriptedTurn,
    ToolCall,
    Turn,
    text_turn,
)

REPO = Path(__file__).resolve().parents[1]
RECORD_ENV = "PI_WORKFLOWS_SESSION_RECORD"  # recorder.ts RECORD_ENV
MESSAGE_TYPE = "pi-workflows.message"
STARTED = re.compile(r"^Started workflow bench: (run-[0-9a-f]+)$", re.M)
TERMINAL = {"completed", "failed", "cancelled", "timed_out"}
TARGET = 1.05
RUN_TIMEOUT_S = 120.0
CHUNK = 6

WORKFLOW = """
from pi_workflows import assistant_message, define_workflow

workflow = define_workflow(
    name="bench",
    start_at="plan",
    nodes={"plan": assistant_message("Propose a release plan", max_chars=4000)},
    edges=[],
)
"""

SENTENCE = "The release freezes on Thursday, the changelog is checked, tests run twice. "


def prose(chars: int) -> str:
    return (SENTENCE * (chars // len(SENTENCE) + 1))[:chars]


def script() -> tuple[ScriptedTurn, ...]:
    """One run's model turns: the step (reply, bash call, final reply), then the terminal."""
    command = "printf '%s\\n' release-notes.md CHANGELOG.md && ls -1 /"
    return (
        Turn(
            text=prose(200 * CHUNK),
            tool_calls=(ToolCall("bash", {"command": command}),),
            chunk_size=CHUNK,
        ),
        text_turn(prose(100 * CHUNK), chunk_size=CHUNK),
        text_turn("Noted: the workflow finished.", chunk_size=CHUNK),
    )


@dataclass
class Pi:
    """One pi with the extension, recording or not, and its samples (ms) by measure."""

    label: str
    records: bool
    child: PiChild
    samples: dict[str, list[float]] = field(
        default_factory=lambda: {"step": [], "terminal": [], "settle": []}
    )
    cpu_s: float = 0.0
    """pi's own CPU time (user + system) over the timed runs."""

    def cpu(self) -> float:
        times = psutil.Process(self.child.pi_pid or self.child.pid).cpu_times()
        return float(times.user + times.system)


def spawn(root: Path, label: str, *, records: bool) -> Pi:
    extra = {} if records else {RECORD_ENV: "off"}
    launch = PiLaunch.build(
        environ={**os.environ, PI_BINARY_ENV: str(REPO / "node_modules" / ".bin" / "pi")},
        bridge=extension_path(),
        cwd=root / "project",
        options=PiOptions(provider=FAKE_PROVIDER, model=FAKE_MODEL),
        agent_dir=root / "agent",
        tmpdir=root / "tmp",
        extra_env=extra,
        stderr_path=root / f"pi-{label}.stderr.log",
    )
    # On a session file, as a user's pi is (the launch says --no-session).
    argv = list(launch.argv)
    at = argv.index("--no-session")
    argv[at : at + 1] = ["--session", str(root / "sessions" / f"{label}.jsonl")]
    child = PiChild.spawn(PiLaunch(tuple(argv), launch.env, launch.cwd, launch.stderr_path))
    child.wait_ready(60)
    return Pi(label, records, child)


def drain(child: PiChild) -> None:
    try:
        while True:
            child.next_event(0)
    except PiTimeout:
        return


def turn_times(child: PiChild) -> tuple[str, dict[str, float], float]:
    """Start a run and read pi's events until its step and terminal turns ended: the run
    ID, each turn's agent_start -> agent_end in ms by its workflow message kind, and the
    step turn's agent_end on the wall clock (ms, the server's clock too)."""
    child.send({"type": "prompt", "message": "/workflow start bench"})
    run_id = ""
    times: dict[str, float] = {}
    started: float | None = None
    kind = ""
    step_end = 0.0
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not run_id or len(times) < 2:
        event = child.next_event(max(0.0, deadline - time.monotonic()))
        now = time.perf_counter()
        message = event.get("message") or {}
        if event.get("type") == "agent_start":
            started = now
        elif event.get("type") == "message_start" and message.get("customType") == MESSAGE_TYPE:
            kind = str(message["details"]["kind"])
        elif event.get("type") == "agent_end" and started is not None:
            times[kind] = (now - started) * 1000
            if kind == "step":
                step_end = time.time() * 1000
            started, kind = None, ""
        elif event.get("method") == "notify" and not run_id:
            if event.get("notifyType") == "error":
                raise RuntimeError(f"/workflow start failed: {event.get('message')}")
            found = STARTED.search(str(event.get("message")))
            if found is None:
                raise RuntimeError(f"/workflow start said: {event.get('message')}")
            run_id = found.group(1)
    return run_id, times, step_end


def settled(state: Path, run_id: str, records: bool) -> bool:
    """The run is terminal, its two turns (step, terminal) ended and, when recording,
    both captures are closed."""
    [(status,)] = rows(state, f"SELECT status FROM runs WHERE run_id = '{run_id}'")
    [(ended,)] = rows(
        state,
        f"SELECT count(*) FROM workflow_turns WHERE run_id = '{run_id}' AND status != 'open'",
    )
    [(closed,)] = rows(
        state,
        f"SELECT count(*) FROM session_segments WHERE run_id = '{run_id}' "
        "AND status != 'recording'",
    )
    return status in TERMINAL and ended == 2 and closed == (2 if records else 0)


def one_run(pi: Pi, provider: FakeProvider, state: Path, *, keep: bool) -> str:
    drain(pi.child)
    provider.script(*script())
    run_id, times, step_end = turn_times(pi.child)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not settled(state, run_id, pi.records):
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} did not settle")
        time.sleep(0.02)  # a benchmark's poll between runs, outside every timed span
    if keep:
        [(ended_at,)] = rows(
            state,
            "SELECT t.ended_at FROM workflow_turns t JOIN workflow_messages m "
            f"ON m.message_id = t.message_id WHERE t.run_id = '{run_id}' AND m.kind = 'step'",
        )
        pi.samples["step"].append(times["step"])
        pi.samples["terminal"].append(times["terminal"])
        pi.samples["settle"].append(float(ended_at) - step_end)
    return run_id


def recorded(state: Path, run_ids: list[str]) -> list[tuple[Any, ...]]:
    """(message kind, capture status, events, distinct commit times) per segment."""
    listed = ", ".join(f"'{run_id}'" for run_id in run_ids)
    return rows(
        state,
        "SELECT m.kind, s.status, s.event_count, count(DISTINCT e.recorded_at) "
        "FROM session_segments s JOIN workflow_messages m ON m.message_id = s.message_id "
        "LEFT JOIN session_events e ON e.segment_id = s.segment_id "
        f"WHERE s.run_id IN ({listed}) GROUP BY s.segment_id",
    )


def interleave(
    pis: list[Pi], provider: FakeProvider, state: Path, runs: int, warmup: int
) -> tuple[list[tuple[Any, ...]], int]:
    """Rounds of one run per pi, the order rotated each round; return what the timed
    runs of the recording pi recorded and how many captures the others have (none)."""
    run_ids: dict[str, list[str]] = {pi.label: [] for pi in pis}
    for index in range(warmup + runs):
        if index == warmup:
            for pi in pis:
                pi.cpu_s = -pi.cpu()
        turn = index % len(pis)
        for pi in pis[turn:] + pis[:turn]:
            run_ids[pi.label].append(one_run(pi, provider, state, keep=index >= warmup))
    for pi in pis:
        pi.cpu_s += pi.cpu()
    timed = [run_id for pi in pis if pi.records for run_id in run_ids[pi.label][warmup:]]
    unrecorded = [run_id for pi in pis if not pi.records for run_id in run_ids[pi.label]]
    return recorded(state, timed), len(recorded(state, unrecorded))


def measure(runs: int, warmup: int) -> tuple[list[Pi], list[tuple[Any, ...]], int]:
    root = Path(tempfile.mkdtemp(prefix="piw-bench-record-", dir="/tmp"))
    slot = take_slot()
    try:
        workflows = root / "project" / ".pi" / "workflows"
        workflows.mkdir(parents=True)
        (workflows / "bench.workflow.py").write_text(WORKFLOW)
        (root / "tmp").mkdir()
        state = root / "agent" / "workflows"
        with FakeProvider() as provider, workflow_server(state):
            provider.write_agent_dir(root / "agent")
            pis: list[Pi] = []
            try:
                for label, records in (("on", True), ("off", False), ("off'", False)):
                    pis.append(spawn(root, label, records=records))
                return (pis, *interleave(pis, provider, state, runs, warmup))
            finally:
                for pi in pis:
                    pi.child.stop()
    finally:
        slot.close()
        shutil.rmtree(root, ignore_errors=True)


MEASURES = (
    ("step", "step turn"),
    ("terminal", "terminal turn"),
    ("settle", "step agent_end -> settled"),
)


def verdict(ratio: float) -> str:
    return f"{ratio:5.3f}x   target <= {TARGET}   {'MET' if ratio <= TARGET else 'NOT MET'}"


def ratios(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """p50 / p50, p90 / p90 and the median of the per-round ratios."""
    pairs = [x / y for x, y in zip(a, b, strict=True)]
    p50 = statistics.median(a) / statistics.median(b)
    return p50, pct(a, 0.9) / pct(b, 0.9), statistics.median(pairs)


def report(pis: list[Pi], segments: list[tuple[Any, ...]], unrecorded: int) -> None:
    on, off, floor = pis
    print(
        f"{len(on.samples['step'])} rounds of one run each for pis 'on' (recording), 'off' "
        f"and 'off'' (both {RECORD_ENV}=off), the order rotated each round; step turn: a "
        f"{200 * CHUNK}-char reply in {CHUNK}-char chunks, a bash call, a {100 * CHUNK}-char "
        "reply; then the terminal message's turn"
    )
    for key, name in MEASURES:
        for pi in pis:
            values = pi.samples[key]
            print(
                f"{name + ', pi ' + pi.label:<36} p50 {statistics.median(values):8.1f} ms"
                f"   p90 {pct(values, 0.9):8.1f} ms"
            )
    p50, p90, pairs = ratios(on.samples["step"], off.samples["step"])
    print(f"on / off p50 step turn:       {verdict(p50)}")
    print(f"on / off p90 step turn:       {verdict(p90)}")
    print(f"on / off median of rounds:    {verdict(pairs)}")
    p50, p90, pairs = ratios(floor.samples["step"], off.samples["step"])
    print(
        f"noise floor, off' / off step turn: p50 {p50:5.3f}x, p90 {p90:5.3f}x, "
        f"median of rounds {pairs:5.3f}x"
    )
    runs = len(on.samples["step"])
    cpu = ", ".join(f"{pi.label} {pi.cpu_s / runs * 1000:.1f} ms" for pi in pis)
    print(f"pi CPU per run (both turns, pi's own process): {cpu}")
    terminal = ratios(on.samples["terminal"], off.samples["terminal"])[0]
    print(f"on / off p50 terminal turn:   {terminal:5.3f}x (no target)")
    extra = statistics.median(on.samples["settle"]) - statistics.median(off.samples["settle"])
    print(f"recording adds to agent_end -> settled turn: {extra:+.1f} ms at p50 (no target)")
    for kind in ("step", "terminal"):
        mine = [s for s in segments if s[0] == kind]
        if not mine:
            print(f"recorded per {kind} turn: no capture")
            continue
        statuses = "/".join(sorted({str(s[1]) for s in mine}))
        print(
            f"recorded per {kind} turn: {statistics.median([s[2] for s in mine]):.0f} events in "
            f"{statistics.median([s[3] for s in mine]):.0f} sessionEvents.record batches "
            f"(distinct commit ms); {len(mine)} captures, {statuses}"
        )
    print(f"captures of the record-off runs: {unrecorded}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40, help="timed rounds (one run per pi each)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    args = parser.parse_args()
    report(*measure(args.runs, args.warmup))


if __name__ == "__main__":
    main()
