"""One operation vocabulary: the client schema's enumeration, the router and the corpus agree.

Issue 13, item 1. The schema enumerates every operation; the router dispatches only
enumerated names; every request in the fixture corpus names an enumerated operation (and
every enumerated operation has a valid fixture). Over a real socket, a well-formed
request for an unknown operation is answered `rejected` with its name and the connection
stays open; an enumerated operation the server does not implement yet is `rejected`
`notImplemented`; a name outside the grammar still closes the connection.
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import Any, cast

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.server._router import Router, RouterPorts
from pi_workflows.wire.framing import SocketFrameReader, encode_frame
from pi_workflows.wire.protocol import (
    ProtocolViolation,
    client_message_from_wire,
    client_operations,
    load_schema,
    unknown_operation,
    validate,
)

pytestmark = pytest.mark.timeout(60)

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "wire"
GRAMMAR = load_schema("client.v1")["$defs"]["operationName"]


def _router_operations() -> frozenset[str]:
    # The dispatch table is built from the operation modules alone; no port is touched.
    return Router(cast(RouterPorts, None)).operations


def _corpus_requests(folder: str) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for path in sorted((CORPUS / folder).glob("client-*.json")):
        try:
            message = json.loads(path.read_bytes())
        except ValueError:
            continue
        if isinstance(message, dict) and message.get("type") == "request":
            found[path.name] = message
    return found


def test_every_routed_operation_is_enumerated() -> None:
    routed = _router_operations()
    assert routed, "the router routes nothing"
    assert routed <= client_operations(), sorted(routed - client_operations())


def test_every_corpus_request_names_an_enumerated_operation_and_every_one_has_a_fixture() -> None:
    valid = _corpus_requests("valid")
    named = {message["operation"] for message in valid.values()}
    assert named <= client_operations(), sorted(named - client_operations())
    assert client_operations() <= named, sorted(client_operations() - named)
    for old in ("runList.subscribe", "run.subscribe", "sessionView.subscribe"):
        assert old not in client_operations()


def test_every_enumerated_name_matches_the_operation_grammar() -> None:
    for operation in client_operations():
        validate("client.v1", _request(operation, {}))
        assert len(operation) <= GRAMMAR["maxLength"]
        assert re.search(GRAMMAR["pattern"], operation) and "\n" not in operation, operation


def test_the_unenumerated_fixtures_fail_only_their_operation() -> None:
    invalid = _corpus_requests("invalid")
    for name in (
        "client-request-operation-not-enumerated.json",
        "client-request-operation-old-subscribe-name.json",
    ):
        message = invalid[name]
        with pytest.raises(ProtocolViolation):
            client_message_from_wire(message)
        assert unknown_operation(message) == message["operation"]
    for name in (
        "client-request-operation-with-slash.json",
        "client-request-operation-trailing-newline.json",
        "client-request-operation-snake-case.json",
        "client-request-unknown-envelope-field.json",
    ):
        assert unknown_operation(invalid[name]) is None, name
    # A grammatical name on an otherwise broken envelope is still a violation.
    broken = {**_request("run.explode", {}), "runId": ""}
    assert unknown_operation(broken) is None


def _request(operation: str, payload: dict[str, Any], key: str = "k") -> dict[str, Any]:
    request: dict[str, Any] = {
        "schema": "pi-workflows.client.v1",
        "type": "request",
        "requestId": f"r-{key}",
        "clientId": "vocabulary",
        "operation": operation,
        "idempotencyKey": key,
        "payload": payload,
    }
    if operation in ("run.recover", "channel.recover"):
        request["runId"] = "run-1"
        request["payload"] = {"action": "confirm"}
    if operation == "decision.answer":
        request["runId"] = "run-1"
        request["payload"] = {"answer": {"choice": "approve"}}
    if operation == "sessionEvents.record":
        request["runId"] = "run-1"
        request["payload"] = {
            "sessionId": "session-1",
            "turnId": "turn-1",
            "messageId": "message-1",
            "events": [],
        }
    return request


class _Raw:
    """A bare socket client: sends any frame, reads responses by request ID."""

    def __init__(self, server: WorkflowServer) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(20)
        self.sock.connect(str(server.socket_path))
        self.reader = SocketFrameReader(self.sock)
        hello = self.reader.read_message()
        assert hello is not None and hello["type"] == "hello"

    def ask(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """The response to `message`, or None when the server closed the connection."""
        self.sock.sendall(encode_frame(message))
        while True:
            answer = self.reader.read_message()
            if answer is None:
                return None
            if answer["type"] == "response" and answer["requestId"] == message["requestId"]:
                return answer

    def close(self) -> None:
        self.sock.close()


def test_an_unknown_operation_is_rejected_with_its_name_and_the_connection_stays(
    server: WorkflowServer,
) -> None:
    raw = _Raw(server)
    try:
        answer = raw.ask(_request("run.explode", {"x": 1}, "unknown"))
        assert answer is not None
        assert answer["outcome"] == "rejected"
        assert answer["error"]["code"] == "unknownOperation"
        assert answer["error"]["message"] == "unknown operation run.explode"
        status = raw.ask(_request("server.status", {}, "after"))
        assert status is not None and status["outcome"] == "accepted"
        # A name outside the grammar is a protocol violation: only this connection closes.
        assert raw.ask(_request("run/cancel", {}, "slash")) is None
    finally:
        raw.close()
    with WorkflowClient(server.state_dir, autostart=False, timeout=10) as client:
        assert client.call("server.status")["outcome"] == "accepted"


def test_each_enumerated_operation_without_a_route_answers_not_implemented(
    server: WorkflowServer,
) -> None:
    missing = sorted(client_operations() - _router_operations())
    assert "settings.set" in missing  # the design names it; a later issue builds it
    raw = _Raw(server)
    try:
        for index, operation in enumerate(missing):
            answer = raw.ask(_request(operation, {}, f"missing-{index}"))
            assert answer is not None, operation
            assert answer["outcome"] == "rejected", operation
            assert answer["error"]["code"] == "notImplemented", operation
            assert operation in answer["error"]["message"]
            assert "not implemented yet" in answer["error"]["message"]
    finally:
        raw.close()


def test_view_subscribe_answers_every_kind_of_the_vocabulary(client: WorkflowClient) -> None:
    missing = client.request("view.subscribe", {"kind": "run"}, run_id="run-1")
    assert missing["outcome"] == "notFound" and missing["error"]["code"] == "runNotFound"
    session = client.request("view.subscribe", {"kind": "sessionView", "sessionId": "s-1"})
    assert session["outcome"] == "accepted" and session["receipt"]["kind"] == "sessionView"
    other = client.request("view.subscribe", {"kind": "everything"})
    assert other["outcome"] == "rejected" and other["error"]["code"] == "unknownView"
    assert client.call("view.subscribe", {"kind": "runList"})["outcome"] == "accepted"
