"""The transport-only Telegram adapter child: `python -m pi_workflows.engine.channel_adapter`.

Implements workflow-server.md § Supervised channel adapters over `channel.v1`
(`pi_workflows.wire.channel`) with python-telegram-bot. It never opens SQLite, loads
workflow code, gets a decision subject or logs an identity; see `_Adapter` and `main`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import datetime
import logging
import os
import re
import signal
import socket
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, NoReturn

import httpx
from telegram import Bot, InlineKeyboardButton, InlineKeyboardMarkup, Update
from telegram.error import (
    ChatMigrated,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TelegramError,
    TimedOut,
)
from telegram.request import BaseRequest, RequestData

from pi_workflows.wire import channel
from pi_workflows.wire.framing import AsyncFrameReader, FrameError, encode_frame
from pi_workflows.wire.protocol import ProtocolViolation

__all__ = [
    "EXIT_BAD_CONFIG",
    "EXIT_BAD_FRAME",
    "EXIT_CLEAN",
    "EXIT_TRANSPORT",
    "AdapterConfig",
    "ConfigError",
    "main",
]

EXIT_CLEAN: Final = 0
EXIT_TRANSPORT: Final = 1
"""The Bot API refused the token or could not be reached, or an unexpected error."""
EXIT_BAD_FRAME: Final = 2
EXIT_BAD_CONFIG: Final = 3

ENV_FD: Final = "PI_WORKFLOWS_CHANNEL_FD"
ENV_EPOCH: Final = "PI_WORKFLOWS_ADAPTER_EPOCH"
ENV_PROFILE: Final = "PI_WORKFLOWS_CHANNEL_PROFILE"
ENV_TOKEN: Final = "PI_WORKFLOWS_TELEGRAM_TOKEN"  # noqa: S105 - a variable name
ENV_CHAT: Final = "PI_WORKFLOWS_TELEGRAM_CHAT_ID"
ENV_ALLOWED: Final = "PI_WORKFLOWS_TELEGRAM_ALLOWED_USERS"
ENV_API_BASE: Final = "PI_WORKFLOWS_TELEGRAM_API_BASE"
ENV_POLL: Final = "PI_WORKFLOWS_TELEGRAM_POLL_SECONDS"

DEFAULT_API_BASE: Final = "https://api.telegram.org"
DEFAULT_POLL_SECONDS: Final = 20
SEND_TIMEOUT_SECONDS: Final = 30.0
"""The overall deadline of a send or edit (waiting for a connection, connecting,
writing, reading the whole answer): past it the attempt is `failed` (unknown) if its
request began to be written, `notSent` if it never did."""
POLL_GRACE_SECONDS: Final = 10.0
"""`getUpdates`' overall deadline is its long-poll time plus this."""
ANSWER_QUERY_SECONDS: Final = 10.0
"""The overall deadline of an `answerCallbackQuery` (best effort)."""
MAX_ANSWER_BYTES: Final = 1024 * 1024
"""An answer body is read up to this; a longer one is a protocol error, never held."""
DELIVERY_CONNECTIONS: Final = 4
"""Connections for sends, edits and `getMe`: press handling never uses them."""
ANSWER_CONNECTIONS: Final = 2
"""Connections for `answerCallbackQuery`, apart from the delivery path's."""
MAX_PENDING_QUERY_ANSWERS: Final = 64
"""`answerCallbackQuery` calls in flight at most; a press beyond them gets none (it only
stops a spinner)."""
POLL_BACKOFF_SECONDS: Final = (1.0, 2.0, 5.0, 10.0)
"""Pauses between failed long polls (a retry delay, not a wait for a condition)."""
MAX_DESCRIPTION_CHARS: Final = 1024
_NOT_MODIFIED: Final = "message is not modified"
_ALLOWED_UPDATES: Final = ("message", "callback_query")

