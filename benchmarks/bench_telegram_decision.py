"""Telegram decision round trip: presented -> button press -> run completed.

A real embedded server (real runners, the real adapter child over channel.v1) against
the Bot API fake on 127.0.0.1. Each round starts a run that waits at a protected
decision, waits until the fake has the message, presses its button as an allowed user,
and waits until the decision's continuation run completes (its run list event). The
baseline, measured in the same run: the fake's own HTTP request/response round trip
(`getMe` over a fresh connection, as the child's library does per call). Also printed:
the adapter child's resident memory (psutil).

One run, not a timed test: the press -> completed latency includes the child's long
poll pick-up (`PI_WORKFLOWS_TELEGRAM_POLL_SECONDS`, 1 here), the answer's commit, the
continuation runner's launch and its compute node.

Run: `.venv/bin/python benchmarks/bench_telegram_decision.py [--rounds N] [--tick S]`.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sqlite3
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.testing import FakeTelegram
from pi_workflows.testing._fake_telegram import TelegramMessage

TOKEN = "123456789:AAH-bench-token-abcdefghijklmnopqrstu"
CHAT_ID = -1001234567890
USER = 4242
ADAPTER = "pi_workflows.engine.channel_adapter"

WORKFLOW = """
from pi_workflows import compute, define_workflow, human_decision

workflow = define_workflow(
    name="deploy",
    start_at="ask",
    nodes={
        "ask": human_decision("Deploy?", choices={"approve": "Approve", "reject": "Reject"}),
        "done": compute(lambda ctx: {"answer": ctx.outputs["ask"]}),
    },
    edges=[{"from": "ask", "to": "done"}],
)
"""


def nth_message(fake: FakeTelegram, n: int) -> TelegramMessage | None:
    found = fake.bot_messages()
    return found[n] if len(found) > n else None


def fake_round_trip(fake: FakeTelegram, rounds: int) -> float:
    url = f"{fake.api_base}/bot{TOKEN}/getMe"
    samples = []
    for _ in range(rounds):
        began = time.perf_counter()
        with urllib.request.urlopen(url, timeout=10) as answer:
            answer.read()
        samples.append(time.perf_counter() - began)
    return statistics.median(samples)


def continuation(state: Path, run_id: str, deadline: float) -> str:
    while time.monotonic() < deadline:
        db = sqlite3.connect(f"file:{state / 'state.sqlite'}?mode=ro", uri=True)
        try:
            hit = db.execute(
                "SELECT continuation_run_id FROM human_decisions WHERE run_id = ?", (run_id,)
            ).fetchone()
        finally:
            db.close()
        if hit and hit[0]:
            return str(hit[0])
        time.sleep(0.005)
    raise TimeoutError("no continuation")


def wait_completed(client: WorkflowClient, run_id: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        status = client.call("run.get", run_id=run_id)["receipt"]["display"]["status"]
        if status == "completed":
            return
        time.sleep(0.005)
    raise TimeoutError("the continuation did not complete")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tick", type=float, default=0.25)
    args = parser.parse_args()
    os.environ["PI_WORKFLOWS_TELEGRAM_POLL_SECONDS"] = "1"
    root = Path(tempfile.mkdtemp(prefix="piw-bench-", dir="/tmp"))
    state = root / "agent" / "workflows"
    state.mkdir(parents=True, mode=0o700)
    project = root / "project"
    (project / ".pi" / "workflows").mkdir(parents=True)
    (project / ".pi" / "workflows" / "deploy.workflow.py").write_text(WORKFLOW)
    with FakeTelegram(token=TOKEN, chat_id=CHAT_ID) as fake:
        profiles = {
            "schema": "pi-workflows.channels.v1",
            "profiles": {
                "ops": {
                    "botToken": TOKEN,
                    "chatId": CHAT_ID,
                    "allowedUserIds": [USER],
                    "workflows": ["deploy"],
                    "apiBase": fake.api_base,
                }
            },
        }
        path = state / "channels.json"
        path.write_text(json.dumps(profiles))
        path.chmod(0o600)
        baseline = fake_round_trip(fake, 50)
        presented, completed = [], []
        with (
            WorkflowServer(state, idle_exit_s=None, tick_s=args.tick) as server,
            WorkflowClient(server.state_dir, autostart=False, timeout=60) as client,
        ):
            for number in range(args.rounds):
                began = time.perf_counter()
                run_id = client.call(
                    "run.start", {"workflow": "deploy", "input": {}, "projectPath": str(project)}
                )["receipt"]["runId"]
                message = fake.wait_for(functools.partial(nth_message, n=number), 60)
                shown = time.perf_counter()
                presented.append(shown - began)
                fake.press_button(
                    message.buttons[0][1], user_id=USER, message_id=message.message_id
                )
                deadline = time.monotonic() + 60
                wait_completed(client, continuation(state, run_id, deadline), deadline)
                completed.append(time.perf_counter() - shown)
            children = [
                p
                for p in psutil.Process().children(recursive=True)
                if ADAPTER in " ".join(p.cmdline())
            ]
            rss = children[0].memory_info().rss if children else 0
    fake_ms = baseline * 1000
    press_ms = statistics.median(completed) * 1000
    print(f"fake Bot API round trip (median of 50): {fake_ms:.2f} ms")
    print(
        f"run start -> presented (median of {args.rounds}): "
        f"{statistics.median(presented) * 1000:.0f} ms"
    )
    print(
        f"press -> run completed (median of {args.rounds}): {press_ms:.0f} ms "
        f"= {press_ms / fake_ms:.0f} x the fake's round trip (tick {args.tick} s, poll 1 s)"
    )
    print(f"adapter child RSS: {rss / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
