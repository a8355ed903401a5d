"""A scripted fake Telegram Bot API on 127.0.0.1 for the channel adapter child.

It speaks the Bot API's real HTTP wire format: `POST` (or `GET`) `/bot<token>/<method>`
with parameters as a query string, a form or a JSON body, answered with
`{"ok": true, "result": ...}` or `{"ok": false, "error_code": N, "description": ...}`.
A wrong token gets 401 `Unauthorized` and an unknown method 404 `Not Found`, as the
real API answers. It serves `getMe`, `sendMessage` (with `reply_markup`),
`editMessageText`, `answerCallbackQuery` and `getUpdates` long polling (`offset`,
`timeout`, `limit`, `allowed_updates`) with `message` and `callback_query` updates.

Tests script it: `press_button` and `reply` queue updates from a given user, and
`fail_next`, `rate_limit_next`, `hang_next`, `hold_answer_next`, `drop_next`,
`trickle_next` and `huge_next` make the next call of a method answer an HTTP error (a 429
with `parameters.retry_after`), block until released, apply at once but answer only when
released, lose its connection without an answer, write its answer a few bytes a second,
or answer a body of any size (streamed, never held in memory); `fail_every` makes every
call of a method answer an error until told otherwise; `set_latency` makes every
call take a while, as a real round trip does. Every call is recorded (method,
parameters, status, result) under one lock, and `wait_for` blocks on a
condition of that record, so a test waits for what happened instead of sleeping.

It lives in the package, not under `tests/`, because the benchmarks drive it too. It
never logs: requests carry the bot token in their path.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any, TypeAlias, TypeVar
from urllib.parse import parse_qsl, urlsplit

from pi_workflows.testing._loopback_http import LoopbackServer, QuietHandler

__all__ = [
    "FAKE_BOT_TOKEN",
    "FAKE_CHAT_ID",
    "BotApiError",
    "DropConnection",
    "FakeTelegram",
    "Hang",
    "HugeAnswer",
    "RecordedCall",
    "TelegramMessage",
    "Trickle",
]

FAKE_BOT_TOKEN = "7000000001:AAFakeBotTokenForTestsOnly-0123456789"  # noqa: S105 - a fake
"""The default bot token (a real token's shape: `<bot id>:<secret>`)."""

FAKE_CHAT_ID = -1001234567890
"""The default chat the bot is in (a supergroup's ID shape)."""

_JSON_PARAMETERS = frozenset(
    {"reply_markup", "allowed_updates", "entities", "link_preview_options"}
)
_INTEGER_PARAMETERS = frozenset({"message_id", "offset", "limit", "timeout", "cache_time"})
_MAX_POLL_SECONDS = 50.0  # the real API caps long polling near this
_CHUNK = 64 * 1024

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BotApiError:
    """Answer the call with this HTTP status and Bot API description (nothing happens)."""

    status: int = 400
    description: str = "Bad Request: chat not found"
    retry_after: int | None = None
    """Sent as `parameters.retry_after` (a 429's wait, in seconds)."""


@dataclass(slots=True)
class Hang:
    """Hold the call without an answer until `release()` (or the fake stops).

    `entered` is set once a request is held. When released the call goes on as usual
    (the message is sent) if `deliver`, and the answer is written if the client is
    still there; a client killed meanwhile leaves the "was it sent?" question open,
    which is what the ambiguous-attempt tests need.

    With `applied_first` the call is applied before it is held (the message is already
    in the chat, where a person can answer it) and only its answer waits: a Bot API
    answer slower than the chat, which is what the early-answer tests need.
    """

    deliver: bool = True
    applied_first: bool = False
    entered: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        self.released.set()

    def wait_entered(self, timeout: float) -> None:
        """Block until a request is held here.

        Raises:
            TimeoutError: none arrived within `timeout` seconds.
        """
        if not self.entered.wait(timeout):
            raise TimeoutError("no request reached the scripted hang")


@dataclass(frozen=True, slots=True)
class DropConnection:
    """Read the call, then close the connection without any answer.

    With `deliver` the message is sent first (the answer is what gets lost).
    """

    deliver: bool = False


@dataclass(frozen=True, slots=True)
class Trickle:
    """Apply the call, then write its answer `bytes_per_second` bytes a second (headers
    at once, then the body), until it is written, the client leaves or the fake stops."""

    bytes_per_second: float = 1.0


@dataclass(frozen=True, slots=True)
class HugeAnswer:
    """Answer 200 with a JSON body of `size` bytes, written in chunks as it is made;
    without `declare_length` the answer has no `Content-Length` (it ends when the
    connection closes), so only reading it tells its size."""

    size: int
    declare_length: bool = True


Fault: TypeAlias = BotApiError | Hang | DropConnection | Trickle | HugeAnswer


@dataclass(frozen=True, slots=True)
class RecordedCall:
    """One Bot API call as the fake saw it (the token is not kept)."""

    method: str
    params: Mapping[str, Any]
    status: int | None
    """The HTTP status answered; None if the connection was dropped."""
    result: Any = None
    """The `result` of a 200 answer (a `getUpdates` call's updates), else None."""
    at: float = 0.0
    """`time.monotonic()` when it was recorded (after it was applied, before its answer
    was written)."""


@dataclass(slots=True)
class TelegramMessage:
    """A message in the fake chat, as it stands now."""

    message_id: int
    chat_id: int
    text: str
    reply_markup: Mapping[str, Any] | None
    from_bot: bool
    edits: int = 0

    @property
    def buttons(self) -> list[tuple[str, str]]:
        """The inline buttons as (label, callback data), row by row."""
        rows = (self.reply_markup or {}).get("inline_keyboard", [])
        return [(b.get("text", ""), b.get("callback_data", "")) for row in rows for b in row]


class _Dropped(Exception):  # noqa: N818 - a control-flow signal, not an error
    """The scripted fault says: answer nothing, close the connection."""


class FakeTelegram(LoopbackServer):
    """A real HTTP server on 127.0.0.1 (ephemeral port) that plays the Bot API.

    Use it as a context manager, or call `start` and `stop`.
    """

    def __init__(
        self,
        *,
        token: str = FAKE_BOT_TOKEN,
        chat_id: int = FAKE_CHAT_ID,
        bot_username: str = "pi_workflows_fake_bot",
        host: str = "127.0.0.1",
    ) -> None:
        super().__init__(
            _handler_class(self), host=host, name="fake-telegram", what="the fake Bot API"
        )
        self.token = token
        self.chat_id = chat_id
        self.bot_username = bot_username
        self.bot_id = int(token.split(":", 1)[0]) if token.split(":", 1)[0].isdigit() else 1
        self._calls: list[RecordedCall] = []
        self._faults: dict[str, deque[Fault]] = {}
        self._hangs: list[Hang] = []
        self._updates: list[dict[str, Any]] = []
        self._written_updates: set[int] = set()
        self._messages: dict[int, TelegramMessage] = {}
        self._message_ids = itertools.count(1)
        self._update_ids = itertools.count(1001)
        self._callback_ids = itertools.count(1)
        self._latency: dict[str | None, float] = {}
        self._failing: dict[str, BotApiError] = {}

    # -- lifecycle (start, stop and the context manager: LoopbackServer) -------------

    def _wake_handlers(self) -> None:
        """Release held calls (long polls end on `_stopping`)."""
        with self._lock:
            hangs = list(self._hangs)
        for hang in hangs:
            hang.release()

    @property
    def api_base(self) -> str:
        """`http://127.0.0.1:PORT`; the Bot API URL is `{api_base}/bot{token}/{method}`."""
        return f"http://127.0.0.1:{self.port}"

    # -- scripting -------------------------------------------------------------------

    def press_button(
        self,
        callback_data: str,
        *,
        user_id: int,
        message_id: int | None = None,
        chat_id: int | None = None,
    ) -> int:
        """Queue a `callback_query` update: `user_id` pressed a button; its update ID.

        `message_id` names the bot message the button is on (the latest bot message
        when None); `chat_id` makes the update come from another chat.
        """
        with self._lock:
            message = self._message_json(self._pick_message(message_id, chat_id))
            if chat_id is not None:
                message["chat"] = _chat_json(chat_id)  # a press seen in another chat
            query = {
                "id": f"cbq-{next(self._callback_ids)}",
                "from": _user_json(user_id),
                "message": message,
                "chat_instance": "fake-chat-instance",
                "data": callback_data,
            }
            return self._queue_update("callback_query", query)

    def reply(
        self, text: str, *, reply_to_message_id: int, user_id: int, chat_id: int | None = None
    ) -> int:
        """Queue a `message` update: `user_id` replied `text` to a message; its update ID."""
        with self._lock:
            chat = self.chat_id if chat_id is None else chat_id
            original = self._messages.get(reply_to_message_id)
            message_id = next(self._message_ids)
            self._messages[message_id] = TelegramMessage(message_id, chat, text, None, False)
            body: dict[str, Any] = {
                "message_id": message_id,
                "from": _user_json(user_id),
                "chat": _chat_json(chat),
                "date": int(time.time()),
                "text": text,
            }
            if original is not None:
                body["reply_to_message"] = self._message_json(original)
            return self._queue_update("message", body)

    def fail_next(
        self, method: str, status: int = 400, description: str = "Bad Request: chat not found"
    ) -> None:
        """The next call of `method` answers `status` with `description`."""
        self._add_fault(method, BotApiError(status, description))

    def rate_limit_next(self, method: str, retry_after: int) -> None:
        """The next call of `method` answers 429 with `parameters.retry_after`."""
        description = f"Too Many Requests: retry after {retry_after}"
        self._add_fault(method, BotApiError(429, description, retry_after))

    def trickle_next(self, method: str, bytes_per_second: float = 1.0) -> None:
        """The next call of `method` is applied, then its answer trickles out."""
        self._add_fault(method, Trickle(bytes_per_second))

    def huge_next(self, method: str, size: int, *, declare_length: bool = True) -> None:
        """The next call of `method` answers a `size`-byte body (streamed)."""
        self._add_fault(method, HugeAnswer(size, declare_length))

    def fail_every(self, method: str, status: int | None, description: str = "Bad Gateway") -> None:
        """Every later call of `method` answers `status` (after the scripted faults
        queued for it), until called again with `status` None."""
        with self._lock:
            if status is None:
                self._failing.pop(method.lower(), None)
            else:
                self._failing[method.lower()] = BotApiError(status, description)

    def set_latency(self, seconds: float, *methods: str) -> None:
        """Every later call of `methods` (of every method but `getUpdates` when none is
        named) waits `seconds` before it is served, like a real round trip."""
        with self._lock:
            for method in methods or (None,):
                self._latency[None if method is None else method.lower()] = seconds

    def hang_next(self, method: str, *, deliver: bool = True) -> Hang:
        """The next call of `method` is held until the returned handle is released."""
        hang = Hang(deliver=deliver)
        self._add_fault(method, hang)
        return hang

    def hold_answer_next(self, method: str) -> Hang:
        """The next call of `method` is applied at once (a `sendMessage` puts its message
        in the chat) but answered only when the returned handle is released."""
        hang = Hang(deliver=True, applied_first=True)
        self._add_fault(method, hang)
        return hang

    def handed_out(self, update_id: int) -> bool:
        """Whether a `getUpdates` answer carrying `update_id` was written to the client."""
        with self._lock:
            return update_id in self._written_updates

    def drop_next(self, method: str, *, deliver: bool = False) -> None:
        """The next call of `method` loses its connection without an answer."""
        self._add_fault(method, DropConnection(deliver))

    # -- inspection ------------------------------------------------------------------

    @property
    def calls(self) -> list[RecordedCall]:
        """A copy of every call answered (or dropped) so far, in order."""
        with self._lock:
            return list(self._calls)

    def calls_of(self, method: str) -> list[RecordedCall]:
        return [c for c in self.calls if c.method == method]

    def message(self, message_id: int) -> TelegramMessage:
        """The chat message `message_id` as it stands now (a copy)."""
        with self._lock:
            m = self._messages[message_id]
            return TelegramMessage(
                m.message_id, m.chat_id, m.text, m.reply_markup, m.from_bot, m.edits
            )

    def bot_messages(self) -> list[TelegramMessage]:
        """Every message the bot sent, oldest first (copies)."""
        with self._lock:
            ids = [i for i, m in self._messages.items() if m.from_bot]
        return [self.message(i) for i in ids]

    def pending_updates(self) -> int:
        """Updates not yet confirmed by a `getUpdates` offset."""
        with self._lock:
            return len(self._updates)

    def wait_for(self, condition: Callable[[FakeTelegram], T | None], timeout: float) -> T:
        """Wait until `condition(self)` returns something truthy; return it.

        The condition is re-checked after every call the fake records and every update
        a test injects.

        Raises:
            TimeoutError: it stayed falsy for `timeout` seconds.
        """
        value = self._wait(lambda: condition(self), timeout)
        if value is None:
            raise TimeoutError("the fake Bot API never reached the awaited condition")
        return value

    def wait_for_calls(
        self, method: str, count: int = 1, timeout: float = 10.0
    ) -> list[RecordedCall]:
        """Wait until `count` calls of `method` were answered or dropped; return them."""
        return self.wait_for(
            lambda fake: calls if len(calls := fake.calls_of(method)) >= count else None,
            timeout,
        )

    # -- used by the handler ---------------------------------------------------------

    def _add_fault(self, method: str, fault: Fault) -> None:
        with self._lock:
            self._faults.setdefault(method.lower(), deque()).append(fault)
            if isinstance(fault, Hang):
                self._hangs.append(fault)

    def _delay(self, method: str) -> None:
        """Wait the method's scripted latency (woken early when the fake stops)."""
        name = method.lower()
        with self._lock:
            if name in self._latency:
                seconds = self._latency[name]
            else:
                seconds = 0.0 if name == "getupdates" else self._latency.get(None, 0.0)
            deadline = time.monotonic() + seconds
            while not self._stopping and (left := deadline - time.monotonic()) > 0:
                self._lock.wait(left)

    def _stopped(self) -> bool:
        with self._lock:
            return self._stopping

    def _take_fault(self, method: str) -> Fault | None:
        with self._lock:
            faults = self._faults.get(method.lower())
            return faults.popleft() if faults else self._failing.get(method.lower())

    def _record(
        self, method: str, params: Mapping[str, Any], status: int | None, result: Any = None
    ) -> None:
        with self._lock:
            self._calls.append(
                RecordedCall(
                    method,
                    dict(params),
                    status,
                    result if status == 200 else None,
                    time.monotonic(),
                )
            )
            self._lock.notify_all()

    def _handed_out(self, updates: Any) -> None:
        with self._lock:
            self._written_updates.update(u["update_id"] for u in updates)
            self._lock.notify_all()

    def _queue_update(self, kind: str, body: dict[str, Any]) -> int:
        update_id = next(self._update_ids)
        self._updates.append({"update_id": update_id, kind: body})
        self._lock.notify_all()
        return update_id

    def _pick_message(self, message_id: int | None, chat_id: int | None) -> TelegramMessage:
        if message_id is not None:
            return self._messages[message_id]
        bot = [m for m in self._messages.values() if m.from_bot]
        if bot:
            return bot[-1]
        # A press on a message the fake never saw (the test scripts the update alone).
        chat = self.chat_id if chat_id is None else chat_id
        return TelegramMessage(next(self._message_ids), chat, "(unknown)", None, True)

    def _message_json(self, message: TelegramMessage) -> dict[str, Any]:
        body: dict[str, Any] = {
            "message_id": message.message_id,
            "from": _user_json(self.bot_id, bot_username=self.bot_username)
            if message.from_bot
            else _user_json(1),
            "chat": _chat_json(message.chat_id),
            "date": int(time.time()),
            "text": message.text,
        }
        if message.edits:
            body["edit_date"] = int(time.time())
        if message.reply_markup:
            body["reply_markup"] = message.reply_markup
        return body

    def _dispatch(self, method: str, params: Mapping[str, Any]) -> tuple[int, Any]:
        """Answer one call: (HTTP status, result or (error description))."""
        handler = _METHODS.get(method.lower())
        if handler is None:
            return 404, "Not Found"
        return handler(self, params)

    def _get_me(self, params: Mapping[str, Any]) -> tuple[int, Any]:
        return 200, {
            **_user_json(self.bot_id, bot_username=self.bot_username),
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
        }

    def _send_message(self, params: Mapping[str, Any]) -> tuple[int, Any]:
        text = params.get("text")
        if not isinstance(text, str) or not text:
            return 400, "Bad Request: message text is empty"
        if _as_int(params.get("chat_id")) != self.chat_id:
            return 400, "Bad Request: chat not found"
        markup = params.get("reply_markup")
        with self._lock:
            message = TelegramMessage(
                next(self._message_ids), self.chat_id, text, markup or None, True
            )
            self._messages[message.message_id] = message
            return 200, self._message_json(message)

    def _edit_message_text(self, params: Mapping[str, Any]) -> tuple[int, Any]:
        text = params.get("text")
        if not isinstance(text, str) or not text:
            return 400, "Bad Request: message text is empty"
        if _as_int(params.get("chat_id")) != self.chat_id:
            return 400, "Bad Request: chat not found"
        markup = params.get("reply_markup") or None
        with self._lock:
            message = self._messages.get(_as_int(params.get("message_id")) or 0)
            if message is None or not message.from_bot:
                return 400, "Bad Request: message to edit not found"
            if message.text == text and message.reply_markup == markup:
                return 400, (
                    "Bad Request: message is not modified: specified new message content "
                    "and reply markup are exactly the same as a current content and reply "
                    "markup of the message"
                )
            message.text = text
            message.reply_markup = markup
            message.edits += 1
            return 200, self._message_json(message)

    def _answer_callback_query(self, params: Mapping[str, Any]) -> tuple[int, Any]:
        if not params.get("callback_query_id"):
            return (
                400,
                "Bad Request: query is too old and response timeout expired or query ID is invalid",
            )
        return 200, True

    def _get_updates(self, params: Mapping[str, Any]) -> tuple[int, Any]:
        offset = _as_int(params.get("offset"))
        limit = min(max(_as_int(params.get("limit")) or 100, 1), 100)
        timeout = min(float(_as_int(params.get("timeout")) or 0), _MAX_POLL_SECONDS)
        allowed = params.get("allowed_updates") or None
        deadline = time.monotonic() + timeout
        with self._lock:
            if offset is not None:
                # An offset confirms every update before it, as the real API forgets them.
                self._updates = [u for u in self._updates if u["update_id"] >= offset]
            while True:
                ready = [u for u in self._updates if _wanted(u, allowed)][:limit]
                left = deadline - time.monotonic()
                if ready or left <= 0 or self._stopping:
                    return 200, ready
                self._lock.wait(left)


_Method: TypeAlias = Callable[[FakeTelegram, Mapping[str, Any]], tuple[int, Any]]
_METHODS: dict[str, _Method] = {
    "getme": FakeTelegram._get_me,
    "sendmessage": FakeTelegram._send_message,
    "editmessagetext": FakeTelegram._edit_message_text,
    "answercallbackquery": FakeTelegram._answer_callback_query,
    "getupdates": FakeTelegram._get_updates,
}
_DELIVERING = frozenset({"sendmessage", "editmessagetext"})


def _body(status: int, result: Any) -> dict[str, Any]:
    """The Bot API's answer object; a `(description, retry_after)` error adds its
    `parameters`."""
    if status == 200:
        return {"ok": True, "result": result}
    if isinstance(result, tuple):
        description, retry_after = result
        return {
            "ok": False,
            "error_code": status,
            "description": description,
            "parameters": {"retry_after": retry_after},
        }
    return {"ok": False, "error_code": status, "description": result}


def _wanted(update: Mapping[str, Any], allowed: object) -> bool:
    if not isinstance(allowed, list) or not allowed:
        return True
    return any(kind in update for kind in allowed)


def _user_json(user_id: int, *, bot_username: str | None = None) -> dict[str, Any]:
    if bot_username is not None:
        return {"id": user_id, "is_bot": True, "first_name": "Fake bot", "username": bot_username}
    return {"id": user_id, "is_bot": False, "first_name": "Operator"}


def _chat_json(chat_id: int) -> dict[str, Any]:
    return {"id": chat_id, "type": "supergroup" if chat_id < 0 else "private", "title": "Fake"}


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None


def _parse_params(query: str, content_type: str, raw: bytes) -> dict[str, Any]:
    """Parameters from the query string and a form or JSON body, as the Bot API takes."""
    params: dict[str, Any] = dict(parse_qsl(query, keep_blank_values=True))
    if raw and "json" in content_type:
        body = json.loads(raw)
        if isinstance(body, dict):
            params.update(body)
    elif raw and "multipart" in content_type:
        raise ValueError("multipart bodies are not supported by the fake")
    elif raw:
        params.update(parse_qsl(raw.decode("utf-8"), keep_blank_values=True))
    for key in _JSON_PARAMETERS & params.keys():
        if isinstance(params[key], str):
            params[key] = json.loads(params[key])
    for key in _INTEGER_PARAMETERS & params.keys():
        number = _as_int(params[key])
        if number is not None:
            params[key] = number
    if "chat_id" in params and (number := _as_int(params["chat_id"])) is not None:
        params["chat_id"] = number
    return params


def _handler_class(fake: FakeTelegram) -> type[BaseHTTPRequestHandler]:
    class Handler(QuietHandler):  # never logs: the request line holds the bot token
        def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
            self._serve(b"")

        def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
            self._serve(self.read_body())

        def _serve(self, raw: bytes) -> None:
            url = urlsplit(self.path)
            prefix, _, method = url.path.lstrip("/").partition("/")
            if prefix != f"bot{fake.token}":
                self._answer(401, "Unauthorized")
                return
            try:
                params = _parse_params(url.query, self.headers.get("content-type") or "", raw)
            except ValueError:
                self._answer(400, "Bad Request: can't parse request parameters")
                return
            fake._delay(method)
            fault = fake._take_fault(method)
            if isinstance(fault, HugeAnswer):
                fake._record(method, params, 200)
                self._stream_huge(fault)
                return
            try:
                status, result = self._call(method, params, fault)
            except _Dropped:
                self.close_connection = True
                return
            fake._record(method, params, status, result)
            if isinstance(fault, Trickle):
                written = self._trickle(status, result, fault.bytes_per_second)
            else:
                written = self._answer(status, result)
            if written and status == 200 and method.lower() == "getupdates":
                fake._handed_out(result)

        def _call(
            self, method: str, params: Mapping[str, Any], fault: Fault | None
        ) -> tuple[int, Any]:
            if isinstance(fault, BotApiError):
                if fault.retry_after is not None:
                    return fault.status, (fault.description, fault.retry_after)
                return fault.status, fault.description
            if isinstance(fault, Hang) and fault.applied_first:
                answer = fake._dispatch(method, params)
                fault.entered.set()
                fault.released.wait()
                return answer
            if isinstance(fault, Hang):
                fault.entered.set()
                fault.released.wait()
                if not fault.deliver:
                    return 500, "Internal Server Error"
            if isinstance(fault, DropConnection):
                if fault.deliver and method.lower() in _DELIVERING:
                    fake._dispatch(method, params)
                fake._record(method, params, None)
                raise _Dropped
            return fake._dispatch(method, params)

        def _answer(self, status: int, result: Any) -> bool:
            return self.send_json(status, _body(status, result))  # False: the client left

        def _trickle(self, status: int, result: Any, rate: float) -> bool:
            data = json.dumps(_body(status, result)).encode()
            pause = 1.0 / rate
            try:
                self._headers(status, len(data))
                for index in range(len(data)):
                    if fake._stopped():
                        break
                    self.wfile.write(data[index : index + 1])
                    self.wfile.flush()
                    if index + 1 < len(data):
                        time.sleep(pause)  # the scripted rate, not a wait for a condition
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True
                return False
            return True

        def _stream_huge(self, fault: HugeAnswer) -> None:
            head, tail = b'{"ok": true, "result": [], "padding": "', b'"}'
            chunk = b"x" * _CHUNK
            size = max(fault.size, len(head) + len(tail))
            try:
                if fault.declare_length:
                    self._headers(200, size)
                else:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Connection", "close")
                    self.end_headers()
                self.wfile.write(head)
                left = size - len(head) - len(tail)
                while left > 0 and not fake._stopped():
                    self.wfile.write(chunk[: min(left, _CHUNK)])
                    left -= _CHUNK
                self.wfile.write(tail)
            except (BrokenPipeError, ConnectionResetError):
                pass
            self.close_connection = True

        def _headers(self, status: int, length: int) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(length))
            self.end_headers()

    return Handler