_log = logging.getLogger("pi_workflows.channel_adapter")
_last_status: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "pi_workflows_channel_adapter_last_status", default=None
)
"""The HTTP status of the last Bot API answer in this task (None: no answer arrived)."""


class ConfigError(ValueError):
    """The environment does not configure a channel adapter; names the variable only."""


@dataclass(frozen=True, slots=True)
class AdapterConfig:
    """Everything the child gets from the server (never printed: no `__repr__` fields)."""

    fd: int
    adapter_epoch: str
    profile: str
    token: str
    chat_id: int
    allowed_users: frozenset[int]
    api_base: str
    poll_seconds: int

    def __repr__(self) -> str:
        return f"AdapterConfig(profile={self.profile!r})"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AdapterConfig:
        """Read the configuration.

        Raises:
            ConfigError: a variable is missing or malformed (the message names it,
                never its value).
        """
        return cls(
            fd=_int_var(env, ENV_FD),
            adapter_epoch=_str_var(env, ENV_EPOCH),
            profile=_str_var(env, ENV_PROFILE),
            token=_str_var(env, ENV_TOKEN),
            chat_id=_int_var(env, ENV_CHAT),
            allowed_users=frozenset(
                _parse_int(part, ENV_ALLOWED)
                for part in _str_var(env, ENV_ALLOWED, allow_empty=True).split(",")
                if part.strip()
            ),
            api_base=(env.get(ENV_API_BASE) or DEFAULT_API_BASE).rstrip("/"),
            poll_seconds=_int_var(env, ENV_POLL, default=DEFAULT_POLL_SECONDS),
        )


def _str_var(env: Mapping[str, str], name: str, *, allow_empty: bool = False) -> str:
    value = env.get(name)
    if value is None or (not value and not allow_empty):
        raise ConfigError(f"{name} is not set")
    return value


def _int_var(env: Mapping[str, str], name: str, *, default: int | None = None) -> int:
    value = env.get(name)
    if value is None or not value.strip():
        if default is None:
            raise ConfigError(f"{name} is not set")
        return default
    return _parse_int(value, name)


def _parse_int(value: str, name: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise ConfigError(f"{name} is not an integer (or a comma-separated list of them)") from None


# -- privacy ------------------------------------------------------------------------


class _Redactor(logging.Filter):
    """Replaces the token, the chat ID and anything shaped like a Telegram ID in every
    log record, whoever logs it (the library, httpx, asyncio)."""

    _ids = re.compile(r"-?\d{5,}")

    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self._secrets = [s for s in secrets if s]

    def redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "<redacted>")
        return self._ids.sub("<id>", text)

    def filter(self, record: logging.LogRecord) -> bool:
        message = self.redact(record.getMessage())
        record.msg, record.args = message, None
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


