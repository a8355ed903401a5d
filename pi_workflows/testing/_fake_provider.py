"""A scripted fake model provider on 127.0.0.1 for driving the real `pi` binary.

It speaks the OpenAI Chat Completions streaming wire format (pi's `openai-completions`
API, the default pi-rpc.md recommends): `POST /v1/chat/completions` answered with
server-sent events, one `chat.completion.chunk` per `data:` frame, then `data: [DONE]`.
Each request takes the next scripted turn from a queue, so a test says exactly what the
model does: text, tool calls (the bridge's `workflow` submit/update, pi's `bash`), a
provider error, or a stream that stalls until the client goes away. Every request is
recorded. An empty queue answers with a provider error naming the problem, so a test
whose script runs short fails visibly instead of hanging or desynchronising.

It lives in the package, not under `tests/`, because `make demo` and the benchmarks
run an agent step against it too, and an installed package cannot import `tests`.
It never logs: requests hold prompts and the fake API key.
"""

from __future__ import annotations

import itertools
import json
import os
import select
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, TypeAlias

from pi_workflows.testing._loopback_http import LoopbackServer, QuietHandler

__all__ = [
    "FAKE_API_KEY",
    "FAKE_MODEL",
    "FAKE_PROVIDER",
    "FakeProvider",
    "ProviderError",
    "RecordedRequest",
    "ScriptedReply",
    "ScriptedTurn",
    "Stall",
    "ToolCall",
    "Turn",
    "bash_turn",
    "text_turn",
    "workflow_submit_turn",
    "workflow_update_turn",
]

FAKE_PROVIDER = "fake"
"""The provider name the fake registers in `models.json` (`--provider fake`)."""

FAKE_MODEL = "fake-model"
"""The one model id the fake serves (`--model fake-model`)."""

FAKE_API_KEY = "fake-key"
"""The literal API key in `models.json`; pi sends it as `Authorization: Bearer fake-key`.
pi resolves `apiKey` as an environment variable name first, so it must not name one."""

CHAT_COMPLETIONS_PATH = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call the model makes."""

    name: str
    arguments: Mapping[str, Any] | str
    """A JSON object (sent encoded) or raw argument text (sent as is, e.g. broken JSON)."""
    call_id: str | None = None
    """The provider's tool-call id; a fresh `call_fake_N` when None."""


