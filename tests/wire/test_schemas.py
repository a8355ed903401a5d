"""Checks the protocol JSON Schemas and the protocol module against the design.

Implements tests for workflow-server.md § Live client protocol, § Runner lifecycle,
§ Runner protocol and § Supervised channel adapters, and client-protocol.md § Envelope:
schemas are valid draft 2020-12, sets are closed, unknown envelope fields are rejected.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from pi_workflows.errors import PiWorkflowsError
from pi_workflows.wire import protocol
from pi_workflows.wire.canonical import dumps, loads
from pi_workflows.wire.protocol import ProtocolViolation

SCHEMA_DIR = Path(protocol.__file__).resolve().parent / "schemas"
CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "wire"
VALID = sorted((CORPUS / "valid").glob("*.json"))

# The design's lists, copied from workflow-server.md and client-protocol.md.
DESIGN_OUTCOMES = [
    "accepted",
    "adopted",
    "rejected",
    "conflict",
    "notFound",
    "claimLost",
    "unavailable",
]
DESIGN_RUNNER_KINDS = [
    "runner.ready",
    "node.started",
    "node.update",
    "node.finished",
    "node.failed",
    "run.parked",
    "run.finished",
    "interaction.requested",
    "interaction.accepted",
    "interaction.rejected",
    "notification.requested",
    "presentation.requested",
    "effect.reserve",
    "effect.settle",
    "runner.progress",
    "runner.exiting",
]
# Runner kinds this implementation adds to the design's list: the design says the runner
# reads a referenced result in bounded parts, but names no message kind for the read.
ADDED_RUNNER_KINDS = ["content.read", "content.write"]
DESIGN_RUNNER_COMMANDS = ["start", "resume", "continue", "restart"]
DESIGN_CHANNEL_KINDS = [
    "channel.ready",
    "channel.present",
    "channel.answer",
    "channel.settle",
    "channel.exiting",
]
DESIGN_DISPLAY_STATUSES = [
    "queued",
    "running",
    "waiting",
    "paused",
    "completed",
    "failed",
    "timed_out",
    "cancelled",
    "ambiguous",
]
DESIGN_EVENT_KINDS = [
    "runList",
    "runSnapshot",
    "runPatch",
    "runPage",
    "sessionSnapshot",
    "unavailable",
    "maintenanceProgress",
]

SCHEMA_OF_PREFIX = {
    "client-": "client.v1",
    "runner-": "runner.v1",
    "channel-": "channel.v1",
    "launch-": "worker-launch.v1",
    "run-list-page-": "run-list-page.v1",
}


def schema_name(path: Path) -> str:
    return next(name for prefix, name in SCHEMA_OF_PREFIX.items() if path.name.startswith(prefix))


def fixture(name: str) -> dict[str, Any]:
    value: dict[str, Any] = loads((CORPUS / "valid" / f"{name}.json").read_bytes())
    return value


def messages_of(prefix: str) -> list[dict[str, Any]]:
    return [loads(p.read_bytes()) for p in VALID if p.name.startswith(prefix)]


def rejects(name: str, message: object) -> ProtocolViolation:
    with pytest.raises(ProtocolViolation) as caught:
        protocol.validate(name, message)
    return caught.value


# ---------------------------------------------------------------------------
# The schema files


def test_schema_files_are_exactly_the_declared_names() -> None:
    files = sorted(path.name for path in SCHEMA_DIR.glob("*.json"))
    assert files == sorted(f"{name}.schema.json" for name in protocol.SCHEMA_NAMES)


@pytest.mark.parametrize("name", protocol.SCHEMA_NAMES)
def test_schema_is_valid_draft_2020_12(name: str) -> None:
    document = json.loads((SCHEMA_DIR / f"{name}.schema.json").read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(document)
    assert document["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert document["$id"] == f"urn:pi-workflows:schema:{name}"
    assert document == protocol.load_schema(name)


def test_load_schema_returns_a_copy_and_accepts_protocol_ids() -> None:
    first = protocol.load_schema("pi-workflows.client.v1")
    first["title"] = "changed"
    assert protocol.load_schema("client.v1")["title"] == "pi-workflows.client.v1"
    with pytest.raises(KeyError):
        protocol.load_schema("client.v2")
    with pytest.raises(KeyError):
        protocol.validate("nope.v1", {})


# ---------------------------------------------------------------------------
# Closed sets


def test_outcomes_are_the_design_set() -> None:
    assert list(protocol.OUTCOMES) == DESIGN_OUTCOMES
    client = protocol.load_schema("client.v1")
    runner = protocol.load_schema("runner.v1")
    assert client["$defs"]["outcome"]["enum"] == DESIGN_OUTCOMES
    assert runner["$defs"]["outcome"]["enum"] == DESIGN_OUTCOMES


@pytest.mark.parametrize("outcome", DESIGN_OUTCOMES)
def test_every_outcome_is_accepted(outcome: str) -> None:
    protocol.validate("client.v1", {**fixture("client-response-minimal"), "outcome": outcome})
    protocol.validate("runner.v1", {**fixture("runner-reply-adopted"), "outcome": outcome})


@pytest.mark.parametrize(
    "outcome",
    ["ok", "success", "Accepted", "not_found", "timedOut", "cancelled", "ambiguous", "", None, 1],
)
def test_no_other_outcome_is_accepted(outcome: object) -> None:
    rejects("client.v1", {**fixture("client-response-minimal"), "outcome": outcome})
    rejects("runner.v1", {**fixture("runner-reply-adopted"), "outcome": outcome})


def test_event_kinds_are_the_design_set() -> None:
    client = protocol.load_schema("client.v1")
    assert client["$defs"]["event"]["properties"]["kind"]["enum"] == DESIGN_EVENT_KINDS
    assert list(protocol.EVENT_KINDS) == DESIGN_EVENT_KINDS
    assert {m["kind"] for m in messages_of("client-event-")} == set(DESIGN_EVENT_KINDS)


def test_every_client_message_type_has_valid_fixtures() -> None:
    assert {m["type"] for m in messages_of("client-")} == {"hello", "request", "response", "event"}
    assert {m["outcome"] for m in messages_of("client-response-")} == set(DESIGN_OUTCOMES)
    assert len({m["operation"] for m in messages_of("client-request-")}) >= 25


def test_every_runner_kind_from_the_design_is_in_the_schema() -> None:
    runner = protocol.load_schema("runner.v1")
    kinds = runner["properties"]["kind"]["enum"]
    assert kinds == [*DESIGN_RUNNER_KINDS, *ADDED_RUNNER_KINDS, "command", "reply"]
    assert list(protocol.RUNNER_MESSAGE_KINDS) == [*DESIGN_RUNNER_KINDS, *ADDED_RUNNER_KINDS]
    assert list(protocol.RUNNER_COMMANDS) == DESIGN_RUNNER_COMMANDS
    assert runner["$defs"]["command"]["properties"]["command"]["enum"] == DESIGN_RUNNER_COMMANDS
    assert {m["kind"] for m in messages_of("runner-")} == set(kinds)
    assert {m["command"] for m in messages_of("runner-command-")} == set(DESIGN_RUNNER_COMMANDS)
    operations = {m["payload"]["operation"] for m in messages_of("runner-progress-")}
    assert operations == {"process.register", "process.unregister"}


def test_every_channel_kind_from_the_design_is_in_the_schema() -> None:
    channel = protocol.load_schema("channel.v1")
    assert channel["properties"]["kind"]["enum"] == DESIGN_CHANNEL_KINDS
    assert list(protocol.CHANNEL_MESSAGE_KINDS) == DESIGN_CHANNEL_KINDS
    assert {m["kind"] for m in messages_of("channel-")} == set(DESIGN_CHANNEL_KINDS)


def test_runner_messages_carry_the_launch_schema_and_identity() -> None:
    for message in messages_of("runner-"):
        assert message["schema"] == protocol.LAUNCH_SCHEMA
        for field in ("runId", "generation", "runnerEpoch"):
            broken = {k: v for k, v in message.items() if k != field}
            rejects("runner.v1", broken)
        if message["kind"] in DESIGN_RUNNER_KINDS:
            for field in ("expectedRevision", "messageId"):
                rejects("runner.v1", {k: v for k, v in message.items() if k != field})


@pytest.mark.parametrize(
    "kind", [k for k in DESIGN_RUNNER_KINDS if k.split(".")[0] in {"node", "effect", "interaction"}]
)
def test_attempt_id_is_required_where_the_design_applies_it(kind: str) -> None:
    messages = [m for m in messages_of("runner-") if m["kind"] == kind]
    assert messages
    for message in messages:
        assert "attemptId" in message
        error = rejects("runner.v1", {k: v for k, v in message.items() if k != "attemptId"})
        assert error.keyword == "required"


def test_channel_messages_carry_epoch_profile_sequence_and_revision() -> None:
    assert messages_of("channel-"), "the corpus has channel messages to check"
    for message in messages_of("channel-"):
        for field in ("adapterEpoch", "profile", "sequence"):
            rejects("channel.v1", {k: v for k, v in message.items() if k != field})
        if message["kind"] in {"channel.present", "channel.settle"}:
            for field in ("attemptId", "channelRevision"):
                rejects("channel.v1", {k: v for k, v in message.items() if k != field})


@pytest.mark.parametrize("name", ["run-view.v1", "run-list-page.v1", "session-view.v1"])
def test_display_status_is_the_closed_design_set(name: str) -> None:
    document = protocol.load_schema(name)
    assert document["$defs"]["display"]["properties"]["status"]["enum"] == DESIGN_DISPLAY_STATUSES
    assert list(protocol.DISPLAY_STATUSES) == DESIGN_DISPLAY_STATUSES

    def view(status: object) -> dict[str, Any]:
        display = {"status": status, "activity": None}
        base: dict[str, Any] = {"schema": f"pi-workflows.{name}", "revision": 3, "extra": True}
        if name == "run-view.v1":
            return {**base, **RUN_VIEW_FIELDS, "display": {**display, "controls": []}}
        if name == "run-list-page.v1":  # a closed document: no extra field
            item = {"runId": "run-1", "workflow": "w", "revision": 1, "createdAt": 1}
            item |= {"updatedAt": 1, "display": display}
            return {"schema": base["schema"], "revision": 3, "items": [item]}
        return {**base, "run": {"runId": "run-1", "display": display}}

    for status in DESIGN_DISPLAY_STATUSES:
        protocol.validate(name, view(status))
    for wrong in ["unavailable", "parked", "timedOut", "Running", None]:
        rejects(name, view(wrong))


@pytest.mark.parametrize(
    "name", ["run-view.v1", "run-list-page.v1", "session-view.v1", "run-page.v1"]
)
def test_view_documents_require_schema_and_revision(name: str) -> None:
    # run-list-page.v1 and run-page.v1 are closed (tests/server/test_run_list_pages.py,
    # test_view_pages.py); the others are open, and a run view has the fields every run
    # view has, a run page those of every page.
    more: dict[str, Any] = {"items": []} if name == "run-list-page.v1" else {"more": {}}
    fields: dict[str, Any] = RUN_VIEW_FIELDS if name == "run-view.v1" else {}
    if name == "run-page.v1":
        more = {}
        fields = {"runId": "run-1", "list": "trace", "cursor": None, "items": [], "count": 0}
    protocol.validate(name, {"schema": f"pi-workflows.{name}", "revision": 0, **more, **fields})
    rejects(name, {"schema": f"pi-workflows.{name}", **fields})
    rejects(name, {"schema": "pi-workflows.other.v1", "revision": 0, **fields})
    rejects(name, {"schema": f"pi-workflows.{name}", "revision": -1, **fields})


RUN_VIEW_FIELDS: dict[str, Any] = {
    "runId": "run-1",
    "workflow": "hello",
    "status": "queued",
    "display": {"status": "queued", "activity": None, "controls": ["pause", "cancel"]},
    "lineage": {"rootRunId": "run-1"},
    "trace": {"count": 0, "omitted": 0, "items": []},
}
"""The fields every run view has (tests/server/test_run_view*.py check the rest)."""


# ---------------------------------------------------------------------------
# Unknown fields


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_unknown_envelope_field_is_rejected(path: Path) -> None:
    message = loads(path.read_bytes())
    error = rejects(schema_name(path), {**message, "zzUnknown": "private value"})
    assert error.keyword in {"additionalProperties", "unevaluatedProperties"}
    assert "zzUnknown" not in str(error)
    assert "private value" not in str(error)


def test_unknown_field_in_closed_runner_payload_is_rejected() -> None:
    checked = 0
    for message in messages_of("runner-"):
        if message["kind"] in DESIGN_RUNNER_KINDS:
            payload = {**message["payload"], "zzUnknown": 1}
            rejects("runner.v1", {**message, "payload": payload})
            checked += 1
    assert checked, "the corpus has runner messages with closed payloads"


def test_open_request_payload_accepts_any_fields() -> None:
    message = fixture("client-request-server-status")
    protocol.validate("client.v1", {**message, "payload": {"anything": [1, {"x": None}]}})


# ---------------------------------------------------------------------------
# The protocol module


def test_protocol_violation_is_in_the_error_tree() -> None:
    assert issubclass(ProtocolViolation, PiWorkflowsError)
    assert issubclass(ProtocolViolation, ValueError)


def test_violation_names_location_and_keyword_but_no_content() -> None:
    message = {**fixture("client-request-run-cancel-with-expected-revision"), "runId": 7}
    error = rejects("client.v1", message)
    assert error.keyword == "type"
    assert error.location == "/runId"
    assert error.schema_name == "client.v1"
    assert "/runId" in str(error)
    secret = {**fixture("client-hello"), "connectionId": "s3cr3t\u0000"}
    assert "s3cr3t" not in str(rejects("client.v1", secret))


def test_patterns_use_ecmascript_end_anchors() -> None:
    # Python's `$` alone would accept a trailing newline; JavaScript's does not.
    for field, value in [("operation", "server.status\n"), ("idempotencyKey", "key\n")]:
        rejects("client.v1", {**fixture("client-request-server-status"), field: value})
    rejects("client.v1", {**fixture("client-hello"), "packageVersion": "1.0.0\n"})
    rejects(
        "worker-launch.v1",
        {**fixture("launch-file-source"), "inputHash": "sha256:" + "a" * 64 + "\n"},
    )


def test_encode_validates_first_and_adds_no_newline() -> None:
    hello = fixture("client-hello")
    data = protocol.encode_client_message(hello)
    assert data == dumps(hello)
    assert not data.endswith(b"\n")
    with pytest.raises(ProtocolViolation):
        protocol.encode_client_message({**hello, "extra": 1})
    with pytest.raises(ProtocolViolation):
        protocol.encode_client_message({**hello, "type": "request"})


def test_decode_rejects_non_objects_as_violations() -> None:
    for value in (b"[]", b"1", b'"hello"', b"null", b"true"):
        with pytest.raises(ProtocolViolation):
            protocol.decode_client_message(value)


def test_decoded_client_message_narrows_by_type() -> None:
    message = protocol.decode_client_message(dumps(fixture("client-request-server-status")))
    assert message["type"] == "request"
    if message["type"] == "request":
        assert message["operation"] == "server.status"
    assert message["schema"] == protocol.CLIENT_SCHEMA


def test_runner_sender_restricts_direction() -> None:
    command = dumps(fixture("runner-command-start"))
    ready = dumps(fixture("runner-ready"))
    assert protocol.decode_runner_message(command, sender="server")["kind"] == "command"
    assert protocol.decode_runner_message(ready, sender="runner")["kind"] == "runner.ready"
    with pytest.raises(ProtocolViolation):
        protocol.decode_runner_message(command, sender="runner")
    with pytest.raises(ProtocolViolation):
        protocol.decode_runner_message(ready, sender="server")
    with pytest.raises(ProtocolViolation):
        protocol.encode_runner_message(fixture("runner-reply-adopted"), sender="runner")


def test_channel_sender_restricts_direction() -> None:
    present = dumps(fixture("channel-present-command"))
    applied = dumps(fixture("channel-present-applied"))
    answer = dumps(fixture("channel-answer-button"))
    assert protocol.decode_channel_message(present, sender="server")["kind"] == "channel.present"
    assert protocol.decode_channel_message(applied, sender="adapter")["kind"] == "channel.present"
    assert protocol.decode_channel_message(answer, sender="adapter")["kind"] == "channel.answer"
    with pytest.raises(ProtocolViolation):
        protocol.decode_channel_message(present, sender="adapter")
    with pytest.raises(ProtocolViolation):
        protocol.decode_channel_message(applied, sender="server")
    with pytest.raises(ProtocolViolation):
        protocol.encode_channel_message(fixture("channel-answer-button"), sender="server")
    with pytest.raises(ProtocolViolation):
        protocol.encode_channel_message(fixture("channel-settle-command"), sender="adapter")


def test_launch_envelope_round_trips() -> None:
    envelope = fixture("launch-with-mounted-sources")
    data = protocol.encode_launch_envelope(envelope)
    assert protocol.decode_launch_envelope(data) == envelope
    assert protocol.launch_envelope_from_wire(envelope) == envelope
