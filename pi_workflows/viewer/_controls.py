"""The controls bar: exactly `display.controls` of the selected run, as keys and buttons.

The viewer decides nothing: each control the server allows becomes a button (or text,
for a control it has no command for), and a press sends that control's command. An
answer goes through a small form checked against the answer schema first; a recovery
goes only after a prompt that repeats its effect.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from jsonschema.exceptions import SchemaError
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from pi_workflows.wire.schema_check import check_schema

__all__ = [
    "CLEAR_KEY",
    "CONTROLS",
    "AnswerForm",
    "ConfirmPrompt",
    "ControlSpec",
    "ControlsBar",
    "answer_problem",
    "choices_schema",
    "recover_words",
]


@dataclass(frozen=True, slots=True)
class ControlSpec:
    """How the viewer sends one control: its key, its label and its operation."""

    key: str
    label: str
    operation: str
    form: str = "none"
    """`none` (send at once), `answer` (the answer form) or `recover` (a prompt first)."""
    payload: Mapping[str, Any] = field(default_factory=dict)


CONTROLS: Mapping[str, ControlSpec] = {
    "pause": ControlSpec("p", "Pause", "run.pause"),
    "resume": ControlSpec("r", "Resume", "run.resume"),
    "cancel": ControlSpec("x", "Cancel", "run.cancel"),
    "restart": ControlSpec("R", "Restart", "run.restart"),
    "answer": ControlSpec("a", "Answer", "run.answer", "answer"),
    "human-answer": ControlSpec("a", "Answer decision", "decision.answer", "answer"),
    "recoverConfirm": ControlSpec(
        "y", "Recover: confirm", "run.recover", "recover", {"action": "confirm"}
    ),
    "recoverRetry": ControlSpec(
        "Y", "Recover: retry", "run.recover", "recover", {"action": "retry"}
    ),
    "channelRecoverConfirm": ControlSpec(
        "t", "Delivery: confirm", "channel.recover", "recover", {"action": "confirm"}
    ),
    "channelRecoverRetry": ControlSpec(
        "T", "Delivery: retry", "channel.recover", "recover", {"action": "retry"}
    ),
}
"""Controls the viewer has a command for; any other control is shown as text."""

CLEAR_KEY = "d"
"""Clear the retained terminal view of an origin session (when the view names one)."""


class ControlsBar(Horizontal):
    """One button per allowed control, and text for controls without a command."""

    class Pressed(Message):
        """A control's button was pressed."""

        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

    DEFAULT_CSS = """
    ControlsBar { height: 1; }
    ControlsBar Button { min-width: 10; margin: 0 1 0 0; }
    ControlsBar .unknown { padding: 0 1; color: $warning; }
    ControlsBar .none { padding: 0 1; color: $text-muted; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.controls: tuple[str, ...] = ()
        self.clearable = False

    def show(self, controls: Sequence[str], *, clearable: bool = False) -> None:
        """Show exactly `controls` (in the server's order)."""
        if tuple(controls) == self.controls and clearable == self.clearable:
            return
        self.controls, self.clearable = tuple(controls), clearable
        self.call_next(self._rebuild)  # in order: the old buttons go before new ones come

    async def _rebuild(self) -> None:
        await self.remove_children()
        widgets: list[Static | Button] = []
        for control in self.controls:
            spec = CONTROLS.get(control)
            if spec is None:
                widgets.append(Static(f"{control} (no command in piw)", classes="unknown"))
            else:
                widgets.append(
                    Button(f"{spec.label} \\[{spec.key}]", id=f"control-{control}", compact=True)
                )
        if self.clearable:
            widgets.append(Button(f"Clear \\[{CLEAR_KEY}]", id="control-clear", compact=True))
        if not widgets:
            widgets.append(Static("no controls", classes="none"))
        await self.mount_all(widgets)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        name = str(event.button.id).removeprefix("control-")
        self.post_message(self.Pressed(name))


def answer_problem(answer: Any, schema: Mapping[str, Any] | None) -> str | None:
    """Why `answer` breaks `schema` (the first problem, with its path), or None."""
    if schema is None:
        return None
    try:
        errors = check_schema(schema).iter_errors(answer)
        error = next(iter(sorted(errors, key=lambda e: list(e.path))), None)
    except SchemaError as exc:
        return f"the answer schema is not valid: {exc.message}"
    if error is None:
        return None
    where = "/" + "/".join(str(part) for part in error.absolute_path)
    return f"at {where}: {error.message}"


def choices_schema(choices: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The shape of a decision answer with choices: `{"choice": id, "input"?: {...}}`."""
    return {
        "type": "object",
        "required": ["choice"],
        "properties": {
            "choice": {"enum": [str(choice["id"]) for choice in choices]},
            "input": {"type": "object"},
        },
        "additionalProperties": False,
    }


class AnswerForm(ModalScreen[Any]):
    """A question, a JSON answer checked against its schema, and Send / Cancel.

    Dismisses with `{"answer": value}` once the answer passes the schema, or None.
    """

    DEFAULT_CSS = """
    AnswerForm { align: center middle; }
    AnswerForm > Vertical { width: 80; height: auto; border: thick $accent; padding: 1 2;
        background: $surface; }
    AnswerForm #answer-problem { color: $error; height: auto; }
    AnswerForm Horizontal { height: auto; margin-top: 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [("escape", "cancel", "Cancel")]

    def __init__(
        self,
        question: str,
        schema: Mapping[str, Any] | None,
        example: Any,
        *,
        schema_words: str,
    ) -> None:
        super().__init__()
        self.question = question
        self.schema = schema
        self.example = example
        self.schema_words = schema_words

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.question or "Answer", id="answer-question")
            yield Static(self.schema_words, id="answer-schema")
            yield Input(
                value="" if self.example is None else json.dumps(self.example),
                placeholder="the answer as JSON",
                id="answer-input",
            )
            yield Static("", id="answer-problem")
            with Horizontal():
                yield Button("Send", id="answer-send", variant="primary", compact=True)
                yield Button("Cancel", id="answer-cancel", compact=True)

    def on_mount(self) -> None:
        self.query_one("#answer-input", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._send()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "answer-send":
            self._send()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def _send(self) -> None:
        text = self.query_one("#answer-input", Input).value
        problem = self.problem(text)
        if problem is not None:
            self.query_one("#answer-problem", Static).update(problem)
            return
        self.dismiss({"answer": json.loads(text)})

    def problem(self, text: str) -> str | None:
        """Why `text` cannot be sent, or None."""
        try:
            answer = json.loads(text)
        except ValueError:
            return 'not JSON: write the answer as a JSON value, e.g. {"approved": true}'
        return answer_problem(answer, self.schema)


class ConfirmPrompt(ModalScreen[bool]):
    """A yes/no prompt that repeats what a command will do."""

    DEFAULT_CSS = """
    ConfirmPrompt { align: center middle; }
    ConfirmPrompt > Vertical { width: 80; height: auto; border: thick $warning; padding: 1 2;
        background: $surface; }
    ConfirmPrompt Horizontal { height: auto; margin-top: 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [("escape", "no", "No"), ("n", "no", "No")]

    def __init__(self, words: str, *, yes: str = "Yes") -> None:
        super().__init__()
        self.words = words
        self.yes = yes

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.words, id="confirm-words")
            with Horizontal():
                yield Button(self.yes, id="confirm-yes", variant="warning", compact=True)
                yield Button("No", id="confirm-no", compact=True)

    def on_mount(self) -> None:
        self.query_one("#confirm-no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "confirm-yes")

    def action_no(self) -> None:
        self.dismiss(False)


def recover_words(control: str, view: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The prompt that repeats a recovery's effect, and the payload fields naming it."""
    retry = control.endswith("Retry")
    if control.startswith("channel"):
        deliveries = list(view.get("channelDeliveries") or [])
        what = (
            "the Telegram delivery"
            if not deliveries
            else f"the Telegram {deliveries[0]['operation']} of decision "
            f"{deliveries[0]['decisionId']}"
        )
        if retry:
            return f"Send {what} once more? A duplicate message is possible.", {}
        return f"Record {what} as done (the message was sent)?", {}
    effects = list(view.get("ambiguousEffects") or [])
    fields: dict[str, Any] = {}
    what = "the ambiguous effect"
    if effects:
        effect = effects[0]
        what = f"effect {effect['effectType']} at node {effect['nodePath']}"
        if len(effects) > 1:
            fields["effectId"] = effect["effectId"]
    if retry:
        return f"Apply {what} once more? A duplicate is possible.", fields
    return f"Record {what} as applied (result null); the run continues?", fields