@dataclass(frozen=True, slots=True)
class Turn:
    """One scripted assistant message: optional thinking, text, then tool calls."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    thinking: str = ""
    chunk_size: int | None = None
    """Stream text and tool arguments in pieces of this many characters (one piece if None)."""


@dataclass(frozen=True, slots=True)
class ProviderError:
    """An HTTP error instead of a stream; pi ends the turn with `stopReason: "error"`.

    Use a status the OpenAI SDK does not retry by itself (400) or turn retries off in
    `settings.json` (`write_agent_dir` does) so one scripted error is one request.
    """

    status: int = 500
    message: str = "scripted provider error"


@dataclass(frozen=True, slots=True)
class Stall:
    """Start the stream, send `text` if any, then hold it open until the client leaves.

    For abort, cancel and kill tests: the model is "streaming" for as long as the test
    needs. The stream ends when pi closes the connection or the provider stops.
    """

    text: str = ""


ScriptedTurn: TypeAlias = Turn | ProviderError | Stall
ScriptedReply: TypeAlias = ScriptedTurn | Callable[[Mapping[str, Any]], ScriptedTurn]
"""A turn, or a function of the request body that returns one: for a turn that must
name what only the prompt says (a step's generated attempt ID)."""


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request the fake received (in memory only; it may hold prompts and the key)."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: Mapping[str, Any]
    turn: ScriptedTurn | None
    """The scripted turn it was answered with (None: not a chat completion)."""

    def messages(self) -> list[dict[str, Any]]:
        """The chat messages pi sent (system, user, assistant, tool)."""
        return list(self.body.get("messages") or [])

    def tool_names(self) -> list[str]:
        """The names of the tools pi offered the model."""
        return [tool["function"]["name"] for tool in self.body.get("tools") or []]


def text_turn(text: str, *, chunk_size: int | None = None) -> Turn:
    """A turn that only answers with text (and so ends pi's run without a tool call)."""
    return Turn(text=text, chunk_size=chunk_size)


def bash_turn(command: str, *, call_id: str | None = None) -> Turn:
    """A turn that runs `command` through pi's built-in bash tool."""
    return Turn(tool_calls=(ToolCall("bash", {"command": command}, call_id),))


def workflow_submit_turn(
    step: str, attempt: str, output: Any, *, call_id: str | None = None, text: str = ""
) -> Turn:
    """A turn that calls the bridge's `workflow` tool with `action: "submit"`."""
    arguments = {"action": "submit", "step": step, "attempt": attempt, "output": output}
    return Turn(text=text, tool_calls=(ToolCall("workflow", arguments, call_id),))


def workflow_update_turn(
    step: str, attempt: str, update: Mapping[str, Any], *, call_id: str | None = None
) -> Turn:
    """A turn that calls the bridge's `workflow` tool with `action: "update"`."""
    arguments = {"action": "update", "step": step, "attempt": attempt, "update": dict(update)}
    return Turn(tool_calls=(ToolCall("workflow", arguments, call_id),))


class FakeProvider(LoopbackServer):
    """A real HTTP server on 127.0.0.1 (ephemeral port) with a queue of scripted turns.

    Use it as a context manager, or call `start` and `stop`. One provider serves many
    pi children one after another; `script` replaces the queue and forgets old requests.
    """

    def __init__(self, *, host: str = "127.0.0.1") -> None:
        super().__init__(
            _handler_class(self), host=host, name="fake-provider", what="the fake provider"
        )
        self._queue: deque[ScriptedReply] = deque()
        self._requests: list[RecordedRequest] = []
        self._ids = itertools.count(1)
        # Stalled streams block in select() on this pipe; stop() makes it readable.
        self._wake_r, self._wake_w = os.pipe()

    # -- lifecycle (start, stop and the context manager: LoopbackServer) -------------

    def _wake_handlers(self) -> None:
        os.write(self._wake_w, b"x")  # ends stalled streams

    def _closed(self) -> None:
        os.close(self._wake_w)
        os.close(self._wake_r)

    # -- configuration ---------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:PORT/v1`, the `baseUrl` pi's openai-completions API wants."""
        return f"http://127.0.0.1:{self.port}/v1"

    def models_json(self) -> dict[str, Any]:
        """The `models.json` content that points pi's `fake` provider at this server."""
        return {
            "providers": {
                FAKE_PROVIDER: {
                    "baseUrl": self.base_url,
                    "api": "openai-completions",
                    "apiKey": FAKE_API_KEY,
                    "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
                    "models": [{"id": FAKE_MODEL, "contextWindow": 128000, "maxTokens": 4096}],
                }
            }
        }

    def write_agent_dir(self, agent_dir: Path) -> Path:
        """Write `models.json` and a `settings.json` with every retry layer off.

        Without the settings the OpenAI SDK retries a 5xx by itself and pi retries
        again with back-off, so one scripted error would take several turns.
        """
        agent_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        (agent_dir / "models.json").write_text(json.dumps(self.models_json(), indent=2))
        settings = {"retry": {"enabled": False, "provider": {"maxRetries": 0}}}
        (agent_dir / "settings.json").write_text(json.dumps(settings, indent=2))
        return agent_dir

    # -- the script ------------------------------------------------------------------

    def script(self, *turns: ScriptedReply) -> None:
        """Replace the queue of turns and forget the requests recorded so far."""
        with self._lock:
            self._queue = deque(turns)
            self._requests = []

    def add(self, *turns: ScriptedReply) -> None:
        """Append turns to the queue (for a test that scripts as it goes)."""
        with self._lock:
            self._queue.extend(turns)
            self._lock.notify_all()

    def remaining(self) -> int:
        """How many scripted turns no request has taken yet."""
        with self._lock:
            return len(self._queue)

    @property
    def requests(self) -> list[RecordedRequest]:
        """A copy of the requests received since the last `script`."""
        with self._lock:
            return list(self._requests)

    def chat_requests(self) -> list[RecordedRequest]:
        """The chat-completion requests received since the last `script`."""
        return [r for r in self.requests if r.path == CHAT_COMPLETIONS_PATH]

    def wait_for_requests(self, count: int, timeout: float) -> list[RecordedRequest]:
        """Wait until `count` chat-completion requests have arrived; return them all.

        Raises:
            TimeoutError: fewer arrived within `timeout` seconds.
        """

        def arrived() -> list[RecordedRequest] | None:
            chats = [r for r in self._requests if r.path == CHAT_COMPLETIONS_PATH]
            return chats if len(chats) >= count else None

        chats = self._wait(arrived, timeout)
        if chats is None:
            raise TimeoutError(f"{len(self.chat_requests())} of {count} model requests arrived")
        return chats

    # -- used by the handler ---------------------------------------------------------

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)
            self._lock.notify_all()

    def _take_turn(self, body: Mapping[str, Any]) -> ScriptedTurn:
        with self._lock:
            reply = self._queue.popleft() if self._queue else None
        if callable(reply):
            return reply(body)
        if reply is not None:
            return reply
        return ProviderError(500, "fake provider: the test scripted no turn for this request")

    def _next_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids)}"

    def _wait_while_stalled(self, connection: Any) -> None:
        """Block until the client closes `connection` or the provider stops."""
        while True:
            readable, _, _ = select.select([connection, self._wake_r], [], [])
            if self._wake_r in readable:
                return
            try:
                if not connection.recv(1024):
                    return  # the client went away
            except OSError:
                return


