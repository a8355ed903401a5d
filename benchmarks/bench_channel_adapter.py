"""The Telegram adapter child against the Bot API fake, with baselines measured in the
same run.

Latency: one cycle is what a decision costs the child: the server's `channel.present`
-> the fake receives `sendMessage` -> the child reports `applied` -> a button press is
injected -> the child's long poll returns it -> `channel.answer` arrives. The baseline
is the fake's own raw round trip for the same two Bot API calls (`sendMessage`, then a
`getUpdates` that returns the injected press) over one keep-alive HTTP connection, no
child. Memory: the child's RSS (psutil) after the cycles, against a bare `python -c`
process. Prints p50/p90 of both and their ratios. One run, not a timed test.
Run: .venv/bin/python benchmarks/bench_channel_adapter.py
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import psutil

from pi_workflows.engine import channel_adapter
from pi_workflows.testing import FakeTelegram
from pi_workflows.wire import channel
from pi_workflows.wire.framing import SocketFrameReader, encode_frame

CYCLES = 40
USER = 4242424242


def quantiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(len(ordered) * 0.9) - 1]


def raw_round_trips(fake: FakeTelegram) -> list[float]:
    connection = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=30)
    offset = 0

    def post(method: str, params: dict[str, Any]) -> Any:
        connection.request(
            "POST",
            f"/bot{fake.token}/{method}",
            json.dumps(params),
            {"Content-Type": "application/json"},
        )
        return json.loads(connection.getresponse().read())["result"]

    samples = []
    for i in range(CYCLES):
        start = time.perf_counter()
        sent = post("sendMessage", {"chat_id": fake.chat_id, "text": f"raw {i}"})
        fake.press_button("d:1:approve", user_id=USER, message_id=sent["message_id"])
        [update] = post("getUpdates", {"offset": offset, "timeout": 5})
        offset = update["update_id"] + 1
        samples.append(time.perf_counter() - start)
    post("getUpdates", {"offset": offset, "timeout": 0})  # confirm the last one
    connection.close()
    return samples


def adapter_cycles(fake: FakeTelegram) -> tuple[list[float], float, float]:
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
        channel_adapter.ENV_POLL: "20",
    }
    started = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "pi_workflows.engine.channel_adapter"],
        env=env,
        pass_fds=[child_end.fileno()],
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    child_end.close()
    server_end.settimeout(30)
    reader = SocketFrameReader(server_end)
    stamp = channel.ChannelStamp("bench-epoch", "bench")
    try:
        assert reader.read_message()["kind"] == "channel.ready"  # type: ignore[index]
        ready_seconds = time.perf_counter() - started
        samples = []
        for i in range(CYCLES):
            start = time.perf_counter()
            server_end.sendall(
                encode_frame(
                    {
                        **stamp.envelope(),
                        "kind": "channel.present",
                        "attemptId": f"attempt-{i}",
                        "channelRevision": i,
                        "presentation": {
                            "text": f"Decision {i}?",
                            "buttons": [{"label": "Approve", "callbackData": "d:1:approve"}],
                        },
                    }
                )
            )
            result = reader.read_message()
            assert result is not None and result["result"]["status"] == "applied", result
            fake.press_button(
                "d:1:approve", user_id=USER, message_id=result["result"]["messageIds"][0]
            )
            answer = reader.read_message()
            assert answer is not None and answer["kind"] == "channel.answer", answer
            samples.append(time.perf_counter() - start)
        rss = psutil.Process(child.pid).memory_info().rss / 2**20
        return samples, ready_seconds, rss
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(10)
        server_end.close()


def bare_python_rss() -> float:
    bare = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        process = psutil.Process(bare.pid)
        # Wait until the interpreter is up (its RSS stops growing), not a fixed time.
        last = -1
        while (rss := process.memory_info().rss) != last:
            last = rss
            time.sleep(0.2)
        return rss / 2**20
    finally:
        bare.kill()
        bare.wait(10)


def main() -> None:
    with FakeTelegram() as fake:
        raw_round_trips(fake)  # warm-up
        raw = raw_round_trips(fake)
        cycles, ready_seconds, rss = adapter_cycles(fake)
    baseline_rss = bare_python_rss()
    raw_p50, raw_p90 = quantiles(raw)
    p50, p90 = quantiles(cycles)
    print(f"adapter start to channel.ready: {ready_seconds * 1000:.0f} ms")
    print(
        f"raw sendMessage + getUpdates round trip: p50 {raw_p50 * 1000:.2f} ms, p90 {raw_p90 * 1000:.2f} ms"
    )
    print(
        f"present -> sendMessage -> press -> channel.answer: p50 {p50 * 1000:.2f} ms, p90 {p90 * 1000:.2f} ms"
    )
    print(f"latency ratio (adapter / raw): p50 {p50 / raw_p50:.2f}x, p90 {p90 / raw_p90:.2f}x")
    print(
        f"adapter child RSS {rss:.1f} MiB vs bare python {baseline_rss:.1f} MiB: {rss / baseline_rss:.2f}x (+{rss - baseline_rss:.1f} MiB)"
    )


if __name__ == "__main__":
    main()
