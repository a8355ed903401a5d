"""The per-branch validators agree with the whole schema on every fixture.

`protocol.validate` first tries the `then` branch picked by the discriminator, with
local references inlined; the whole-document validator still decides every rejection.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pi_workflows.wire import protocol
from pi_workflows.wire.canonical import CanonicalJSONError, loads

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "wire"
SCHEMAS = {"client-": "client.v1", "runner-": "runner.v1", "channel-": "channel.v1"}


def _cases(folder: str) -> list[tuple[str, Any]]:
    cases = []
    for path in sorted((CORPUS / folder).glob("*.json")):
        schema = next((s for p, s in SCHEMAS.items() if path.name.startswith(p)), None)
        if schema is None:
            continue
        try:
            cases.append((schema, loads(path.read_bytes())))
        except CanonicalJSONError:
            continue  # not JSON or not canonical: never reaches a validator
    return cases


@pytest.mark.parametrize(("schema", "message"), _cases("valid"))
def test_valid_fixtures_pass_the_branch_validator(schema: str, message: Any) -> None:
    assert protocol._valid_by_branch(schema, message)


@pytest.mark.parametrize(("schema", "message"), _cases("invalid"))
def test_the_branch_validator_never_accepts_what_the_schema_rejects(
    schema: str, message: Any
) -> None:
    whole = protocol._validator(schema).is_valid(message)
    assert protocol._valid_by_branch(schema, message) <= whole


REQUEST = {
    "schema": "pi-workflows.client.v1",
    "type": "request",
    "requestId": "r-1",
    "clientId": "c-1",
    "operation": "server.status",
    "idempotencyKey": "k-1",
    "payload": {},
}


@pytest.mark.parametrize(
    "change",
    [
        {"expectedRevision": True},  # a boolean is not an integer
        {"expectedRevision": -1},
        {"requestId": "r\n"},  # `$` before a trailing newline
        {"requestId": ""},
        {"operation": "Server.status"},
        {"extra": 1},
        {"payload": []},
        {"schema": "pi-workflows.client.v2"},
    ],
)
def test_the_compiled_branch_agrees_with_the_whole_schema_on_edge_values(
    change: dict[str, Any],
) -> None:
    message = {**REQUEST, **change}
    whole = protocol._validator("client.v1").is_valid(message)
    assert protocol._valid_by_branch("client.v1", message) <= whole


def test_client_branches_are_compiled_and_unsupported_keywords_keep_jsonschema() -> None:
    _, client = protocol._branch_schemas("client.v1")
    assert all(
        isinstance(protocol._branch_validator("client.v1", value), protocol._FastBranch)
        for value in client
    )
    # runner messages use unevaluatedProperties, which fastjsonschema does not know
    runner = protocol._branch_validator("runner.v1", "node.started")
    assert not isinstance(runner, protocol._FastBranch)
    assert protocol._valid_by_branch("client.v1", REQUEST)
