"""The fake provider on its own: the Chat Completions stream it writes, its script queue,
the requests it records, and its stalls (pi reads it in test_pi_child.py)."""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from pi_workflows.testing import (
    FakeProvider,
    ProviderError,
    Stall,
    ToolCall,
    Turn,
    text_turn,
)


@pytest.fixture(scope="module")
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as fake:
        yield fake


def post(provider: FakeProvider, body: dict[str, Any]) -> tuple[int, str, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", provider.port, timeout=30)
    try:
        connection.request(
            "POST",
            "/v1/chat/completions",
            json.dumps(body),
            {"Content-Type": "application/json", "Authorization": "Bearer fake-key"},
        )
        response = connection.getresponse()
        return response.status, response.getheader("Content-Type") or "", response.read()
    finally:
        connection.close()


def sse_data(raw: bytes) -> list[Any]:
    frames = [f for f in raw.decode().split("\n\n") if f]
    assert all(f.startswith("data: ") for f in frames)
    return [f.removeprefix("data: ") for f in frames]


def test_a_turn_streams_chat_completion_chunks_then_done(provider: FakeProvider) -> None:
    call = ToolCall("workflow", {"a": [1, 2]}, "call_1")
    provider.script(Turn(text="hello", tool_calls=(call,), chunk_size=3))
    status, kind, raw = post(provider, {"model": "fake-model", "stream": True, "messages": []})

    assert status == 200 and kind == "text/event-stream"
    *chunks, done = sse_data(raw)
    assert done == "[DONE]"
    decoded = [json.loads(c) for c in chunks]
    assert all(c["object"] == "chat.completion.chunk" for c in decoded)
    deltas = [c["choices"][0]["delta"] for c in decoded if c["choices"]]
    assert deltas[0]["role"] == "assistant"
    assert "".join(d.get("content", "") for d in deltas) == "hello"
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["id"] == "call_1" and calls[0]["function"]["name"] == "workflow"
    arguments = "".join(c["function"]["arguments"] for c in calls)
    assert json.loads(arguments) == {"a": [1, 2]} and len(calls) > 1
    finishes = [c["choices"][0]["finish_reason"] for c in decoded if c["choices"]]
    assert finishes[-1] == "tool_calls" and decoded[-1]["usage"]["total_tokens"] == 15


def test_requests_are_recorded_and_turns_taken_in_order(provider: FakeProvider) -> None:
    provider.script(text_turn("one"), ProviderError(503, "overloaded"))
    post(provider, {"messages": [{"role": "user", "content": "first"}]})
    status, _, raw = post(provider, {"messages": [{"role": "user", "content": "second"}]})

    assert status == 503 and json.loads(raw)["error"]["message"] == "overloaded"
    first, second = provider.chat_requests()
    assert first.messages()[0]["content"] == "first" and first.turn == text_turn("one")
    assert second.headers["Authorization"] == "Bearer fake-key"
    assert provider.remaining() == 0


def test_a_request_beyond_the_script_gets_an_error_naming_the_problem(
    provider: FakeProvider,
) -> None:
    provider.script()
    status, _, raw = post(provider, {"messages": []})
    assert status == 500 and "scripted no turn" in json.loads(raw)["error"]["message"]


def test_a_stall_holds_the_stream_until_the_client_leaves(provider: FakeProvider) -> None:
    provider.script(Stall("partial"), text_turn("after"))
    client = socket.create_connection(("127.0.0.1", provider.port), timeout=30)
    body = b'{"messages": []}'
    client.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    received = b""
    while b"partial" not in received:
        received += client.recv(4096)
    provider.wait_for_requests(1, 30)
    client.close()  # the stalled handler ends; the provider goes on serving
    status, _, raw = post(provider, {"messages": []})
    assert status == 200 and "after" in raw.decode()


def test_stop_ends_a_stalled_stream() -> None:
    fake = FakeProvider().start()
    fake.script(Stall())
    outcome: list[str] = []

    def request() -> None:
        try:
            post(fake, {"messages": []})
        except http.client.IncompleteRead:
            outcome.append("cut")  # the stream ends mid-body, as a provider that went away
        else:
            outcome.append("complete")

    caller = threading.Thread(target=request)
    caller.start()
    fake.wait_for_requests(1, 30)
    fake.stop()
    caller.join(30)
    assert not caller.is_alive() and outcome == ["cut"]


def test_the_agent_dir_points_pi_at_the_fake_with_retries_off(
    provider: FakeProvider, tmp_path: Any
) -> None:
    agent = provider.write_agent_dir(tmp_path / "agent")
    models = json.loads((agent / "models.json").read_text())
    fake = models["providers"]["fake"]
    assert fake["baseUrl"] == provider.base_url and fake["api"] == "openai-completions"
    assert fake["baseUrl"].startswith("http://127.0.0.1:")
    settings = json.loads((agent / "settings.json").read_text())
    assert settings["retry"] == {"enabled": False, "provider": {"maxRetries": 0}}


def test_the_provider_listens_on_loopback_only() -> None:
    with pytest.raises(ValueError, match="loopback"):
        FakeProvider(host="0.0.0.0")
