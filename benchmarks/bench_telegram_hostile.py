"""Telegram delivery under a slow or hostile Bot API (issue 25), as ratios in one run.

1. Decision created -> `sendMessage` received by the fake, while 100 stranger presses
   arrive (injected at each decision's start) and every Bot API call takes 0.3 s,
   against the same with no presses. A real embedded server, its real adapter child
   over channel.v1, the Bot API fake on 127.0.0.1. "Created" is the decision row's
   `created_at`; "received" is when the fake recorded the call (after its latency).
   Target: <= 1.5x at p99.
2. The adapter child's peak RSS (`VmHWM`) after it read a 200 MiB `getUpdates` answer
   (no `Content-Length`, so only reading tells its size), against one that read a
   1 KiB answer. Target: <= 1.5x.

One run, not a timed test.
Run: .venv/bin/python benchmarks/bench_telegram_hostile.py [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.engine import channel_adapter
from pi_workflows.testing import FakeTelegram
from pi_workflows.wire.framing import SocketFrameReader

TOKEN = "123456789:AAH-bench-token-abcdefghijklmnopqrstu"
CHAT_ID = -1001234567890
USER = 4242
STRANGER = 999
LATENCY_S = 0.3
STRANGER_PRESSES = 100

WORKFLOW = """
from pi_workflows import define_workflow, human_decision

workflow = define_workflow(
    name="deploy",
    start_at="ask",
    nodes={"ask": human_decision("Deploy?", choices={"approve": "Approve"})},
    edges=[],
)
"""


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def decision_created_ms(state: Path, run_id: str, deadline: float) -> int:
    while time.monotonic() < deadline:
        db = sqlite3.connect(f"file:{state / 'state.sqlite'}?mode=ro", uri=True)
        try:
            hit = db.execute(
                "SELECT created_at FROM human_decisions WHERE run_id = ?", (run_id,)
            ).fetchone()
        finally:
            db.close()
        if hit:
            return int(hit[0])
        time.sleep(0.01)  # polling a file another process writes
    raise TimeoutError("no decision")


def delivery_latencies(rounds: int, presses: int) -> list[float]:
    """Seconds from each decision's creation to its `sendMessage` at the fake."""
    root = Path(tempfile.mkdtemp(prefix="piw-bench-", dir="/tmp"))
    state = root / "agent" / "workflows"
    state.mkdir(parents=True, mode=0o700)
    project = root / "project"
    (project / ".pi" / "workflows").mkdir(parents=True)
    (project / ".pi" / "workflows" / "deploy.workflow.py").write_text(WORKFLOW)
    samples = []
    with FakeTelegram(token=TOKEN, chat_id=CHAT_ID) as fake:
        profile = {
            "botToken": TOKEN,
            "chatId": CHAT_ID,
            "allowedUserIds": [USER],
            "workflows": ["deploy"],
            "apiBase": fake.api_base,
        }
        path = state / "channels.json"
        path.write_text(
            json.dumps({"schema": "pi-workflows.channels.v1", "profiles": {"ops": profile}})
        )
        path.chmod(0o600)
        fake.set_latency(LATENCY_S)
        with (
            WorkflowServer(state, idle_exit_s=None, tick_s=0.05) as server,
            WorkflowClient(server.state_dir, autostart=False, timeout=60) as client,
        ):
            for number in range(rounds):
                for _ in range(presses):
                    fake.press_button("pw1:stranger:0", user_id=STRANGER)
                run_id = client.call(
                    "run.start", {"workflow": "deploy", "input": {}, "projectPath": str(project)}
                )["receipt"]["runId"]
                created = decision_created_ms(state, run_id, time.monotonic() + 60)
                sent = fake.wait_for_calls("sendMessage", number + 1, 60)[number]
                sent_wall = sent.at + (time.time() - time.monotonic())
                samples.append(sent_wall - created / 1000)
    return samples


def peak_rss_kib(answer_bytes: int) -> int:
    """The adapter child's `VmHWM` after it read one `getUpdates` answer this large."""
    with FakeTelegram() as fake:
        server_end, child_end = socket.socketpair()
        env = {
            "PATH": os.environ.get("PATH", ""),
            channel_adapter.ENV_FD: str(child_end.fileno()),
            channel_adapter.ENV_EPOCH: "bench-epoch",
            channel_adapter.ENV_PROFILE: "bench",
            channel_adapter.ENV_TOKEN: fake.token,
            channel_adapter.ENV_CHAT: str(fake.chat_id),
            channel_adapter.ENV_ALLOWED: str(USER),
            channel_adapter.ENV_API_BASE: fake.api_base,
            channel_adapter.ENV_POLL: "1",
        }
        child = subprocess.Popen(
            [sys.executable, "-m", "pi_workflows.engine.channel_adapter"],
            env=env,
            pass_fds=[child_end.fileno()],
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        child_end.close()
        server_end.settimeout(30)
        try:
            assert SocketFrameReader(server_end).read_message()["kind"] == "channel.ready"  # type: ignore[index]
            polls = len(fake.calls_of("getUpdates"))
            fake.huge_next("getUpdates", answer_bytes, declare_length=False)
            fake.wait_for_calls("getUpdates", polls + 3, 60)
            for line in Path(f"/proc/{child.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
            raise RuntimeError("no VmHWM")
        finally:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(10)
            server_end.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    os.environ["PI_WORKFLOWS_TELEGRAM_POLL_SECONDS"] = "1"
    quiet = delivery_latencies(args.rounds, 0)
    flooded = delivery_latencies(args.rounds, STRANGER_PRESSES)
    print(
        f"decision created -> sendMessage received, {LATENCY_S} s per Bot API call "
        f"({args.rounds} decisions each):"
    )
    print(
        f"  no presses:                 p50 {sorted(quiet)[len(quiet) // 2] * 1000:.0f} ms, p99 {p99(quiet) * 1000:.0f} ms"
    )
    print(
        f"  {STRANGER_PRESSES} stranger presses each: p50 {sorted(flooded)[len(flooded) // 2] * 1000:.0f} ms, p99 {p99(flooded) * 1000:.0f} ms"
    )
    print(f"  ratio at p99: {p99(flooded) / p99(quiet):.2f}x (target <= 1.5x)")
    small = peak_rss_kib(1024)
    huge = peak_rss_kib(200 * 1024 * 1024)
    print(
        f"adapter peak RSS: 1 KiB answer {small / 1024:.1f} MiB, 200 MiB answer "
        f"{huge / 1024:.1f} MiB: {huge / small:.2f}x (target <= 1.5x)"
    )


if __name__ == "__main__":
    main()
