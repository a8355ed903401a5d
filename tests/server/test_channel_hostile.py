"""Telegram delivery under a slow or hostile Bot API: a real server, its real adapter
child, the Bot API fake on 127.0.0.1 answering slowly, 429, or a trickle.

Issue 25, "How it must behave": a 429's retry_after is waited before the next send
and the decision is presented once; a flood of presses (strangers' and an allowed
person's) at 0.3 s a call makes no other run's delivery doubtful; a trickled send ends
at its deadline, ambiguous with a recover path, and a trickled `getUpdates` delays a
press by at most the long-poll time plus its deadline; SIGKILL of the adapter during a
429's wait sends the decision once, no earlier than the 429's retry_after.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.engine.channel_adapter import POLL_GRACE_SECONDS, SEND_TIMEOUT_SECONDS
from pi_workflows.testing import FakeTelegram
from tests.conftest import Processes
from tests.server.channel_rig import (
    ALLOWED_USER,
    CHAT_ID,
    STRANGER,
    TOKEN,
    attempts,
    eventually,
    rows,
    waiting_run,
    write_profiles,
)
from tests.server.runs import TERMINAL, wait_for

pytestmark = pytest.mark.timeout(180)

POLL_SECONDS = 1


@pytest.fixture
def telegram() -> Iterator[FakeTelegram]:
    with FakeTelegram(token=TOKEN, chat_id=CHAT_ID) as fake:
        yield fake


@pytest.fixture
def served(
    state_dir: Path, telegram: FakeTelegram, monkeypatch: pytest.MonkeyPatch
) -> Iterator[WorkflowServer]:
    monkeypatch.setenv("PI_WORKFLOWS_TELEGRAM_POLL_SECONDS", str(POLL_SECONDS))
    write_profiles(state_dir, telegram.api_base)
    server = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=True)
    server.start()
    try:
        yield server
    finally:
        server.stop("test teardown")


def _client(state_dir: Path) -> WorkflowClient:
    return WorkflowClient(state_dir, autostart=False, timeout=30)


def _button(message: Any, label: str) -> str:
    return str(next(data for text, data in message.buttons if text == label))


def _delivery_states(state_dir: Path) -> list[str]:
    return [state for (state,) in rows(state_dir, "SELECT delivery_state FROM channel_messages")]


def _resolutions(state_dir: Path) -> int:
    return int(rows(state_dir, "SELECT count(*) FROM human_decision_resolutions")[0][0])


def _verify(state_dir: Path) -> None:
    with _client(state_dir) as client:
        report = client.call("state.verify")["receipt"]
    assert report["consistent"], report["findings"]


def test_a_429_waits_its_retry_after_and_the_decision_is_presented_once(
    served: WorkflowServer, telegram: FakeTelegram, short_tmp: Path
) -> None:
    state_dir = served.state_dir
    telegram.rate_limit_next("sendMessage", 2)
    with _client(state_dir) as client:
        waiting_run(client, short_tmp / "project")
    limited, sent = telegram.wait_for_calls("sendMessage", 2, 60)
    assert (limited.status, sent.status) == (429, 200)
    assert sent.at - limited.at >= 2.0, "the next sendMessage came before retry_after"
    eventually(lambda: _delivery_states(state_dir) == ["presented"], "the delivery presented")
    assert len(telegram.bot_messages()) == 1
    assert attempts(state_dir) == [(1, "cancelled", None), (2, "applied", None)]
    _verify(state_dir)


def test_a_flood_of_presses_at_a_slow_api_makes_no_other_delivery_doubtful(
    served: WorkflowServer, telegram: FakeTelegram, short_tmp: Path
) -> None:
    state_dir = served.state_dir
    project = short_tmp / "project"
    with _client(state_dir) as client:
        first = waiting_run(client, project)
        (message,) = telegram.wait_for(lambda fake: fake.bot_messages() or None, 60)
        telegram.set_latency(0.3)
        approve = _button(message, "Approve")
        for _ in range(40):
            telegram.press_button(approve, user_id=STRANGER, message_id=message.message_id)
            telegram.press_button(approve, user_id=ALLOWED_USER, message_id=message.message_id)
        others = [waiting_run(client, project), waiting_run(client, project)]
        done = wait_for(client, first, {"waiting"} | TERMINAL)
        for run_id in others:
            assert wait_for(client, run_id, {"waiting"} | TERMINAL)["display"]["status"] in (
                "waiting"
            )
    eventually(
        lambda: (
            len(telegram.bot_messages()) == 3 and "presenting" not in _delivery_states(state_dir)
        ),
        "the other runs' decisions delivered",
        timeout=90,
    )
    states = _delivery_states(state_dir)
    assert set(states) <= {"presented"}, states
    assert "ambiguous" not in {s for (s,) in rows(state_dir, "SELECT state FROM effects")}
    # Not even delayed into a retry: each delivery went through at its first attempt.
    assert attempts(state_dir) == [(1, "applied", None)] * 3
    assert _resolutions(state_dir) == 1, "the decision is resolved once"
    assert done["display"]["status"] in ("waiting", "completed")
    # Strangers cost no call: at most one answerCallbackQuery per allowed press.
    assert len(telegram.calls_of("answerCallbackQuery")) <= 40
    _verify(state_dir)


def test_a_trickled_poll_delays_a_press_boundedly_and_a_trickled_send_ends_at_its_deadline(
    served: WorkflowServer, telegram: FakeTelegram, short_tmp: Path, processes: Processes
) -> None:
    state_dir = served.state_dir
    project = short_tmp / "project"
    with _client(state_dir) as client:
        first = waiting_run(client, project)
        (message,) = telegram.wait_for(lambda fake: fake.bot_messages() or None, 60)
        # The next getUpdates answer trickles; a press arrives while it does.
        polls = len(telegram.calls_of("getUpdates"))
        telegram.trickle_next("getUpdates", bytes_per_second=1)
        telegram.wait_for_calls("getUpdates", polls + 2, 30)
        pressed = time.monotonic()
        telegram.press_button(
            _button(message, "Approve"), user_id=ALLOWED_USER, message_id=message.message_id
        )
        eventually(lambda: _resolutions(state_dir) == 1, "the press resolved the decision", 60)
        delay = time.monotonic() - pressed
        bound = POLL_SECONDS + POLL_SECONDS + POLL_GRACE_SECONDS
        assert delay <= bound + 5.0, f"a trickled getUpdates held a press {delay:.1f} s"
        wait_for(client, first, {"waiting"} | TERMINAL)

        # A second decision's sendMessage is applied, then its answer trickles.
        telegram.trickle_next("sendMessage", bytes_per_second=1)
        second = waiting_run(client, project)
        trickled = telegram.wait_for_calls("sendMessage", 2, 30)[-1]
        eventually(
            lambda: "ambiguous" in _delivery_states(state_dir), "the trickled send ambiguous", 60
        )
        ended = time.monotonic() - trickled.at
        assert SEND_TIMEOUT_SECONDS - 1.0 <= ended <= SEND_TIMEOUT_SECONDS + 5.0, ended
        view = client.call("run.get", run_id=second)["receipt"]
        assert "channelRecoverRetry" in view["display"]["controls"]
    status = json.loads(processes.cli(state_dir, "channel", "status", "--json").stdout)
    assert status["profiles"][0]["ambiguous"] == 1
    _verify(state_dir)


def test_sigkill_of_the_adapter_during_a_429_wait_sends_it_once_after_retry_after(
    served: WorkflowServer, telegram: FakeTelegram, short_tmp: Path
) -> None:
    state_dir = served.state_dir
    telegram.rate_limit_next("sendMessage", 3)
    with _client(state_dir) as client:
        waiting_run(client, short_tmp / "project")
    eventually(lambda: attempts(state_dir) == [(1, "cancelled", None)], "the 429 recorded")
    (pid,) = _adapter_pids()
    os.kill(pid, signal.SIGKILL)
    limited, sent = telegram.wait_for_calls("sendMessage", 2, 60)
    assert sent.at - limited.at >= 3.0, "a new adapter sent before the 429's retry_after"
    eventually(lambda: _delivery_states(state_dir) == ["presented"], "the delivery presented")
    assert len(telegram.bot_messages()) == 1
    assert attempts(state_dir) == [(1, "cancelled", None), (2, "applied", None)]
    _verify(state_dir)


def _adapter_pids() -> list[int]:
    found = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "pi_workflows.engine.channel_adapter" in " ".join(child.cmdline()):
                found.append(child.pid)
    return found


def test_a_delivery_not_sent_within_the_bound_is_failed_shown_and_sent_again_on_retry(
    state_dir: Path,
    telegram: FakeTelegram,
    short_tmp: Path,
    processes: Processes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PI_WORKFLOWS_CHANNEL_RETRY_BOUND_S", "2")
    telegram.fail_every("sendMessage", 502)
    served = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=True)
    monkeypatch.setenv("PI_WORKFLOWS_TELEGRAM_POLL_SECONDS", str(POLL_SECONDS))
    write_profiles(state_dir, telegram.api_base)
    served.start()
    try:
        with _client(state_dir) as client:
            run_id = waiting_run(client, short_tmp / "project")
        eventually(lambda: _delivery_states(state_dir) == ["failed"], "the delivery failed", 60)
        tries = len(telegram.calls_of("sendMessage"))
        assert tries >= 2, "backed off and tried again before failing"
        first, last = telegram.calls_of("sendMessage")[0], telegram.calls_of("sendMessage")[-1]
        assert last.at - first.at >= 2.0, "the bound counts from the first not-sent attempt"
        status = json.loads(processes.cli(state_dir, "channel", "status", "--json").stdout)
        assert status["profiles"][0]["failed"] == 1
        shown = processes.cli(state_dir, "run", "show", run_id).stdout
        assert f"pi-workflows channel recover {run_id} retry" in shown, shown
        assert "failed (serverError)" in shown, shown
        assert len(telegram.calls_of("sendMessage")) == tries, "never sent again on its own"
        telegram.fail_every("sendMessage", None)
        recovered = processes.cli(state_dir, "channel", "recover", run_id, "retry")
        assert recovered.returncode == 0, recovered.stderr
        eventually(lambda: _delivery_states(state_dir) == ["presented"], "sent again", 60)
        assert len(telegram.bot_messages()) == 1
        _verify(state_dir)
    finally:
        served.stop("test teardown")
