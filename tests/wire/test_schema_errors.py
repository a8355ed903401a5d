"""`schema_errors`: a JSON Schema refusal as a place and a rule, never the instance.

jsonschema's own message quotes the value (and an unexpected key); the `Violation`
must name the JSON Pointer and the broken rule from the schema alone.
"""

from __future__ import annotations

from typing import Any

import pytest
from jsonschema import Draft202012Validator

from pi_workflows.wire.schema_errors import Violation, first_violation

MARKER = "MARKER-7f3a"

CASES: list[tuple[Any, Any, str, str]] = [
    ({"properties": {"n": {"type": "integer"}}}, {"n": MARKER}, "/n", "must be integer"),
    ({"type": ["string", "null"]}, [MARKER], "", "must be one of the types string, null"),
    ({"required": ["a", "b"]}, {"b": MARKER}, "/a", "is required"),
    ({"enum": ["x", "y", "z"]}, MARKER, "", 'must be one of 3 values: "x", "y", "z"'),
    ({"enum": ["x" * 80, "y" * 80]}, MARKER, "", "must be one of 2 values"),
    ({"const": 3}, MARKER, "", "must equal 3"),
    ({"minimum": 5}, 4, "", "must be at least 5"),
    ({"exclusiveMaximum": 5}, 5, "", "must be less than 5"),
    ({"multipleOf": 3}, 4, "", "must be a multiple of 3"),
    ({"maxLength": 3}, MARKER, "", "must be at most 3 characters long"),
    ({"pattern": "^[a-z]+$"}, MARKER, "", 'must match the pattern "^[a-z]+$"'),
    ({"minItems": 2}, [MARKER], "", "must have at least 2 items"),
    ({"uniqueItems": True}, [MARKER, MARKER], "", "must not repeat an item"),
    ({"maxProperties": 1}, {"a": MARKER, "b": 1}, "", "must have at most 1 property"),
    (
        {"properties": {"a": {}}, "additionalProperties": False},
        {"a": 1, MARKER: 2, "other": 3},
        "",
        "has 2 properties the schema does not allow (allowed: a)",
    ),
    ({"additionalProperties": {"type": "integer"}}, {MARKER: "x"}, "/*", "must be integer"),
    ({"unevaluatedProperties": False}, {MARKER: 1}, "", "has properties the schema does not allow"),
    ({"propertyNames": {"maxLength": 3}}, {MARKER: 1}, "", "has a property name that must be"),
    ({"dependentRequired": {"a": ["b"]}}, {"a": MARKER}, "/b", 'is required when "a" is present'),
    ({"anyOf": [{"type": "string"}, {"type": "integer"}]}, [MARKER], "", "must match at least one"),
    ({"not": {"type": "string"}}, MARKER, "", "must not match the schema"),
    ({"prefixItems": [{}], "items": False}, [1, MARKER], "", "has more items than the schema"),
    (False, MARKER, "", "is not allowed here"),
    (
        {"properties": {"a/b~c": {"items": {"type": "string"}}}},
        {"a/b~c": ["ok", {"k": MARKER}]},
        "/a~1b~0c/1",
        "must be string",
    ),
    (
        {"properties": {"a": {"$ref": "#/$defs/x"}}, "$defs": {"x": {"required": ["deep"]}}},
        {"a": {MARKER: 1}},
        "/a/deep",
        "is required",
    ),
]


@pytest.mark.parametrize(("schema", "instance", "pointer", "rule"), CASES)
def test_a_violation_names_the_place_and_the_rule_and_never_the_instance(
    schema: Any, instance: Any, pointer: str, rule: str
) -> None:
    violation = first_violation(Draft202012Validator(schema).iter_errors(instance))
    assert violation is not None
    assert violation.pointer == pointer
    assert violation.rule.startswith(rule), violation.rule
    assert "MARKER" not in violation.describe("the whole value")


def test_a_valid_instance_has_no_violation() -> None:
    assert first_violation(Draft202012Validator({"type": "integer"}).iter_errors(1)) is None


def test_describe_names_the_root_in_words() -> None:
    assert Violation("", "must be object", "type").describe("the whole answer") == (
        "at / (the whole answer): must be object"
    )
    assert Violation("/n", "must be integer", "type").describe("x") == "at /n: must be integer"
