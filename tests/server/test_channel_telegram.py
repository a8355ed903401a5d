"""Telegram decisions end to end: a real server, its real adapter child, the Bot API fake.

Issue 15, "How it must behave", the channel cases: a button press completes the run and
edits the message; a stranger's press changes nothing; SIGKILL of the adapter child or
of the server while a send hangs leaves that attempt `ambiguous`, never re-sent, and
`channel recover ... confirm` settles it or `... retry` sends exactly one attempt 2
after a warning; the bot token appears in no file of the state folder or CLI output.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.storage import ManualClock
from pi_workflows.testing import FakeTelegram
from tests.conftest import Processes, write_workflow
from tests.server.channel_rig import (
    ALLOWED_USER,
    CHAT_ID,
    DEPLOY,
    STRANGER,
    TIMED,
    TOKEN,
    attempts,
    channel_row,
    eventually,
    rows,
    waiting_run,
    write_profiles,
)
from tests.server.runs import TERMINAL, start_run, wait_for

pytestmark = pytest.mark.timeout(180)

ADAPTER = "pi_workflows.engine.channel_adapter"


def assert_no_token(agent_dir: Path, *outputs: str) -> None:
    """The token is in channels.json only: no log, database, view or output holds it."""
    secret = TOKEN.split(":", 1)[1].encode()
    for path in agent_dir.rglob("*"):
        if path.is_file() and path.name != "channels.json":
            data = path.read_bytes()
            assert secret not in data, f"the bot token leaked into {path.name}"
    for text in outputs:
        assert TOKEN.split(":", 1)[1] not in text


@pytest.fixture
def telegram() -> Iterator[FakeTelegram]:
    with FakeTelegram(token=TOKEN, chat_id=CHAT_ID) as fake:
        yield fake


@pytest.fixture
def fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PI_WORKFLOWS_TELEGRAM_POLL_SECONDS", "1")


@pytest.fixture
def served(state_dir: Path, telegram: FakeTelegram, fast_polls: None) -> Iterator[WorkflowServer]:
    write_profiles(state_dir, telegram.api_base)
    server = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=True)
    server.start()
    try:
        yield server
    finally:
        server.stop("test teardown")
        assert_no_token(state_dir.parent)


def _client(state_dir: Path) -> WorkflowClient:
    return WorkflowClient(state_dir, autostart=False, timeout=30)


def _presented(telegram: FakeTelegram, count: int = 1) -> list[Any]:
    return telegram.wait_for(
        lambda fake: found if len(found := fake.bot_messages()) >= count else None, 60
    )


def _button(message: Any, label: str) -> str:
    return str(next(data for text, data in message.buttons if text == label))


def _continuation(state_dir: Path, run_id: str) -> str:
    def found() -> str | None:
        hit = rows(
            state_dir,
            "SELECT continuation_run_id FROM human_decisions WHERE run_id = ?",
            (run_id,),
        )
        return hit[0][0] if hit and hit[0][0] else None

    return str(eventually(found, "the decision's continuation run"))


def _adapter_pids(root: int) -> list[int]:
    """The adapter children below `root` (the test process, or a server's PID)."""
    found = []
    for child in psutil.Process(root).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if ADAPTER in " ".join(child.cmdline()):
                found.append(child.pid)
    return found


def _wait_ready(state_dir: Path, processes: Processes) -> None:
    """Wait until `channel status` shows the profile's adapter ready."""

    def ready() -> bool:
        shown = processes.cli(state_dir, "channel", "status", "--json")
        receipt = json.loads(shown.stdout)
        return bool(receipt["profiles"]) and receipt["profiles"][0]["state"] == "ready"

    eventually(ready, "the adapter to be ready", timeout=60)


def test_a_button_press_completes_the_run_and_edits_the_message(
    served: WorkflowServer, telegram: FakeTelegram, short_tmp: Path, processes: Processes
) -> None:
    state_dir = served.state_dir
    with _client(state_dir) as client:
        run_id = waiting_run(client, short_tmp / "project")
        (sent,) = _presented(telegram)
        assert "Deploy build 42 to production?" in sent.text
        assert [label for label, _ in sent.buttons] == ["Approve", "Reject"]
        assert TOKEN not in sent.text and "approve" not in _button(sent, "Approve")
        telegram.press_button(
            _button(sent, "Approve"), user_id=ALLOWED_USER, message_id=sent.message_id
        )
        continuation = _continuation(state_dir, run_id)
        done = wait_for(client, continuation, TERMINAL)
        assert done["display"]["status"] == "completed"
        assert done["result"]["output"]["value"] == {"answer": {"choice": "approve"}}
    edited = telegram.wait_for(
        lambda fake: m if (m := fake.message(sent.message_id)).edits else None, 60
    )
    assert "Answered in Telegram: Approve" in edited.text
    assert not edited.buttons, "the buttons are gone"
    assert rows(
        state_dir,
        "SELECT outcome, provenance, source_channel FROM human_decision_resolutions",
    ) == [("accepted", "human", "telegram")]
    eventually(
        lambda: channel_row(state_dir) == ("telegram:ops", 3, "presented", "settled"),
        "the settlement to commit",
    )
    assert attempts(state_dir) == [(1, "applied", None)]
    assert attempts(state_dir, "channel.settle") == [(1, "applied", None)]
    assert len(telegram.calls_of("sendMessage")) == 1
    shown = processes.cli(state_dir, "channel", "status")
    assert "ready" in shown.stdout and "ambiguous 0" in shown.stdout
    verified = processes.cli(state_dir, "state", "verify")
    assert verified.returncode == 0, verified.stdout
    assert_no_token(state_dir.parent, shown.stdout, shown.stderr, verified.stdout)


def test_a_reply_naming_a_choice_answers_the_decision(
    served: WorkflowServer, telegram: FakeTelegram, short_tmp: Path
) -> None:
    state_dir = served.state_dir
    with _client(state_dir) as client:
        run_id = waiting_run(client, short_tmp / "project")
        (sent,) = _presented(telegram)
        telegram.reply("Reject", reply_to_message_id=sent.message_id, user_id=ALLOWED_USER)
        done = wait_for(client, _continuation(state_dir, run_id), TERMINAL)
    assert done["result"]["output"]["value"] == {"answer": {"choice": "reject"}}
    edited = telegram.wait_for(
        lambda fake: m if (m := fake.message(sent.message_id)).edits else None, 60
    )
    assert "Answered in Telegram: Reject." in edited.text


@pytest.mark.parametrize("how", ["reply", "press"])
def test_an_answer_before_the_delivery_is_recorded_is_applied_once(
    served: WorkflowServer, telegram: FakeTelegram, short_tmp: Path, how: str
) -> None:
    """Issue 23: the message is in the chat and answered while Telegram's answer to the
    `sendMessage` is still on its way, so the answer reaches the adapter before the
    delivery's result can be recorded. It is applied, once, after that result."""
    state_dir = served.state_dir
    held = telegram.hold_answer_next("sendMessage")
    with _client(state_dir) as client:
        run_id = waiting_run(client, short_tmp / "project")
        held.wait_entered(60)
        (sent,) = telegram.bot_messages()
        if how == "reply":
            update_id = telegram.reply(
                "Reject", reply_to_message_id=sent.message_id, user_id=ALLOWED_USER
            )
        else:
            update_id = telegram.press_button(
                _button(sent, "Reject"), user_id=ALLOWED_USER, message_id=sent.message_id
            )
        telegram.wait_for(lambda fake: fake.handed_out(update_id), 60)
        assert attempts(state_dir) == [(1, "applying", None)], "the delivery is not recorded"
        held.release()
        done = wait_for(client, _continuation(state_dir, run_id), TERMINAL)
    assert done["result"]["output"]["value"] == {"answer": {"choice": "reject"}}
    assert attempts(state_dir) == [(1, "applied", None)]
    assert rows(
        state_dir,
        "SELECT outcome, provenance, source_channel FROM human_decision_resolutions",
    ) == [("accepted", "human", "telegram")]
    assert rows(state_dir, "SELECT idempotency_key, outcome FROM human_decision_answers") == [
        (f"telegram:ops:{update_id}", "accepted")
    ]
    edited = telegram.wait_for(
        lambda fake: m if (m := fake.message(sent.message_id)).edits else None, 60
    )
    assert "Answered in Telegram: Reject." in edited.text
    assert len(telegram.calls_of("sendMessage")) == 1
    log = state_dir / "logs" / "server.log"
    handled = '"action":"channel.answer"'
    answers = eventually(
        lambda: [line for line in log.read_text().splitlines() if handled in line],
        "the answer logged",
    )
    assert len(answers) == 1 and '"outcome":"accepted"' in answers[0], answers


def test_a_press_from_a_user_not_allowed_changes_nothing(
    served: WorkflowServer, telegram: FakeTelegram, short_tmp: Path
) -> None:
    state_dir = served.state_dir
    with _client(state_dir) as client:
        run_id = waiting_run(client, short_tmp / "project")
        (sent,) = _presented(telegram)
        telegram.press_button(_button(sent, "Reject"), user_id=STRANGER, message_id=sent.message_id)
        telegram.reply("reject", reply_to_message_id=sent.message_id, user_id=STRANGER)
        # The stranger's updates are read (confirmed by the next poll's offset) and dropped.
        telegram.wait_for(lambda fake: fake.pending_updates() == 0 or None, 60)
        telegram.wait_for_calls("getUpdates", len(telegram.calls_of("getUpdates")) + 1, 60)
        assert rows(state_dir, "SELECT count(*) FROM human_decision_resolutions") == [(0,)]
        view = client.call("run.get", run_id=run_id)["receipt"]
        assert view["display"]["status"] == "waiting"
        assert telegram.message(sent.message_id).edits == 0
        # An allowed user's press, after it, is the one answer.
        telegram.press_button(
            _button(sent, "Approve"), user_id=ALLOWED_USER, message_id=sent.message_id
        )
        done = wait_for(client, _continuation(state_dir, run_id), TERMINAL)
    assert done["result"]["output"]["value"] == {"answer": {"choice": "approve"}}
    log = (state_dir / "logs" / "server.log").read_text()
    # As whole numbers: a random hex ID in the log may hold the same digits.
    assert not re.search(rf"(?<![0-9a-f]){STRANGER}(?![0-9a-f])", log), "the stranger's ID"
    assert not re.search(rf"(?<![0-9a-f]){CHAT_ID}(?![0-9a-f])", log), "the chat's ID"


@pytest.mark.parametrize("action", ["confirm", "retry"])
def test_sigkill_of_the_adapter_during_a_hung_send_leaves_it_ambiguous_until_recovered(
    served: WorkflowServer,
    telegram: FakeTelegram,
    short_tmp: Path,
    processes: Processes,
    action: str,
) -> None:
    state_dir = served.state_dir
    hang = telegram.hang_next("sendMessage", deliver=True)
    with _client(state_dir) as client:
        run_id = waiting_run(client, short_tmp / "project")
    hang.wait_entered(60)
    eventually(lambda: attempts(state_dir) == [(1, "applying", None)], "attempt 1 in flight")
    (pid,) = _adapter_pids(os.getpid())
    os.kill(pid, signal.SIGKILL)
    eventually(lambda: attempts(state_dir) == [(1, "ambiguous", None)], "attempt 1 ambiguous")
    _recover_and_check(state_dir, telegram, processes, run_id, action)


def test_sigkill_of_the_server_during_a_hung_send_leaves_it_ambiguous_until_recovered(
    state_dir: Path,
    telegram: FakeTelegram,
    fast_polls: None,
    short_tmp: Path,
    processes: Processes,
) -> None:
    write_profiles(state_dir, telegram.api_base)
    project = short_tmp / "project"
    write_workflow(project, "deploy", DEPLOY)
    hang = telegram.hang_next("sendMessage", deliver=True)
    first = processes.spawn_cli(state_dir, "server", "run", "--idle-exit", "0")
    assert first.stdout is not None and "running" in first.stdout.readline()
    with _client(state_dir) as client:
        run_id = start_run(client, project, "deploy")
    hang.wait_entered(90)
    eventually(lambda: attempts(state_dir) == [(1, "applying", None)], "attempt 1 in flight")
    adapters = _adapter_pids(first.pid)
    for pid in adapters:
        processes.adopt(pid)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(30)
    # The orphaned adapter sees its channel end and exits; it never reports the attempt.
    for pid in adapters:
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).wait(30)
    assert attempts(state_dir) == [(1, "applying", None)], "nothing settled it"
    second = processes.spawn_cli(state_dir, "server", "run", "--idle-exit", "0")
    assert second.stdout is not None and "running" in second.stdout.readline()
    assert attempts(state_dir) == [(1, "ambiguous", None)], "recovery made it ambiguous"
    _recover_and_check(state_dir, telegram, processes, run_id, "retry")
    with _client(state_dir) as client:
        client.call("server.stop", {"drainSeconds": 0})
    second.wait(60)
    assert_no_token(state_dir.parent)


