"""The Telegram adapter child, for real: a child process on a socketpair, its config in
the environment, the Bot API fake on 127.0.0.1. The test plays the server's side of
channel.v1 with the wire module's own codecs; nothing is mocked."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pi_workflows.engine import channel_adapter
from pi_workflows.testing import FakeTelegram, TelegramMessage
from pi_workflows.wire import channel
from pi_workflows.wire.framing import SocketFrameReader, encode_frame

pytestmark = pytest.mark.timeout(60)

ALLOWED_USER = 424242421
OTHER_USER = 977777771
EPOCH = "adapter-epoch-1"
PROFILE = "ops"
WAIT = 20.0  # seconds; generous for a loaded 2-core box

# Modules a transport-only child must never load (workflow-server.md: it does not open
# SQLite, load workflow code or change run state).
FORBIDDEN_MODULES = (
    "sqlite3",
    "pykka",
    "pi_workflows.server",
    "pi_workflows.storage",
    "pi_workflows.actors",
    "pi_workflows.cli",
    "pi_workflows.engine.runner",
    "pi_workflows.pi",
)

# Runs the child as `python -m` does, then writes its sys.modules at exit.
MODULE_DUMP = """
import atexit, os, runpy, sys
def dump():
    with open(os.environ["CHANNEL_TEST_MODULES"], "w") as f:
        f.write("\\n".join(sorted(sys.modules)))
