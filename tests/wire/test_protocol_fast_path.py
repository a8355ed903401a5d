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