def _recover_and_check(
    state_dir: Path,
    telegram: FakeTelegram,
    processes: Processes,
    run_id: str,
    action: str,
) -> None:
    """Never re-sent automatically; then the operator's confirm or retry.

    The interrupted send is still held by the fake (it records a call once answered),
    so every recorded `sendMessage` is a new send."""
    _wait_ready(state_dir, processes)
    # A new adapter is ready and has scanned for work: no second send.
    polls = len(telegram.calls_of("getUpdates"))
    telegram.wait_for_calls("getUpdates", polls + 2, 60)
    assert telegram.calls_of("sendMessage") == [] and telegram.bot_messages() == []
    status = json.loads(processes.cli(state_dir, "channel", "status", "--json").stdout)
    assert status["profiles"][0]["ambiguous"] == 1
    shown = processes.cli(state_dir, "run", "show", run_id)
    assert f"pi-workflows channel recover {run_id} confirm" in shown.stdout, shown.stdout
    recovered = processes.cli(state_dir, "channel", "recover", run_id, action)
    assert recovered.returncode == 0, recovered.stderr
    assert_no_token(state_dir.parent, shown.stdout, recovered.stdout, recovered.stderr)
    if action == "confirm":
        assert "recorded as done" in recovered.stdout
        assert "warning" not in recovered.stderr
        assert attempts(state_dir) == [(1, "applied", "confirmed")]
        polls = len(telegram.calls_of("getUpdates"))
        telegram.wait_for_calls("getUpdates", polls + 2, 60)
        assert telegram.calls_of("sendMessage") == []
        return
    assert "warning:" in recovered.stderr and "twice" in recovered.stderr
    assert "attempt 2" in recovered.stdout
    telegram.wait_for_calls("sendMessage", 1, 60)
    eventually(
        lambda: attempts(state_dir) == [(1, "ambiguous", "retried"), (2, "applied", None)],
        "attempt 2 applied",
    )
    polls = len(telegram.calls_of("getUpdates"))
    telegram.wait_for_calls("getUpdates", polls + 2, 60)
    assert len(telegram.calls_of("sendMessage")) == 1, "exactly one new attempt"
    assert len(telegram.bot_messages()) == 1