atexit.register(dump)
runpy.run_module("pi_workflows.engine.channel_adapter", run_name="__main__", alter_sys=True)
"""


class AdapterRig:
    """One adapter child and the server's end of its channel."""

    def __init__(self, fake: FakeTelegram, tmp: Path, *, token: str | None = None) -> None:
        self.fake = fake
        self.tmp = tmp
        self.token = token or fake.token
        self.sock: socket.socket | None = None
        self.child: subprocess.Popen[bytes] | None = None
        self.stamp = channel.ChannelStamp(EPOCH, PROFILE)
        self.incoming = channel.ChannelSequenceCheck(EPOCH, PROFILE)
        self.stdout = tmp / "adapter.stdout"
        self.stderr = tmp / "adapter.stderr"

    def start(
        self, *, argv: list[str] | None = None, extra_env: dict[str, str] | None = None
    ) -> None:
        server_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = {
            "PATH": os.environ.get("PATH", ""),
            channel_adapter.ENV_FD: str(child_end.fileno()),
            channel_adapter.ENV_EPOCH: EPOCH,
            channel_adapter.ENV_PROFILE: PROFILE,
            channel_adapter.ENV_TOKEN: self.token,
            channel_adapter.ENV_CHAT: str(self.fake.chat_id),
            channel_adapter.ENV_ALLOWED: f"{ALLOWED_USER},11",
            channel_adapter.ENV_API_BASE: self.fake.api_base,
            channel_adapter.ENV_POLL: "1",
            **(extra_env or {}),
        }
        with self.stdout.open("wb") as out, self.stderr.open("wb") as err:
            self.child = subprocess.Popen(
                argv or [sys.executable, "-m", "pi_workflows.engine.channel_adapter"],
                env=env,
                pass_fds=[child_end.fileno()],
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        child_end.close()
        server_end.settimeout(WAIT)
        self.sock = server_end
        self.reader = SocketFrameReader(server_end)

    def read(self) -> channel.AdapterMessage | None:
        """The child's next message (checked as the server checks it), None at its end."""
        message = self.reader.read_message()
        if message is None:
            return None
        checked = channel.check_message(message, sender="adapter")
        self.incoming.check(checked)  # type: ignore[arg-type]
        return checked  # type: ignore[return-value]

    def read_kind(self, kind: str) -> dict[str, Any]:
        message = self.read()
        assert message is not None, f"the channel ended before {kind}"
        assert message["kind"] == kind, message
        return dict(message)

    def send(self, fields: dict[str, Any]) -> None:
        message = {**self.stamp.envelope(), **fields}
        assert self.sock is not None
        self.sock.sendall(encode_frame(message))

    def present(self, attempt: str, revision: int, text: str, *callback_data: str) -> None:
        buttons = [
            {"label": data.rsplit(":", 1)[-1].title(), "callbackData": data}
            for data in callback_data
        ]
        self.send(
            {
                "kind": "channel.present",
                "attemptId": attempt,
                "channelRevision": revision,
                "presentation": {"text": text, "buttons": buttons},
            }
        )

    def settle(self, attempt: str, revision: int, message_ids: list[int], text: str) -> None:
        self.send(
            {
                "kind": "channel.settle",
                "attemptId": attempt,
                "channelRevision": revision,
                "messageIds": message_ids,
                "text": text,
            }
        )

    def wait_exit(self) -> int:
        assert self.child is not None
        return self.child.wait(WAIT)

    def output(self) -> str:
        return self.stdout.read_text(errors="replace") + self.stderr.read_text(errors="replace")

    def cleanup(self) -> None:
        if self.child is not None and self.child.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.child.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.child.wait(10)
        if self.sock is not None:
            self.sock.close()


def _token() -> str:
    return f"{secrets.randbelow(10**9) + 10**9}:{secrets.token_urlsafe(27)}"


@pytest.fixture
def fake() -> Iterator[FakeTelegram]:
    with FakeTelegram(token=_token()) as server:
        yield server


@pytest.fixture
def rig(fake: FakeTelegram, tmp_path: Path) -> Iterator[AdapterRig]:
    adapter = AdapterRig(fake, tmp_path)
    try:
        yield adapter
        assert_private(adapter)
    finally:
        adapter.cleanup()


def assert_private(adapter: AdapterRig) -> None:
    """No token, secret half of it, chat ID or user ID in anything the child printed."""
    output = adapter.output()
    for secret in (
        adapter.token,
        adapter.token.split(":", 1)[1],
        str(adapter.fake.chat_id),
        str(ALLOWED_USER),
        str(OTHER_USER),
    ):
        assert secret not in output


@pytest.fixture
def ready(rig: AdapterRig) -> AdapterRig:
    rig.start()
    message = rig.read_kind("channel.ready")
    assert message["botUsername"] == rig.fake.bot_username
    return rig


def presented(rig: AdapterRig, attempt: str = "attempt-1", revision: int = 1) -> TelegramMessage:
    rig.present(attempt, revision, "Deploy run-1 to production?", "d:1:approve", "d:1:reject")
    result = rig.read_kind("channel.present")
    assert (result["attemptId"], result["channelRevision"]) == (attempt, revision)
    assert result["result"]["status"] == "applied"
    [message_id] = result["result"]["messageIds"]
    return rig.fake.message(message_id)


def test_present_sends_one_message_with_the_inline_keyboard(ready: AdapterRig) -> None:
    message = presented(ready)
    [call] = ready.fake.calls_of("sendMessage")
    assert call.params["chat_id"] == ready.fake.chat_id
    assert message.text == "Deploy run-1 to production?"
    assert message.buttons == [("Approve", "d:1:approve"), ("Reject", "d:1:reject")]
    # One button per row.
    assert [len(row) for row in (message.reply_markup or {})["inline_keyboard"]] == [1, 1]


def test_an_allowed_press_becomes_one_answer_with_its_callback_data(ready: AdapterRig) -> None:
    message = presented(ready)
    update_id = ready.fake.press_button(
        "d:1:approve", user_id=ALLOWED_USER, message_id=message.message_id
    )
    answer = ready.read_kind("channel.answer")
    assert answer["eventId"] == f"telegram:{update_id}"
    assert answer["answer"] == {"callbackData": "d:1:approve"}
    assert set(answer) == {
        "schema",
        "kind",
        "adapterEpoch",
        "profile",
        "sequence",
        "eventId",
        "answer",
    }
    ready.fake.wait_for_calls("answerCallbackQuery", 1, timeout=WAIT)


def test_a_press_from_a_user_not_allowed_is_dropped_and_logged_without_identity(
    ready: AdapterRig,
) -> None:
    message = presented(ready)
    ready.fake.press_button("d:1:reject", user_id=OTHER_USER, message_id=message.message_id)
    ready.fake.press_button(
        "d:1:approve", user_id=ALLOWED_USER, message_id=message.message_id, chat_id=-100999
    )
    allowed = ready.fake.press_button(
        "d:1:approve", user_id=ALLOWED_USER, message_id=message.message_id
    )
    # Updates are handled in order: the first answer is the allowed press, so the
    # other two produced nothing.
    answer = ready.read_kind("channel.answer")
    assert answer["eventId"] == f"telegram:{allowed}"
    log = ready.stderr.read_text()
    assert "dropped an update from an identity that is not allowed" in log
    assert str(OTHER_USER) not in log and str(ready.fake.chat_id) not in log


def test_a_reply_from_an_allowed_user_is_answered_with_the_replied_message(
    ready: AdapterRig,
) -> None:
    message = presented(ready)
    ready.fake.reply(
        "reject, not today", reply_to_message_id=message.message_id, user_id=OTHER_USER
    )
    update_id = ready.fake.reply(
        "approve", reply_to_message_id=message.message_id, user_id=ALLOWED_USER
    )
    answer = ready.read_kind("channel.answer")
    assert answer["eventId"] == f"telegram:{update_id}"
    assert answer["answer"] == {"replyToMessageId": message.message_id, "text": "approve"}


@pytest.mark.parametrize("how", ["reply", "press"])
def test_an_answer_fetched_before_its_send_is_answered_follows_the_send_result(
    ready: AdapterRig, how: str
) -> None:
    """Issue 23: the person answers the message before the Bot API's answer to its
    `sendMessage` reached the child. The answer is written after the send's result,
    never before: a reply names the message by an ID the server learns from that result."""
    held = ready.fake.hold_answer_next("sendMessage")
    ready.present("attempt-1", 1, "Deploy?", "d:1:approve", "d:1:reject")
    held.wait_entered(WAIT)
    [message] = ready.fake.bot_messages()
    if how == "reply":
        update_id = ready.fake.reply(
            "reject", reply_to_message_id=message.message_id, user_id=ALLOWED_USER
        )
    else:
        update_id = ready.fake.press_button(
            "d:1:reject", user_id=ALLOWED_USER, message_id=message.message_id
        )
    # The child has the update in hand while its send still waits for Telegram's answer.
    ready.fake.wait_for(lambda fake: fake.handed_out(update_id), WAIT)
    held.release()
    result = ready.read_kind("channel.present")
    assert result["result"] == {"status": "applied", "messageIds": [message.message_id]}
    answer = ready.read_kind("channel.answer")
    assert answer["eventId"] == f"telegram:{update_id}"


def test_settle_edits_the_message_and_drops_the_buttons(ready: AdapterRig) -> None:
    message = presented(ready)
    ready.settle("attempt-2", 2, [message.message_id], "Deploy run-1: approved.")
    result = ready.read_kind("channel.settle")
    assert (result["attemptId"], result["channelRevision"]) == ("attempt-2", 2)
    assert result["result"] == {"status": "applied", "messageIds": [message.message_id]}
    edited = ready.fake.message(message.message_id)
    assert edited.text == "Deploy run-1: approved." and edited.buttons == [] and edited.edits == 1
    # Settling again (a retried attempt) finds it "not modified": that is applied too.
    ready.settle("attempt-3", 3, [message.message_id], "Deploy run-1: approved.")
    again = ready.read_kind("channel.settle")
    assert again["result"] == {"status": "applied", "messageIds": [message.message_id]}
    assert ready.fake.message(message.message_id).edits == 1


def test_a_400_is_rejected_with_its_status_and_nothing_is_sent(ready: AdapterRig) -> None:
    ready.fake.fail_next("sendMessage", 400, "Bad Request: chat not found")
    ready.present("attempt-1", 1, "Deploy?", "d:1:approve")
    result = ready.read_kind("channel.present")["result"]
    assert result["status"] == "rejected" and result["httpStatus"] == 400
    assert "chat not found" in result["description"].lower()
    assert ready.fake.bot_messages() == []


def test_a_dropped_connection_after_the_request_was_written_is_failed(ready: AdapterRig) -> None:
    ready.fake.drop_next("sendMessage")
    ready.present("attempt-1", 1, "Deploy?", "d:1:approve")
    result = ready.read_kind("channel.present")["result"]
    assert result == {"status": "failed", "reason": "networkError"}


def test_a_5xx_or_a_429_is_not_sent_with_its_retry_after(ready: AdapterRig) -> None:
    ready.fake.fail_next("sendMessage", 502, "Bad Gateway")
    ready.present("attempt-1", 1, "Deploy?", "d:1:approve")
    result = ready.read_kind("channel.present")["result"]
    assert result == {"status": "notSent", "reason": "serverError"}
    ready.fake.rate_limit_next("sendMessage", 3)
    ready.present("attempt-2", 2, "Deploy?", "d:1:approve")
    result = ready.read_kind("channel.present")["result"]
    assert result == {"status": "notSent", "reason": "rateLimited", "retryAfterMs": 3000}
    assert len(ready.fake.calls_of("sendMessage")) == 2  # no retry of its own
    assert ready.fake.bot_messages() == []


def test_a_refused_connection_or_a_passed_deadline_is_not_sent(fake: FakeTelegram) -> None:
    """The transport itself, in this process: no byte written means `NotSentError`."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]

    async def call(url: str, deadline: float) -> str:
        transport = channel_adapter._BotTransport(connections=1, deadline=deadline)
        try:
            await transport.do_request(url, "POST")
        except channel_adapter.NotSentError as exc:
            return exc.reason
        finally:
            await transport.shutdown()
        return "sent"

    assert asyncio.run(call(f"http://127.0.0.1:{closed_port}/bot1:x/getMe", 5.0)) == (
        "connectFailed"
    )
    hang = fake.hang_next("getMe")
    url = f"{fake.api_base}/bot{fake.token}/getMe"

    async def two_calls() -> tuple[str, str]:
        # One connection: the first call holds it, the second waits and never starts.
        # The deadline leaves a loaded machine time to connect the first.
        transport = channel_adapter._BotTransport(connections=1, deadline=3.0)
        try:
            first = asyncio.create_task(transport.do_request(url, "POST"))
            second = asyncio.create_task(transport.do_request(url, "POST"))
            results = await asyncio.gather(first, second, return_exceptions=True)
        finally:
            await transport.shutdown()
        return tuple(type(r).__name__ for r in results)  # type: ignore[return-value]

    assert asyncio.run(two_calls()) == ("TimedOut", "NotSentError")
    hang.release()


def test_an_answer_larger_than_the_cap_is_a_protocol_error(ready: AdapterRig) -> None:
    ready.fake.huge_next("sendMessage", 3 * channel_adapter.MAX_ANSWER_BYTES)
    ready.present("attempt-1", 1, "Deploy?", "d:1:approve")
    result = ready.read_kind("channel.present")["result"]
    assert result == {"status": "failed", "reason": "answerTooLarge"}


def test_a_strangers_press_costs_no_bot_api_call(ready: AdapterRig) -> None:
    message = presented(ready)
    ready.fake.press_button("d:1:approve", user_id=OTHER_USER, message_id=message.message_id)
    update = ready.fake.press_button(
        "d:1:reject", user_id=ALLOWED_USER, message_id=message.message_id
    )
    answer = ready.read_kind("channel.answer")
    assert answer["eventId"] == channel.event_id(update)
    ready.fake.wait_for_calls("answerCallbackQuery", 1, WAIT)
    assert len(ready.fake.calls_of("answerCallbackQuery")) == 1


def test_a_hung_send_then_sigkill_gives_no_result(ready: AdapterRig) -> None:
    hang = ready.fake.hang_next("sendMessage")
    ready.present("attempt-1", 1, "Deploy?", "d:1:approve")
    hang.wait_entered(WAIT)
    assert ready.child is not None
    os.kill(ready.child.pid, signal.SIGKILL)
    assert ready.wait_exit() == -signal.SIGKILL
    # The channel ends with no result: the server is left with an ambiguous attempt.
    assert ready.read() is None
    hang.release()


def test_sigterm_sends_exiting_and_exits_zero_without_forbidden_modules(
    rig: AdapterRig, tmp_path: Path
) -> None:
    modules = tmp_path / "modules.txt"
    rig.start(
        argv=[sys.executable, "-c", MODULE_DUMP], extra_env={"CHANNEL_TEST_MODULES": str(modules)}
    )
    rig.read_kind("channel.ready")
    presented(rig)  # the modules a send needs are loaded too
    assert rig.child is not None
    rig.child.send_signal(signal.SIGTERM)
    assert rig.read_kind("channel.exiting")["reason"] == "shutdown"
    assert rig.wait_exit() == 0
    loaded = set(modules.read_text().split())
    assert "telegram" in loaded and "pi_workflows.wire.channel" in loaded
    for forbidden in FORBIDDEN_MODULES:
        assert not any(m == forbidden or m.startswith(forbidden + ".") for m in loaded), forbidden


def test_the_channel_closed_by_the_server_ends_the_child(ready: AdapterRig) -> None:
    assert ready.sock is not None
    ready.sock.shutdown(socket.SHUT_RDWR)
    assert ready.wait_exit() == 0


@pytest.mark.parametrize("defect", ["stale epoch", "sequence gap", "result from the server"])
def test_a_bad_frame_from_the_server_ends_the_child_non_zero(
    ready: AdapterRig, defect: str
) -> None:
    command = {
        "kind": "channel.present",
        "attemptId": "attempt-1",
        "channelRevision": 1,
        "presentation": {"text": "x", "buttons": []},
    }
    envelope = ready.stamp.envelope()
    if defect == "stale epoch":
        envelope["adapterEpoch"] = "adapter-epoch-0"
    elif defect == "sequence gap":
        envelope["sequence"] += 1
    else:
        del command["presentation"]
        command["result"] = {"status": "applied", "messageIds": [1]}
    assert ready.sock is not None
    ready.sock.sendall(encode_frame({**envelope, **command}))
    assert ready.read_kind("channel.exiting")["reason"] == "badFrame"
    assert ready.wait_exit() == channel_adapter.EXIT_BAD_FRAME
    assert ready.fake.calls_of("sendMessage") == []


def test_a_refused_token_sends_exiting_unauthorized(fake: FakeTelegram, tmp_path: Path) -> None:
    adapter = AdapterRig(fake, tmp_path, token=_token())
    try:
        adapter.start()
        assert adapter.read_kind("channel.exiting")["reason"] == "unauthorized"
        assert adapter.wait_exit() == channel_adapter.EXIT_TRANSPORT
        assert_private(adapter)
    finally:
        adapter.cleanup()


def test_a_missing_variable_is_named_without_any_value(fake: FakeTelegram, tmp_path: Path) -> None:
    adapter = AdapterRig(fake, tmp_path)
    try:
        adapter.start(extra_env={channel_adapter.ENV_CHAT: "not-a-number"})
        assert adapter.wait_exit() == channel_adapter.EXIT_BAD_CONFIG
        assert channel_adapter.ENV_CHAT in adapter.stderr.read_text()
        assert_private(adapter)
    finally:
        adapter.cleanup()


@pytest.mark.parametrize("declared", [True, False], ids=["with-length", "until-close"])
def test_a_200_mib_answer_leaves_the_adapter_under_100_mb(
    ready: AdapterRig, declared: bool
) -> None:
    """Issue 25: the body is read up to the cap and the rest is never held."""
    assert ready.child is not None
    polls = len(ready.fake.calls_of("getUpdates"))
    ready.fake.huge_next("getUpdates", 200 * 1024 * 1024, declare_length=declared)
    # A poll may be in flight already: the huge answer is the next one at the latest,
    # and a poll after it means the child went on (it was dealt with).
    ready.fake.wait_for_calls("getUpdates", polls + 3, WAIT)
    peak_kib = _peak_rss_kib(ready.child.pid)
    assert peak_kib < 100 * 1024, f"adapter peak RSS {peak_kib // 1024} MiB"
    message = presented(ready)  # and it still works
    assert message.text == "Deploy run-1 to production?"


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc")


def test_a_429_to_get_updates_waits_its_retry_after(ready: AdapterRig) -> None:
    polls = len(ready.fake.calls_of("getUpdates"))
    ready.fake.rate_limit_next("getUpdates", 2)

    def polled_after_the_429(fake: FakeTelegram) -> tuple[float, float] | None:
        calls = fake.calls_of("getUpdates")[polls:]
        limited = [i for i, c in enumerate(calls) if c.status == 429]
        if not limited or limited[0] + 1 >= len(calls):
            return None
        return calls[limited[0]].at, calls[limited[0] + 1].at

    limited_at, next_at = ready.fake.wait_for(polled_after_the_429, WAIT)
    assert next_at - limited_at >= 2.0
