"""The CLI's advice: each step a run view advises, as the `pi-workflows` command to type.

The server's `display` says what happened (`reasonText`), what to do in words that name
no command (`action`), the advised steps in order (`next`) and every control allowed now
(`controls`). This module is the CLI's one table from a step's name to its command, with
the real arguments: `run show`, `run status` and `run watch` print what it gives, so a
name such as `recoverConfirm` never reaches a person, and every command printed is one
that exists (tests/server/test_advice.py runs each, as printed). A step the CLI cannot
take (the model's `submit` and `update`) has no command and is not shown.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "ANSWER_PLACEHOLDER",
    "COMMANDS",
    "Advice",
    "advice",
    "command_for",
    "kind_words",
    "node_kinds",
    "status_words",
]

ANSWER_PLACEHOLDER: Final = "JSON"
"""Stands for the answer a person gives, in an advised `--input-json` (the one word of
an advised command that is not typed as printed)."""

Command = Callable[[str, Mapping[str, Any]], str]
"""(run ID, run view) -> the command's arguments after `pi-workflows`."""


def _run(verb: str) -> Command:
    return lambda run_id, view: f"run {verb} {run_id}"


def _answer(run_id: str, view: Mapping[str, Any]) -> str:
    return f"run answer {run_id} --input-json {ANSWER_PLACEHOLDER}"


def _decision_answer(run_id: str, view: Mapping[str, Any]) -> str:
    return f"decision answer {run_id} --input-json {_example(view['display'])}"


def _example(display: Mapping[str, Any]) -> str:
    """The first choice as an answer, or the placeholder when the decision has none."""
    choices = display.get("choices") or []
    if not choices:
        return ANSWER_PLACEHOLDER
    first = choices[0]
    value: dict[str, Any] = {"choice": first["id"]}
    if first.get("input"):
        value["input"] = {first["input"]: "..."}
    return shlex.quote(json.dumps(value))


def _recover(group: str, action: str) -> Command:
    def command(run_id: str, view: Mapping[str, Any]) -> str:
        effects = view.get("ambiguousEffects") or []
        # With several ambiguous effects the server needs to know which one.
        named = f" --effect {effects[0]['effectId']}" if len(effects) > 1 else ""
        return f"{group} recover {run_id} {action}{named}"

    return command


COMMANDS: Final[Mapping[str, Command]] = {
    "pause": _run("pause"),
    "resume": _run("resume"),
    "cancel": _run("cancel"),
    "restart": _run("restart"),
    "answer": _answer,
    "human-answer": _decision_answer,
    "recoverConfirm": _recover("run", "confirm"),
    "recoverRetry": _recover("run", "retry"),
    "channelRecoverConfirm": _recover("channel", "confirm"),
    "channelRecoverRetry": _recover("channel", "retry"),
    "review": _run("show"),
    "show": _run("show"),
    "logs": _run("logs"),
    "verify": lambda run_id, view: "state verify",
}
"""The command of every step a view can advise or allow; `submit` and `update` (the
model's tool actions) have none."""

NOTES: Final[Mapping[str, str]] = {
    "answer": f"{ANSWER_PLACEHOLDER}: the answer, as the checkpoint's answer schema asks",
    "recoverConfirm": "confirm takes --result-json VALUE: the result the run continues with",
    "channelRecoverConfirm": "confirm takes --message-id ID: the Telegram message you found",
}
"""What a command's placeholder or optional argument means, printed once beside it."""


@dataclass(frozen=True, slots=True)
class Advice:
    """What the CLI prints about what to do: the words, then one command a line."""

    action: str | None
    """The server's words (no command in them)."""
    commands: list[str]
    """The advised steps' commands, in order."""
    notes: list[str]
    """What a placeholder or optional argument of one of them means."""
    also: list[str]
    """Commands of the other controls allowed now."""


def command_for(step: str, view: Mapping[str, Any], prefix: str = "pi-workflows") -> str | None:
    """The command of one advised step or control, or None if the CLI has none."""
    make = COMMANDS.get(step)
    return None if make is None else f"{prefix} {make(view['runId'], view)}"


def advice(view: Mapping[str, Any], prefix: str = "pi-workflows") -> Advice:
    """The view's advice as commands: `next` in order, then the rest of `controls`."""
    display = view["display"]
    advised = list(display.get("next") or [])
    commands, notes = [], []
    for step in advised:
        command = command_for(step, view, prefix)
        if command is not None and command not in commands:
            commands.append(command)
            if step in NOTES:
                notes.append(NOTES[step])
    also = []
    for control in display.get("controls") or []:
        command = command_for(control, view, prefix)
        if control not in advised and command is not None and command not in commands:
            also.append(command)
            if control in NOTES:
                notes.append(NOTES[control])
    return Advice(display.get("action"), commands, notes, also)


def status_words(display: Mapping[str, Any]) -> str:
    """The status as shown: `queued (parked)` for a run held until someone resumes it."""
    status = str(display["status"])
    return f"{status} (parked)" if display.get("parked") else status


def node_kinds(view: Mapping[str, Any]) -> dict[str, str]:
    """Each node's kind as the view's graph names it (a protected checkpoint is a
    `human_decision`), for the attempts, whose kind is how they ran."""
    items = ((view.get("graph") or {}).get("nodes") or {}).get("items") or []
    return {str(item["id"]): str(item["kind"]) for item in items if item.get("kind")}


def kind_words(kind: str) -> str:
    """A node kind in words: `human decision` for `human_decision`."""
    return kind.replace("_", " ")