def _configure_logging(config: AdapterConfig) -> _Redactor:
    redactor = _Redactor([config.token, config.token.split(":", 1)[-1]])
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(redactor)
    handler.setFormatter(logging.Formatter("channel adapter: %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)  # httpx logs every URL (with the token) at INFO
    _log.setLevel(logging.INFO)
    return redactor


def _description(exc: TelegramError, redactor: _Redactor) -> str:
    if isinstance(exc, ChatMigrated):
        return "the group chat was migrated to a supergroup"  # its text names the new chat
    return redactor.redact(exc.message)[:MAX_DESCRIPTION_CHARS]


# -- the Bot API --------------------------------------------------------------------


class NotSentError(NetworkError):
    """The request certainly never reached the Bot API (no byte of it was written):
    `reason` says why (`deadline`, `connectFailed`, `networkError`)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"not sent: {reason}")
        self.reason = reason


class AnswerTooLargeError(NetworkError):
    """The answer body was longer than `MAX_ANSWER_BYTES` (a protocol error)."""

    def __init__(self) -> None:
        super().__init__("the Bot API answer is larger than the cap")


class _BotTransport(BaseRequest):
    """python-telegram-bot's HTTP layer over its own httpx pool, with an overall deadline
    per call and a capped answer body.

    httpx's timeouts are per operation (a trickled answer never trips a read timeout),
    so the whole call runs under one `asyncio.timeout`. The body is streamed and read
    up to `MAX_ANSWER_BYTES`: a longer answer is dropped as it comes, costing no memory.
    An httpcore trace notes when the request's headers begin to be written: a failure
    before that point (a wait for a connection, a refused connect, the deadline) is
    `NotSentError`, one after it may have reached the API. Each call notes its HTTP
    status for the calling task (`_last_status`): the library raises one `NetworkError`
    for a 5xx and for a lost connection alike.
    """

    def __init__(self, *, connections: int, deadline: float) -> None:
        self._deadline = deadline
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(None),  # the overall deadline bounds every phase
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
            http1=True,
            http2=False,
        )

    @property
    def read_timeout(self) -> float | None:
        return self._deadline

    async def initialize(self) -> None:
        """Nothing to do: the client is made in `__init__`."""

    async def shutdown(self) -> None:
        await self._client.aclose()

    async def do_request(  # noqa: PLR0917 - the library's signature
        self,
        url: str,
        method: str,
        request_data: RequestData | None = None,
        read_timeout: Any = None,
        write_timeout: Any = None,
        connect_timeout: Any = None,
        pool_timeout: Any = None,
    ) -> tuple[int, bytes]:
        _last_status.set(None)
        written = asyncio.Event()

        async def trace(event: str, info: Mapping[str, Any]) -> None:
            if event.endswith("send_request_headers.started"):
                written.set()

        try:
            async with asyncio.timeout(self._deadline):
                code, body = await self._exchange(url, method, request_data, trace)
        except TimeoutError:
            if not written.is_set():
                raise NotSentError("deadline") from None
            raise TimedOut("the overall deadline passed") from None
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout):
            raise NotSentError("connectFailed") from None
        except httpx.HTTPError as exc:
            if not written.is_set():
                raise NotSentError("networkError") from None
            raise NetworkError(f"httpx.{type(exc).__name__}") from None
        _last_status.set(code)
        return code, body

    async def _exchange(
        self, url: str, method: str, request_data: RequestData | None, trace: Any
    ) -> tuple[int, bytes]:
        async with self._client.stream(
            method,
            url,
            headers={"User-Agent": self.USER_AGENT},
            data=request_data.json_parameters if request_data else None,
            files=request_data.multipart_data if request_data else None,
            extensions={"trace": trace},
        ) as response:
            length = response.headers.get("content-length", "")
            if length.isdigit() and int(length) > MAX_ANSWER_BYTES:
                raise AnswerTooLargeError
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_ANSWER_BYTES:
                    raise AnswerTooLargeError
            return response.status_code, bytes(body)


def _bot(config: AdapterConfig, request: BaseRequest, updates: BaseRequest) -> Bot:
    return Bot(
        config.token,
        base_url=f"{config.api_base}/bot",
        request=request,
        get_updates_request=updates,
    )


def _make_bots(config: AdapterConfig) -> tuple[Bot, Bot]:
    """(the delivery bot: sends, edits, `getMe`, `getUpdates`; the bot that answers
    callback queries, on connections of its own so presses never starve a send)."""
    poll_deadline = config.poll_seconds + POLL_GRACE_SECONDS
    delivery = _bot(
        config,
        _BotTransport(connections=DELIVERY_CONNECTIONS, deadline=SEND_TIMEOUT_SECONDS),
        _BotTransport(connections=1, deadline=poll_deadline),
    )
    answers = _BotTransport(connections=ANSWER_CONNECTIONS, deadline=ANSWER_QUERY_SECONDS)
    return delivery, _bot(config, answers, answers)


def _retry_after_ms(exc: RetryAfter) -> int:
    with warnings.catch_warnings():  # an int today, a timedelta in a later major version
        warnings.simplefilter("ignore")
        wait = exc.retry_after
    seconds = wait.total_seconds() if isinstance(wait, datetime.timedelta) else float(wait)
    return max(0, round(seconds * 1000))


def _failure(exc: TelegramError, redactor: _Redactor) -> channel.AttemptResult:
    """Map a Bot API exception to a result.

    `notSent`: the request never reached the API (`NotSentError`), or the API said it
    did nothing: a 429 (with its `retryAfterMs`) or a 5xx. `rejected`: a 4xx answer.
    `failed`: the outcome is unknown (the request was written, then a timeout, a lost
    connection or an answer too large).
    """
    if isinstance(exc, NotSentError):
        return {"status": "notSent", "reason": exc.reason}
    if isinstance(exc, RetryAfter):
        return {"status": "notSent", "reason": "rateLimited", "retryAfterMs": _retry_after_ms(exc)}
    status = _last_status.get()
    if status is not None and 400 <= status <= 499:
        return {
            "status": "rejected",
            "httpStatus": status,
            "description": _description(exc, redactor),
        }
    if status is not None and status >= 500:
        return {"status": "notSent", "reason": "serverError"}
    if isinstance(exc, AnswerTooLargeError):
        return {"status": "failed", "reason": "answerTooLarge"}
    return {
        "status": "failed",
        "reason": "timeout" if isinstance(exc, TimedOut) else "networkError",
    }


# -- the adapter --------------------------------------------------------------------


class _BadFrame(Exception):  # noqa: N818 - the reason code's own name
    """The server sent something this child must not act on."""


class _Adapter:
    """One adapter child's life, on one asyncio loop.

    The server's channel-adapter actor starts one child per Telegram profile through the
    process supervisor. The child gets, in its environment only, its channel's socket fd,
    its adapter epoch, its profile name, the one bot token, the chat ID, the allowed user
    IDs and the Bot API base URL. It never receives a decision subject, never opens
    SQLite, never loads workflow code and never changes run state: it sends what the
    server tells it to send, edits what it is told to edit, and forwards allowed answers.
    The server decides everything.

    Life: verify the token with `getMe`, send `channel.ready`, then at once serve the
    server's `channel.present` (one `sendMessage` with an inline keyboard, one button per
    row) and `channel.settle` (`editMessageText` without buttons) commands and long-poll
    `getUpdates`, forwarding a `callback_query` or a reply from an allowed user in the
    configured chat as `channel.answer`. Updates from anyone else are dropped and logged
    without any identity. Updates are confirmed (the next `getUpdates` offset) only after
    their answers were written to the channel, so a crash re-delivers them to the next
    child and the server's idempotency key (`telegram:<profile>:<update_id>`) adopts the
    repeat.

    Answers follow the results they depend on. A person can answer a message as soon as
    it is in the chat, which can be before the Bot API's answer to its `sendMessage`
    reaches this child; a reply names the message by its ID, which the server learns
    only from the `channel.present` result. So a batch of updates is forwarded only after
    every `channel.present` in flight when the batch arrived has written its result (see
    `_results_written`); the channel, the actor's mailbox and the database actor keep
    that order. Meanwhile the batch is unconfirmed: a crash re-delivers it.

    Results. `applied` carries the message IDs; `rejected` means the Bot API answered a
    4xx error (nothing was sent); `notSent` means nothing was sent for certain: no byte
    of the request was written (a wait for a connection, a refused connect, the
    deadline before the request started), or the API answered 429 (with its
    `retryAfterMs`) or 5xx; the server tries again itself. `failed` means the outcome is
    unknown (the request was written, then a timeout, a dropped connection or an answer
    larger than `MAX_ANSWER_BYTES`): the server's managed effect records that and never
    sends the attempt again on its own. The child never retries a call itself. A child
    killed mid-send sends nothing at all.

    Transport (`_BotTransport`). Sends, edits and `getMe` have connections of their own;
    `answerCallbackQuery` has others (at most `MAX_PENDING_QUERY_ANSWERS` in flight), so
    a flood of presses never makes a send wait; a stranger's update costs no call at
    all. Every call has one overall deadline: `SEND_TIMEOUT_SECONDS` for sends and
    edits, the long-poll time plus `POLL_GRACE_SECONDS` for `getUpdates`.

    Exit: SIGTERM -> `channel.exiting {reason: shutdown}`, status 0; the channel closed by
    the server -> status 0; a bad frame from the server (schema, epoch, profile or
    sequence) -> `channel.exiting {reason: badFrame}` best effort, status 2; a bad token
    -> `unauthorized`, an unreachable Bot API -> `unreachable`, status 1; a missing or
    malformed variable -> status 3, naming the variable only.

    Library: python-telegram-bot (`Bot(token, base_url=f"{api_base}/bot")`), which takes a
    plain-HTTP base URL as is; its exceptions do not say the HTTP status, so the request
    class below notes it per call. Nothing here logs the token, the chat ID or a user ID:
    library loggers stay at WARNING behind a redacting handler, and an unexpected error is
    reported by its class name only. The package root imports the workflow authoring API
    (`pi_workflows.engine`); the child imports no server, storage, actor, CLI or runner
    module and never `sqlite3` (tests/engine/test_channel_adapter.py checks).
    """

    def __init__(self, config: AdapterConfig, redactor: _Redactor) -> None:
        self._config = config
        self._redactor = redactor
        self._bot, self._answers = _make_bots(config)
        self._stamp = channel.ChannelStamp(config.adapter_epoch, config.profile)
        self._incoming = channel.ChannelSequenceCheck(config.adapter_epoch, config.profile)
        self._write_lock = asyncio.Lock()
        self._writer: asyncio.StreamWriter | None = None
        self._commands: set[asyncio.Task[Any]] = set()
        self._presenting: set[asyncio.Task[Any]] = set()
        """`channel.present` commands whose result is not written yet."""
        self._query_answers: set[asyncio.Task[Any]] = set()
        self._stop = asyncio.Event()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._stop.set)
        sock = socket.socket(fileno=self._config.fd)
        reader, self._writer = await asyncio.open_unix_connection(sock=sock)
        stop = asyncio.create_task(self._stop.wait())
        verify = asyncio.create_task(self._verify())
        await asyncio.wait({verify, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not verify.done():
            verify.cancel()
            await self._send_exiting("shutdown")
            return EXIT_CLEAN
        if (verified := verify.result()) is not None:
            return verified
        serve = asyncio.create_task(self._serve_channel(reader))
        poll = asyncio.create_task(self._poll())
        done, _ = await asyncio.wait({serve, poll, stop}, return_when=asyncio.FIRST_COMPLETED)
        for task in (serve, poll, stop, *self._commands):
            task.cancel()
        if stop in done:
            await self._send_exiting("shutdown")
            return EXIT_CLEAN
        finished = serve if serve in done else poll
        return finished.result()

    async def _verify(self) -> int | None:
        try:
            me = await self._bot.get_me()
        except InvalidToken:
            _log.warning("getMe: the Bot API refused the token")
            await self._send_exiting("unauthorized")
            return EXIT_TRANSPORT
        except TelegramError as exc:
            _log.warning("getMe failed: %s", type(exc).__name__)
            await self._send_exiting("unreachable")
            return EXIT_TRANSPORT
        ready: dict[str, Any] = {"kind": "channel.ready"}
        if me.username:
            ready["botUsername"] = me.username
        await self._send(ready)
        _log.info("ready")
        return None

    # -- the channel -------------------------------------------------------------

    async def _send(self, fields: dict[str, Any]) -> None:
        assert self._writer is not None
        async with self._write_lock:
            message = {**self._stamp.envelope(), **fields}
            channel.check_message(message, sender="adapter")
            self._writer.write(encode_frame(message))
            await self._writer.drain()

    async def _send_exiting(self, reason: str) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            await self._send({"kind": "channel.exiting", "reason": reason})

    async def _serve_channel(self, reader: asyncio.StreamReader) -> int:
        frames = AsyncFrameReader(reader)
        while True:
            try:
                message = await self._next_command(frames)
            except _BadFrame as exc:
                _log.warning("bad frame from the server: %s", exc)
                await self._send_exiting("badFrame")
                return EXIT_BAD_FRAME
            except (OSError, ConnectionError):
                return EXIT_CLEAN
            if message is None:
                _log.info("the server closed the channel")
                return EXIT_CLEAN
            task = asyncio.create_task(self._execute(message))
            self._commands.add(task)
            task.add_done_callback(self._commands.discard)
            if message["kind"] == "channel.present":
                self._presenting.add(task)
                task.add_done_callback(self._presenting.discard)

    async def _next_command(self, frames: AsyncFrameReader) -> channel.ServerMessage | None:
        try:
            value = await frames.read_message()
            if value is None:
                return None
            message = channel.check_message(value, sender="server")
            self._incoming.check(message)  # type: ignore[arg-type]
        except (FrameError, ProtocolViolation) as exc:
            # Both texts name only framing rules and schema locations, never content.
            raise _BadFrame(str(exc)) from None
        return message  # type: ignore[return-value]

    async def _execute(self, command: channel.ServerMessage) -> None:
        if command["kind"] == "channel.present":
            result = await self._present(command)
        else:
            result = await self._settle(command)
        await self._send(
            {
                "kind": command["kind"],
                "attemptId": command["attemptId"],
                "channelRevision": command["channelRevision"],
                "result": result,
            }
        )

    async def _present(self, command: channel.PresentCommand) -> channel.AttemptResult:
        presentation = command["presentation"]
        keyboard = [
            [InlineKeyboardButton(b["label"], callback_data=b["callbackData"])]
            for b in presentation["buttons"]
        ]
        try:
            sent = await self._bot.send_message(
                self._config.chat_id,
                presentation["text"],
                reply_markup=InlineKeyboardMarkup(keyboard) if keyboard else None,
            )
        except TelegramError as exc:
            return _failure(exc, self._redactor)
        return {"status": "applied", "messageIds": [sent.message_id]}

    async def _settle(self, command: channel.SettleCommand) -> channel.AttemptResult:
        for message_id in command["messageIds"]:
            try:
                await self._bot.edit_message_text(
                    command["text"], chat_id=self._config.chat_id, message_id=message_id
                )
            except TelegramError as exc:
                failure = _failure(exc, self._redactor)
                if failure["status"] == "rejected" and _NOT_MODIFIED in exc.message.lower():
                    continue  # an earlier attempt already showed it: done
                return failure
        return {"status": "applied", "messageIds": list(command["messageIds"])}

    # -- updates -----------------------------------------------------------------

    async def _poll(self) -> int:
        offset: int | None = None
        failures = 0
        while True:
            try:
                updates = await self._bot.get_updates(
                    offset=offset,
                    timeout=self._config.poll_seconds,
                    allowed_updates=list(_ALLOWED_UPDATES),
                )
            except InvalidToken:
                _log.warning("getUpdates: the Bot API refused the token")
                await self._send_exiting("unauthorized")
                return EXIT_TRANSPORT
            except TelegramError as exc:
                pause = POLL_BACKOFF_SECONDS[min(failures, len(POLL_BACKOFF_SECONDS) - 1)]
                if isinstance(exc, RetryAfter):  # a 429 says how long to wait
                    pause = max(pause, _retry_after_ms(exc) / 1000)
                failures += 1
                _log.warning("getUpdates failed (%s); again in %.0f s", type(exc).__name__, pause)
                await asyncio.sleep(pause)
                continue
            failures = 0
            if updates:
                await self._results_written()
            for update in updates:
                await self._forward(update)
                offset = update.update_id + 1  # confirmed by the next call

    async def _results_written(self) -> None:
        """Wait until every send in flight now has written its result (or ended).

        An update in the batch just fetched can only answer a message Telegram had
        when it answered `getUpdates`, so that message's `sendMessage` had started
        here already: waiting for the sends in flight now is enough, and a send
        started later cannot hold the batch up. Each send ends within its timeout
        (`SEND_TIMEOUT_SECONDS`).
        """
        in_flight = set(self._presenting)
        if in_flight:
            await asyncio.wait(in_flight)

    async def _forward(self, update: Update) -> None:
        answer, sender, chat = _answer_of(update)
        if answer is None:
            return
        query = update.callback_query
        if sender not in self._config.allowed_users or chat != self._config.chat_id:
            why = (
                "an identity that is not allowed"
                if chat == self._config.chat_id
                else "another chat"
            )
            # No Bot API call for it: a stranger's flood costs this child nothing but
            # the read (their button just keeps its spinner).
            _log.info("dropped an update from %s", why)
            return
        try:
            await self._send(
                {
                    "kind": "channel.answer",
                    "eventId": channel.event_id(update.update_id),
                    "answer": answer,
                }
            )
        except ProtocolViolation:
            _log.info("dropped an answer the protocol cannot carry (malformed callback data)")
        if query is not None:
            self._answer_query(query.id)

    def _answer_query(self, query_id: str) -> None:
        # Best effort: it only stops the button's spinner in the Telegram client. Its
        # own connections and a bound on those in flight keep a flood of presses off
        # the delivery path.
        if len(self._query_answers) >= MAX_PENDING_QUERY_ANSWERS:
            return
        task = asyncio.create_task(self._answers.answer_callback_query(query_id))
        task.add_done_callback(_ignore_result)
        self._query_answers.add(task)
        task.add_done_callback(self._query_answers.discard)
        self._commands.add(task)
        task.add_done_callback(self._commands.discard)


def _ignore_result(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        _log.info("answerCallbackQuery failed: %s", type(task.exception()).__name__)


def _answer_of(update: Update) -> tuple[dict[str, Any] | None, int | None, int | None]:
    """(answer, sender user ID, chat ID) of an update that may answer a presentation."""
    query = update.callback_query
    if query is not None:
        if query.data is None or query.message is None:
            return None, None, None
        return {"callbackData": query.data}, query.from_user.id, query.message.chat.id
    message = update.message
    if message is None or message.reply_to_message is None or not message.text:
        return None, None, None
    sender = message.from_user.id if message.from_user is not None else None
    answer = {"replyToMessageId": message.reply_to_message.message_id, "text": message.text}
    return answer, sender, message.chat.id


def _report_unexpected(exc_type: type[BaseException], exc: BaseException, tb: object) -> None:
    # A traceback may quote a URL or a message with the token: say the class only.
    sys.stderr.write(f"channel adapter: unexpected {exc_type.__name__}\n")


def main() -> NoReturn:
    """Run the adapter with the configuration in the environment; exit with its status."""
    sys.excepthook = _report_unexpected
    try:
        config = AdapterConfig.from_env(os.environ)
    except ConfigError as exc:
        sys.stderr.write(f"channel adapter: {exc}\n")
        sys.exit(EXIT_BAD_CONFIG)
    for name in (ENV_TOKEN, ENV_CHAT, ENV_ALLOWED):
        os.environ.pop(name, None)  # no grandchild or crash report inherits them
    redactor = _configure_logging(config)
    try:
        status = asyncio.run(_Adapter(config, redactor).run())
    except Exception as exc:  # noqa: BLE001 - the one place that reports by class only
        _log.error("unexpected %s", type(exc).__name__)  # no traceback: privacy
        status = EXIT_TRANSPORT
    sys.exit(status)


if __name__ == "__main__":
    main()
