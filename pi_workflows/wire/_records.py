"""Decoding into msgspec records with one protocol error: `checked`.

A record is checked where its frame is read. msgspec's own messages may quote peer
content (an unknown field's name, a value that is not allowed), so a failure becomes a
`ProtocolViolation` that names only the location and the kind of rule that failed.
"""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec

from pi_workflows.wire.protocol import ProtocolViolation

__all__ = ["checked"]

SCHEMA_NAME: Final = "runner.v1"
_AT = re.compile(r" - at `\$(.*)`$")
_SEGMENT = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\[[^\]]*\]")
_RULES: Final = (
    ("Object missing required field", "required"),
    ("Object contains unknown field", "unknown field"),
    ("Invalid enum value", "value is not one of the allowed values"),
    ("Invalid value", "value is not one of the allowed values"),
    ("matching regex", "string does not match the required pattern"),
)
_BOUND = re.compile(r"^Expected `(\w+)`(?: of length)? ([<>]=? \d+)$")
_TYPE = re.compile(r"^Expected `([\w |]+)`, got `(\w+)`$")
_REQUIRED = re.compile(r"^Object missing required field `(\w+)`$")


def checked(value: object, record: Any, *, at: str = "") -> Any:
    """`value` (decoded JSON) converted into `record` (a record type or a tagged union of
    them), checked on the way.

    Raises:
        ProtocolViolation: it is not one; the text is bounded and quotes no content.
    """
    try:
        return msgspec.convert(value, record)
    except msgspec.ValidationError as exc:
        raise _violation(str(exc), at) from None


def _violation(text: str, at: str) -> ProtocolViolation:
    found = _AT.search(text)
    reason = text[: found.start()] if found else text
    location = at + (_pointer(found.group(1)) if found else "")
    return ProtocolViolation(
        f"message violates {SCHEMA_NAME} at {location or '/'}: {_reason(reason)}"[:200],
        schema_name=SCHEMA_NAME,
        keyword=None,
        location=location,
    )


def _pointer(path: str) -> str:
    """`.payload.parts[3]` → `/payload/parts/3`; a dictionary key (peer content) is `*`."""
    parts = []
    for match in _SEGMENT.finditer(path):
        name, index = match.group(1), match.group(2)
        parts.append(name if name is not None else index if index is not None else "*")
    return "".join(f"/{part}" for part in parts)


def _reason(text: str) -> str:
    required = _REQUIRED.match(text)
    if required:
        return f"missing required field {required.group(1)!r}"
    for marker, words in _RULES:
        if marker in text:
            return words
    bound = _BOUND.match(text)
    if bound:
        return f"expected {bound.group(1)} {bound.group(2)}"
    wrong = _TYPE.match(text)
    if wrong:
        return f"expected {wrong.group(1)}, got {wrong.group(2)}"
    # Our own rules (`__post_init__`): their words hold field names only.
    return text[:120]
