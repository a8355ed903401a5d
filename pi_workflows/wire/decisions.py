"""Protected human decisions on the wire: choices, the operator presentation, answers.

Implements workflow-model.md § 10.1-10.2 in a reduced form (python-port.md: keep it
simple but real). Pure data and checks, shared by the engine (a default answer is
checked when the workflow is defined) and the server (every answer is checked before
it can win), so both apply one rule.

A decision offers either choices, answered `{"choice": id}` or, for a choice that asks
for text, `{"choice": id, "input": {name: text}}`; or an answer JSON Schema
(Draft 2020-12), answered by any JSON that satisfies it.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from jsonschema.exceptions import SchemaError

from pi_workflows.wire.schema_check import check_schema

__all__ = [
    "CHOICE_ID_PATTERN",
    "MAX_CHOICES",
    "MAX_INPUT_CHARS",
    "MAX_LABEL_CHARS",
    "MAX_SUMMARY_CHARS",
    "PRESENTATION_SCHEMA",
    "Choice",
    "answer_problem",
    "choices_from_wire",
    "label_problem",
    "presentation_text",
]

PRESENTATION_SCHEMA: Final = "pi-workflows.decision-presentation.v1"
CHOICE_ID_PATTERN: Final = r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$"
MAX_CHOICES: Final = 16
"""Choices of one decision (each is one button in Telegram, one line in Pi)."""
MAX_LABEL_CHARS: Final = 64
MAX_SUMMARY_CHARS: Final = 16_000
MAX_INPUT_CHARS: Final = 4000
"""The longest text a choice's input may allow."""

_CHOICE_ID = re.compile(CHOICE_ID_PATTERN)


@dataclass(frozen=True, slots=True)
class Choice:
    """One option of a protected decision; `input_name` asks for text with it."""

    choice_id: str
    label: str
    input_name: str | None = None
    prompt: str | None = None
    min_length: int = 1
    max_length: int = MAX_INPUT_CHARS

    def to_wire(self) -> dict[str, Any]:
        """`{"id", "label", "input"?: {"name", "prompt", "minLength", "maxLength"}}`."""
        wire: dict[str, Any] = {"id": self.choice_id, "label": self.label}
        if self.input_name is not None:
            wire["input"] = {
                "name": self.input_name,
                "prompt": self.prompt or self.label,
                "minLength": self.min_length,
                "maxLength": self.max_length,
            }
        return wire


def choices_from_wire(value: Any) -> tuple[Choice, ...]:
    """The choices of a snapshot node or presentation (`to_wire` items); bad items are
    skipped (a snapshot is never edited, so this is a read of what the engine wrote)."""
    found: list[Choice] = []
    for item in value if isinstance(value, list) else ():
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            continue
        asked = item.get("input")
        label = str(item.get("label", item["id"]))
        if isinstance(asked, dict) and isinstance(asked.get("name"), str):
            found.append(
                Choice(
                    item["id"],
                    label,
                    asked["name"],
                    str(asked.get("prompt") or label),
                    int(asked.get("minLength", 1)),
                    int(asked.get("maxLength", MAX_INPUT_CHARS)),
                )
            )
        else:
            found.append(Choice(item["id"], label))
    return tuple(found)


def label_problem(text: str, *, limit: int, multiline: bool = False) -> str | None:
    """Why `text` cannot be shown as a label or summary, or None: empty, too long, or
    holding control characters (a multiline text may hold newlines and tabs)."""
    if not text.strip():
        return "is empty"
    if len(text) > limit:
        return f"is {len(text)} characters long; the limit is {limit}"
    allowed = "\n\t" if multiline else ""
    if any(unicodedata.category(c) == "Cc" and c not in allowed for c in text):
        return "holds control characters"
    return None


def answer_problem(
    answer: Any, *, choices: Sequence[Choice] = (), answer_schema: Any = None
) -> tuple[str, str] | None:
    """Why `answer` cannot answer the decision: `(pointer, message)`, or None if it can.

    The message names the rule and the place, never the answer's text: it is stored in
    receipts and printed by the CLI, and an answer may be private.
    """
    if choices:
        return _choice_problem(answer, choices)
    if answer_schema is None:
        return None
    try:
        violation = check_schema(answer_schema).first_violation(answer)
    except SchemaError as exc:  # the engine checked it; a snapshot is never edited
        return "", f"the decision's answerSchema is invalid: {exc.message}"
    if violation is None:
        return None
    return violation.pointer, "the answer does not match the decision's answerSchema " + (
        violation.describe("the whole answer")[:900]
    )


def _choice_problem(answer: Any, choices: Sequence[Choice]) -> tuple[str, str] | None:
    ids = ", ".join(c.choice_id for c in choices)
    if not isinstance(answer, Mapping) or not isinstance(answer.get("choice"), str):
        return "", f'the answer is {{"choice": ID}} with one of the choices: {ids}'
    extra = sorted(set(answer) - {"choice", "input"})
    if extra:
        return "", f"the answer has keys it may not have: {', '.join(extra)}"
    chosen = next((c for c in choices if c.choice_id == answer["choice"]), None)
    if chosen is None or not _CHOICE_ID.match(answer["choice"]):
        return "/choice", f"the choice is not one of the decision's choices: {ids}"
    given = answer.get("input")
    if chosen.input_name is None:
        if "input" in answer:
            return "/input", f"choice {chosen.choice_id} takes no input"
        return None
    name = chosen.input_name
    if not isinstance(given, Mapping) or set(given) != {name}:
        return "/input", f'choice {chosen.choice_id} needs "input": {{"{name}": text}}'
    text = given[name]
    pointer = f"/input/{name}"
    if not isinstance(text, str):
        return pointer, f"input {name} must be text"
    if len(text) > chosen.max_length or len(text.strip()) < chosen.min_length:
        return pointer, (
            f"input {name} must be {chosen.min_length} to {chosen.max_length} characters"
        )
    return None


def presentation_text(presentation: Mapping[str, Any]) -> str:
    """The plain-text operator presentation: the summary, then one line per choice (or
    the answer schema's note). What Pi shows, and what a channel may send as is."""
    lines = [str(presentation.get("summary") or "")]
    choices = choices_from_wire(presentation.get("choices"))
    if choices:
        lines.append("")
        lines.append("Choices:")
        for item in choices:
            asks = f" (with {item.input_name}: text)" if item.input_name else ""
            lines.append(f"- {item.choice_id}: {item.label}{asks}")
    elif presentation.get("answerSchema") is not None:
        lines.append("")
        lines.append("The answer is JSON that matches the decision's answer schema.")
    expires = presentation.get("expiresAt")
    if isinstance(expires, int) and presentation.get("hasDefault"):
        lines.append("")
        lines.append("Without an answer in time, the workflow's default answer is taken.")
    return "\n".join(lines)