def _pieces(text: str, size: int | None) -> list[str]:
    if not size or size <= 0 or len(text) <= size:
        return [text]
    return [text[i : i + size] for i in range(0, len(text), size)]


def _arguments_text(arguments: Mapping[str, Any] | str) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(dict(arguments))


def chat_completion_chunks(
    turn: Turn, *, completion_id: str, model: str, call_ids: Iterator[str]
) -> list[dict[str, Any]]:
    """The `chat.completion.chunk` objects of one streamed turn, in order.

    The first delta carries `role`; thinking goes in `reasoning_content`; each tool call
    opens with `index`, `id`, `type` and `function.name`, and later chunks carry only
    its `index` and an `arguments` fragment. A chunk with `finish_reason` ends the
    choice, and a choices-less chunk carries `usage` (as with `include_usage`).
    """
    base = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }
    deltas: list[dict[str, Any]] = []
    for piece in _pieces(turn.thinking, turn.chunk_size) if turn.thinking else []:
        deltas.append({"reasoning_content": piece})
    for piece in _pieces(turn.text, turn.chunk_size) if turn.text else []:
        deltas.append({"content": piece})
    for index, call in enumerate(turn.tool_calls):
        first, *rest = _pieces(_arguments_text(call.arguments), turn.chunk_size)
        opening = {
            "index": index,
            "id": call.call_id or next(call_ids),
            "type": "function",
            "function": {"name": call.name, "arguments": first},
        }
        deltas.append({"tool_calls": [opening]})
        for piece in rest:
            deltas.append({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    if not deltas:
        deltas.append({"content": ""})
    deltas[0] = {"role": "assistant", **deltas[0]}
    finish = "tool_calls" if turn.tool_calls else "stop"
    chunks = [
        {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        for delta in deltas
    ]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    chunks.append({**base, "choices": [], "usage": usage})
    return chunks


def _handler_class(provider: FakeProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(QuietHandler):
        def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
            provider._record(RecordedRequest("GET", self.path, dict(self.headers), {}, None))
            self._error(404, "not found", "invalid_request")

        def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
            raw = self.read_body()
            path = self.path.split("?", 1)[0]
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                body = {}
            if path != CHAT_COMPLETIONS_PATH:
                provider._record(RecordedRequest("POST", path, dict(self.headers), body, None))
                self._error(404, "no such route", "invalid_request")
                return
            turn = provider._take_turn(body)
            provider._record(RecordedRequest("POST", path, dict(self.headers), body, turn))
            if isinstance(turn, ProviderError):
                self._error(turn.status, turn.message, "api_error")
                return
            self._stream(turn, str(body.get("model") or FAKE_MODEL))

        def _stream(self, turn: Turn | Stall, model: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            completion_id = provider._next_id("chatcmpl-fake-")
            call_ids = (provider._next_id("call_fake_") for _ in itertools.count())
            try:
                if isinstance(turn, Stall):
                    opening = Turn(text=turn.text)
                    first = chat_completion_chunks(
                        opening, completion_id=completion_id, model=model, call_ids=call_ids
                    )[0]
                    self._event(json.dumps(first))
                    provider._wait_while_stalled(self.connection)
                    self.close_connection = True
                    return
                chunks = chat_completion_chunks(
                    turn, completion_id=completion_id, model=model, call_ids=call_ids
                )
                for chunk in chunks:
                    self._event(json.dumps(chunk))
                self._event("[DONE]")
                self._write_chunk(b"")  # the end of the chunked body
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def _error(self, status: int, message: str, kind: str) -> None:
            self.send_json(status, {"error": {"message": message, "type": kind}})

        def _event(self, data: str) -> None:
            self._write_chunk(f"data: {data}\n\n".encode())

        def _write_chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    return Handler