def test_a_decision_times_out_and_a_press_after_the_deadline_is_refused(
    state_dir: Path, telegram: FakeTelegram, fast_polls: None, short_tmp: Path
) -> None:
    clock = ManualClock(time.time_ns() // 1_000_000)
    write_profiles(state_dir, telegram.api_base)
    server = WorkflowServer(
        state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=True, clock=clock
    )
    server.start()
    try:
        with _client(state_dir) as client:
            run_id = waiting_run(client, short_tmp / "project", TIMED.replace("SECONDS", "60"))
            (sent,) = _presented(telegram)
            clock.advance(60_001)  # 1 ms past the deadline
            telegram.press_button(
                _button(sent, "Approve"), user_id=ALLOWED_USER, message_id=sent.message_id
            )
            done = wait_for(client, _continuation(state_dir, run_id), TERMINAL)
            assert done["result"]["output"]["value"] == {"answer": {"choice": "reject"}}
        log = state_dir / "logs" / "server.log"
        eventually(lambda: '"action":"channel.answer"' in log.read_text(), "the press handled")
        assert rows(state_dir, "SELECT outcome, provenance FROM human_decision_resolutions") == [
            ("accepted", "timeout")
        ]
        assert rows(
            state_dir,
            "SELECT count(*) FROM human_decision_answers WHERE idempotency_key LIKE 'telegram:%'",
        ) == [(0,)], "the late press was refused"
        edited = telegram.wait_for(
            lambda fake: m if (m := fake.message(sent.message_id)).edits else None, 60
        )
        assert "Timed out: the default answer (Reject) was taken." in edited.text
    finally:
        server.stop("test teardown")
    assert_no_token(state_dir.parent)
