"""Safe JSON Schema refusals: the failing place and the broken rule, never the value.

Implements workflow-server.md § Live client protocol ("bounded safe error") for
`inputInvalid` and `answerInvalid`. jsonschema's own messages quote the rejected
instance (`'sk-…' is not of type 'integer'`), and those messages would reach the
client, the stored receipt and the CLI's stderr. A `Violation` is built from the
error's path and keyword instead, and from the schema (which the workflow's author
wrote), never from the instance:

- the place is a JSON Pointer (RFC 6901). A property name appears only when the schema
  names it under `properties` (or `required`); any other key the client chose is
  shown as `*`, since a key can be as private as a value. Array indexes appear as is.
- the rule is a short phrase such as "must be integer", "is required" or "must be one
  of 3 values"; numbers, patterns and allowed names come from the schema.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jsonschema.exceptions import ValidationError, best_match

from pi_workflows.wire.canonical import CanonicalJSONError, dumps

__all__ = ["HIDDEN_KEY", "Violation", "first_violation", "violation_of"]

HIDDEN_KEY = "*"
"""Stands for a key in the pointer that the schema does not name."""

_MAX_SCHEMA_TEXT = 120
"""Longest piece of schema text (a pattern, the allowed values) quoted in a rule."""


@dataclass(frozen=True, slots=True)
class Violation:
    """One schema refusal, safe to show and to store."""

    pointer: str
    """JSON Pointer of the failing place; `""` is the whole value."""
    rule: str
    """What the place must satisfy, for example `must be integer` or `is required`."""
    keyword: str
    """The JSON Schema keyword that failed (`type`, `required`, `false` for a false schema)."""

    def describe(self, whole: str) -> str:
        """`at /count: must be integer`; `whole` names the root (`the whole input`)."""
        where = self.pointer or f"/ ({whole})"
        return f"at {where}: {self.rule}"


def first_violation(errors: Iterable[ValidationError]) -> Violation | None:
    """The most relevant refusal among `errors` (jsonschema's `best_match`), or None."""
    error = best_match(errors)
    return violation_of(error) if error is not None else None


def violation_of(error: ValidationError) -> Violation:
    """The safe form of one jsonschema error (reads its path, keyword and schema only)."""
    schema_path = list(error.absolute_schema_path)
    named = _named_properties(schema_path)
    parts = [_segment(part, named) for part in error.absolute_path]
    keyword = str(error.validator) if error.validator is not None else "false"
    value = error.validator_value
    extra, rule = _rule(keyword, value, error)
    if extra is not None:
        parts.append(_escape(extra))
    if "propertyNames" in schema_path:
        rule = f"has a property name that {rule}"
    return Violation("".join(f"/{part}" for part in parts), rule, keyword)


def _named_properties(schema_path: Sequence[Any]) -> set[str]:
    """Property names the schema itself wrote on this error's path (safe to show)."""
    return {
        str(schema_path[i + 1])
        for i, step in enumerate(schema_path[:-1])
        if step == "properties" and isinstance(schema_path[i + 1], str)
    }


def _segment(part: Any, named: set[str]) -> str:
    if isinstance(part, int):
        return str(part)
    return _escape(str(part)) if part in named else HIDDEN_KEY


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _rule(keyword: str, value: Any, error: ValidationError) -> tuple[str | None, str]:
    """(a schema-named key to append to the pointer, the rule phrase)."""
    instance = error.instance
    if keyword == "required" and isinstance(value, list) and isinstance(instance, Mapping):
        missing = [name for name in value if isinstance(name, str) and name not in instance]
        if missing:
            return missing[0], "is required"
    if (
        keyword == "dependentRequired"
        and isinstance(value, Mapping)
        and isinstance(instance, Mapping)
    ):
        for present, needed in value.items():
            if present in instance and isinstance(needed, list):
                for name in needed:
                    if isinstance(name, str) and name not in instance:
                        return name, f"is required when {_text(present)} is present"
    if keyword in ("additionalProperties", "unevaluatedProperties"):
        return None, _extra_properties(error)
    phrase = _PHRASES.get(keyword)
    if phrase is not None:
        return None, phrase(value)
    return None, f"breaks the schema's {_text(keyword)} rule"


def _extra_properties(error: ValidationError) -> str:
    """Counts the keys the schema does not allow; names only the ones it does."""
    schema = error.schema if isinstance(error.schema, Mapping) else {}
    instance = error.instance if isinstance(error.instance, Mapping) else {}
    declared = schema.get("properties")
    allowed = (
        [key for key in declared if isinstance(key, str)] if isinstance(declared, Mapping) else []
    )
    patterns = schema.get("patternProperties")
    patterns = list(patterns) if isinstance(patterns, Mapping) else []
    extra = [
        key
        for key in instance
        if key not in allowed and not any(_matches(pattern, key) for pattern in patterns)
    ]
    # unevaluatedProperties depends on what subschemas evaluated: no reliable count.
    count = len(extra) if error.validator == "additionalProperties" else 0
    if count:
        text = f"has {_properties(count)} the schema does not allow"
    else:
        text = "has properties the schema does not allow"
    if allowed:
        text += f" (allowed: {_bounded(', '.join(allowed))})"
    return text


def _matches(pattern: Any, key: str) -> bool:
    try:
        return re.search(str(pattern), key) is not None
    except re.error:
        return False


def _text(value: Any) -> str:
    """Schema text as canonical JSON (strings quoted), bounded."""
    try:
        return _bounded(dumps(value).decode("utf-8"))
    except CanonicalJSONError:
        return "(a value)"


def _bounded(text: str) -> str:
    return text if len(text) <= _MAX_SCHEMA_TEXT else text[: _MAX_SCHEMA_TEXT - 1] + "…"


def _type_rule(value: Any) -> str:
    if isinstance(value, list):
        return "must be one of the types " + ", ".join(str(item) for item in value)
    return f"must be {value}"


def _enum_rule(value: Any) -> str:
    count = len(value) if isinstance(value, list) else 0
    rule = f"must be one of {count} value{'s' if count != 1 else ''}"
    listed = ", ".join(_text(item) for item in value) if isinstance(value, list) else ""
    return f"{rule}: {listed}" if listed and len(listed) <= _MAX_SCHEMA_TEXT else rule


def _count(value: Any, one: str, many: str | None = None) -> str:
    return f"{value} {one if value == 1 else (many or one + 's')}"


def _properties(value: Any) -> str:
    return _count(value, "property", "properties")


_PHRASES: dict[str, Callable[[Any], str]] = {
    "type": _type_rule,
    "enum": _enum_rule,
    "const": lambda value: f"must equal {_text(value)}",
    "false": lambda value: "is not allowed here",
    "minimum": lambda value: f"must be at least {_text(value)}",
    "maximum": lambda value: f"must be at most {_text(value)}",
    "exclusiveMinimum": lambda value: f"must be greater than {_text(value)}",
    "exclusiveMaximum": lambda value: f"must be less than {_text(value)}",
    "multipleOf": lambda value: f"must be a multiple of {_text(value)}",
    "minLength": lambda value: f"must be at least {_count(value, 'character')} long",
    "maxLength": lambda value: f"must be at most {_count(value, 'character')} long",
    "pattern": lambda value: f"must match the pattern {_text(value)}",
    "format": lambda value: f"must be a valid {_text(value)}",
    "minItems": lambda value: f"must have at least {_count(value, 'item')}",
    "maxItems": lambda value: f"must have at most {_count(value, 'item')}",
    "uniqueItems": lambda value: "must not repeat an item",
    "items": lambda value: "has more items than the schema allows",
    "unevaluatedItems": lambda value: "has more items than the schema allows",
    "prefixItems": lambda value: "has an item the schema does not allow",
    "contains": lambda value: "must contain an item that matches the schema",
    "minContains": lambda value: f"must contain at least {_count(value, 'matching item')}",
    "maxContains": lambda value: f"must contain at most {_count(value, 'matching item')}",
    "minProperties": lambda value: f"must have at least {_properties(value)}",
    "maxProperties": lambda value: f"must have at most {_properties(value)}",
    "anyOf": lambda value: f"must match at least one of {_count(len(value), 'schema')}",
    "oneOf": lambda value: f"must match exactly one of {_count(len(value), 'schema')}",
    "allOf": lambda value: f"must match all of {_count(len(value), 'schema')}",
    "not": lambda value: "must not match the schema under 'not'",
    "dependentRequired": lambda value: "misses a property another one requires",
    "required": lambda value: "misses a required property",
}
