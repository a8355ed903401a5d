"""The fake Bot API itself, over real HTTP: wire format, scripting and the call record."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from pi_workflows.testing import FAKE_CHAT_ID, FakeTelegram

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def fake() -> Iterator[FakeTelegram]:
    with FakeTelegram() as server:
        yield server


def call(
    fake: FakeTelegram,
    method: str,
    params: dict[str, Any] | None = None,
    *,
    token: str | None = None,
) -> tuple[int, dict[str, Any]]:
    connection = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=20)
    try:
        body = json.dumps(params or {})
        path = f"/bot{token or fake.token}/{method}"
        connection.request("POST", path, body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


KEYBOARD = {"inline_keyboard": [[{"text": "Approve", "callback_data": "d:1:approve"}]]}


def test_get_me_and_a_wrong_token_answer_like_the_real_api(fake: FakeTelegram) -> None:
    status, body = call(fake, "getMe")
    assert status == 200 and body["ok"] is True
    assert body["result"]["is_bot"] is True and body["result"]["username"] == fake.bot_username
    status, body = call(fake, "getMe", token="1:wrong")
    assert (status, body) == (401, {"ok": False, "error_code": 401, "description": "Unauthorized"})
    status, body = call(fake, "noSuchMethod")
    assert status == 404 and body["error_code"] == 404


def test_send_edit_and_a_button_press_round_trip(fake: FakeTelegram) -> None:
    status, sent = call(
        fake, "sendMessage", {"chat_id": FAKE_CHAT_ID, "text": "Deploy?", "reply_markup": KEYBOARD}
    )
    assert status == 200
    message_id = sent["result"]["message_id"]
    assert fake.message(message_id).buttons == [("Approve", "d:1:approve")]

    update_id = fake.press_button("d:1:approve", user_id=42)
    status, updates = call(fake, "getUpdates", {"offset": 0, "timeout": 5})
    [update] = updates["result"]
    assert update["update_id"] == update_id
    assert update["callback_query"]["from"]["id"] == 42
    assert update["callback_query"]["message"]["message_id"] == message_id
    assert update["callback_query"]["data"] == "d:1:approve"

    status, edited = call(
        fake, "editMessageText", {"chat_id": FAKE_CHAT_ID, "message_id": message_id, "text": "Done"}
    )
    assert status == 200 and "reply_markup" not in edited["result"]
    assert fake.message(message_id).buttons == [] and fake.message(message_id).edits == 1
    status, again = call(
        fake, "editMessageText", {"chat_id": FAKE_CHAT_ID, "message_id": message_id, "text": "Done"}
    )
    assert status == 400 and "message is not modified" in again["description"]

    # The offset confirms the update: it is not delivered twice.
    status, empty = call(fake, "getUpdates", {"offset": update_id + 1, "timeout": 0})
    assert empty["result"] == [] and fake.pending_updates() == 0


def test_long_poll_waits_for_an_injected_reply_and_filters_allowed_updates(
    fake: FakeTelegram,
) -> None:
    _, sent = call(fake, "sendMessage", {"chat_id": FAKE_CHAT_ID, "text": "Why?"})
    results: list[dict[str, Any]] = []
    poller = threading.Thread(
        target=lambda: results.append(
            call(fake, "getUpdates", {"timeout": 10, "allowed_updates": ["message"]})[1]
        )
    )
    poller.start()
    fake.press_button("d:1:approve", user_id=42)  # filtered out: not an allowed update kind
    fake.reply("because", reply_to_message_id=sent["result"]["message_id"], user_id=42)
    poller.join(timeout=15)
    [update] = results[0]["result"]
    assert update["message"]["text"] == "because"
    assert update["message"]["reply_to_message"]["message_id"] == sent["result"]["message_id"]


def test_scripted_failures_are_answered_once_each(fake: FakeTelegram) -> None:
    params = {"chat_id": FAKE_CHAT_ID, "text": "x"}
    fake.fail_next("sendMessage", 400, "Bad Request: chat not found")
    fake.fail_next("sendMessage", 500, "Internal Server Error")
    assert call(fake, "sendMessage", params)[0] == 400
    assert call(fake, "sendMessage", params)[0] == 500
    assert call(fake, "sendMessage", params)[0] == 200
    assert [c.status for c in fake.calls_of("sendMessage")] == [400, 500, 200]
    assert len(fake.bot_messages()) == 1

    fake.drop_next("sendMessage")
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        call(fake, "sendMessage", params)
    assert fake.calls_of("sendMessage")[-1].status is None
    assert len(fake.bot_messages()) == 1


def test_a_hung_send_answers_after_release(fake: FakeTelegram) -> None:
    hang = fake.hang_next("sendMessage")
    results: list[int] = []
    sender = threading.Thread(
        target=lambda: results.append(
            call(fake, "sendMessage", {"chat_id": FAKE_CHAT_ID, "text": "x"})[0]
        )
    )
    sender.start()
    hang.wait_entered(10)
    assert fake.calls_of("sendMessage") == [] and results == []
    hang.release()
    fake.wait_for_calls("sendMessage", 1, timeout=10)
    sender.join(timeout=10)
    assert results == [200] and len(fake.bot_messages()) == 1


def test_a_held_answer_applies_at_once_and_answers_after_release(fake: FakeTelegram) -> None:
    held = fake.hold_answer_next("sendMessage")
    results: list[dict[str, Any]] = []
    sender = threading.Thread(
        target=lambda: results.append(
            call(fake, "sendMessage", {"chat_id": FAKE_CHAT_ID, "text": "x"})[1]
        )
    )
    sender.start()
    held.wait_entered(10)
    # The message is in the chat (a person can answer it) but the call is not answered.
    [message] = fake.bot_messages()
    assert fake.calls_of("sendMessage") == [] and results == []
    update_id = fake.reply("now", reply_to_message_id=message.message_id, user_id=42)
    assert not fake.handed_out(update_id)
    _, polled = call(fake, "getUpdates", {"timeout": 0})
    assert [u["update_id"] for u in polled["result"]] == [update_id]
    fake.wait_for(lambda f: f.handed_out(update_id), 10)  # marked once written
    held.release()
    fake.wait_for_calls("sendMessage", 1, timeout=10)
    sender.join(timeout=10)
    assert results[0]["result"]["message_id"] == message.message_id
    assert fake.calls_of("sendMessage")[0].result["message_id"] == message.message_id


def test_a_scripted_429_carries_retry_after_and_latency_delays_each_call(
    fake: FakeTelegram,
) -> None:
    fake.rate_limit_next("sendMessage", 2)
    status, body = call(fake, "sendMessage", {"chat_id": FAKE_CHAT_ID, "text": "Deploy?"})
    assert status == 429 and body["parameters"] == {"retry_after": 2}
    assert fake.bot_messages() == []
    fake.set_latency(0.2)
    started = time.monotonic()
    status, _ = call(fake, "getMe")
    assert status == 200 and time.monotonic() - started >= 0.2


def test_a_trickled_answer_is_applied_first_and_a_huge_body_is_streamed(
    fake: FakeTelegram,
) -> None:
    fake.trickle_next("sendMessage", bytes_per_second=2000)
    status, body = call(fake, "sendMessage", {"chat_id": FAKE_CHAT_ID, "text": "Deploy?"})
    assert status == 200 and body["result"]["text"] == "Deploy?"
    size = 3 * 1024 * 1024
    fake.huge_next("getUpdates", size)
    connection = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=20)
    try:
        connection.request("POST", f"/bot{fake.token}/getUpdates", "{}", {})
        response = connection.getresponse()
        data = response.read()
    finally:
        connection.close()
    assert len(data) == size and json.loads(data)["result"] == []
