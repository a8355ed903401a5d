"""The authoring API: `define_workflow`, the node constructors and frozen definitions.

Implements python-port.md decisions 5 and 7 and workflow-model.md §§ 1, 4, 5.1 and 6:
edges are data, durations are seconds (stored as milliseconds), and every graph rule
is checked when the workflow is defined, with an error that names the node and the fix.
"""

from __future__ import annotations

import math
import re
import sys
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Literal, TypeAlias

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from pi_workflows.engine._errors import WorkflowDefinitionError
from pi_workflows.engine._limits import Limits, parse_limits
from pi_workflows.wire.canonical import CanonicalJSONError, dumps, format_number, loads
from pi_workflows.wire.decisions import (
    CHOICE_ID_PATTERN,
    MAX_CHOICES,
    MAX_INPUT_CHARS,
    MAX_LABEL_CHARS,
    MAX_SUMMARY_CHARS,
    Choice,
    answer_problem,
    label_problem,
)
from pi_workflows.wire.framing import MAX_FRAME_BYTES
from pi_workflows.wire.schema_check import known_valid_schema

__all__ = [
    "DEFAULT_AGENT_TIMEOUT",
    "DEFAULT_MAX_STEPS",
    "DEFAULT_NODE_TIMEOUT",
    "DEFAULT_SHELL_MAX_OUTPUT_BYTES",
    "DEFAULT_SHELL_TIMEOUT",
    "EXIT_NODE_PREFIX",
    "NODE_ID_PATTERN",
    "SHELL_EFFECT_TYPE",
    "WORKFLOW_NAME_PATTERN",
    "ActionNode",
    "AgentNode",
    "CheckpointNode",
    "ComputeNode",
    "Edge",
    "Exit",
    "HumanDecisionNode",
    "Include",
    "Node",
    "NotifyNode",
    "ShellNode",
    "Switch",
    "WorkflowDefinition",
    "action",
    "agent",
    "assistant_message",
    "checkpoint",
    "choice",
    "compute",
    "define_workflow",
    "human_decision",
    "include_workflow",
    "js_string",
    "notify",
    "shell",
]

Callback: TypeAlias = Callable[[Any], Any]

DEFAULT_NODE_TIMEOUT = 900.0
"""Seconds a compute, action or notify node may run when `timeout=None` (15 minutes)."""

DEFAULT_SHELL_TIMEOUT = 600.0
"""Seconds a shell command may run before SIGTERM, then SIGKILL, to its group."""

SHELL_INLINE_BYTES = MAX_FRAME_BYTES - 64 * 1024
"""The JSON a shell result may have to travel inline in one runner frame (a larger one
goes by reference): the node-output budget, `MAX_OUTPUT_BYTES` of the runner."""

DEFAULT_SHELL_MAX_OUTPUT_BYTES = (SHELL_INLINE_BYTES - 1024) // 2
"""Bytes kept from each of stdout and stderr of a shell node; the rest is counted and
dropped. Derived from the frame budget: both streams full of text that needs no JSON
escape, plus the result's other fields (under 1 KiB), still fit one frame. Output that
escapes to more (control bytes, NUL) goes by reference instead; it is never cut more."""

SHELL_EFFECT_TYPE = "shell"
"""The effect type under which runners run a shell node's command as a managed effect."""

DEFAULT_MAX_STEPS = 100
"""Node attempts one run may make before it fails (loops are ordinary cycles)."""

_MAX_TIMEOUT_SECONDS = 365 * 24 * 3600.0

NODE_ID_PATTERN = r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$"
"""Node ids, mount names and exit names: a letter or `_`, then letters, digits, `_`, `-`.

At most 64 characters. `$…` (switch selectors), `/` (compiled paths `mount/child`),
`.` (edge sources `mount.exit`) and the `__piw_` prefix (engine nodes) are reserved.
"""

WORKFLOW_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
"""`define_workflow(name=...)`: a letter or digit, then letters, digits, `.`, `_`, `-`."""

EXIT_NODE_PREFIX = "__piw_exit_"
"""Compiled exit nodes are `mount/__piw_exit_<exit>`; authors cannot use the prefix."""

_NODE_ID = re.compile(NODE_ID_PATTERN)
_WORKFLOW_NAME = re.compile(WORKFLOW_NAME_PATTERN)
_PATH_SEGMENT = re.compile(r"^[^.\s]+$")
_MAX_SAFE_INTEGER = 2**53 - 1


# ---------------------------------------------------------------------------
# Nodes


@dataclass(frozen=True, slots=True)
class ComputeNode:
    """A pure function of the context; it may run again after a crash."""

    kind: ClassVar[Literal["compute"]] = "compute"
    fn: Callback
    """`fn(ctx) -> output`; the output must be JSON."""
    timeout_ms: int | None
    """Node deadline in milliseconds, `None` for no deadline."""
    limits: Limits | None = None
    """Memory and process limits of this node (see `engine._limits`), or its workflow's."""


@dataclass(frozen=True, slots=True)
class ActionNode:
    """Arbitrary code whose side effects go through `ctx.effect(...)` (managed effects)."""

    kind: ClassVar[Literal["action"]] = "action"
    fn: Callback
    """`fn(ctx: ActionContext) -> output`; the output must be JSON."""
    timeout_ms: int | None
    """Node deadline in milliseconds, `None` for no deadline."""
    limits: Limits | None = None
    """Memory and process limits of this node (see `engine._limits`), or its workflow's."""


@dataclass(frozen=True, slots=True)
class ShellNode:
    """A command run by the runner in its own process group as a managed effect."""

    kind: ClassVar[Literal["shell"]] = "shell"
    argv_fn: Callback
    """`argv_fn(ctx) -> list[str]`, the argv of the command (no shell is involved)."""
    timeout_ms: int | None
    """Command deadline in milliseconds (SIGTERM to the group, then SIGKILL)."""
    max_output_bytes: int
    """Bytes kept from each of stdout and stderr."""
    idempotent: bool = False
    """The command is safe to repeat: an interrupted run of it runs again with the same
    effect key (given to it in `PI_WORKFLOWS_EFFECT_KEY`) instead of becoming ambiguous."""
    read_back: Callable[[str, Any], Any] | None = None
    """`read_back(key, request) -> result | NOT_APPLIED` proves whether an interrupted
    command took effect; `request` is `{"argv": [...]}`."""
    limits: Limits | None = None
    """Memory and process limits of the command (and the runner while it runs)."""


@dataclass(frozen=True, slots=True)
class CheckpointNode:
    """The run waits here; an answer starts one continuation run past this node."""

    kind: ClassVar[Literal["checkpoint"]] = "checkpoint"
    summary: str | Callback | None
    """Static text, or `summary(ctx) -> str`; the node output is `{"summary": text}`."""
    input_schema_json: bytes | None
    """Canonical JSON of the answer's JSON Schema (Draft 2020-12), or `None`."""

    @property
    def input_schema(self) -> Any:
        """A fresh copy of the answer's JSON Schema, or `None`."""
        return None if self.input_schema_json is None else loads(self.input_schema_json)

    timeout_ms: ClassVar[None] = None


@dataclass(frozen=True, slots=True)
class NotifyNode:
    """A durable notification to the run's origin session, committed with the node result."""

    kind: ClassVar[Literal["notify"]] = "notify"
    message_fn: str | Callback
    """Static text, or `message_fn(ctx) -> str` (non-empty after stripping)."""
    notify_kind: Literal["progress", "final"]
    """`progress` (default) or `final`."""
    timeout_ms: int | None
    """Node deadline in milliseconds, `None` for no deadline."""


DEFAULT_AGENT_TIMEOUT = 1800.0
"""Seconds an agent node may run when `timeout=None` (30 minutes)."""

_THINKING_LEVELS = ("off", "minimal", "low", "medium", "high", "xhigh")
_TOOL_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")


@dataclass(frozen=True, slots=True)
class AgentNode:
    """A step a Pi model does: its result is the output it submits through the
    `workflow` tool, checked by `output_schema` and/or `validate` in a validation child."""

    kind: ClassVar[Literal["agent"]] = "agent"
    prompt: str | Callback
    """Static text, or `prompt(ctx) -> str` (non-empty after stripping)."""
    output_schema_json: bytes | None
    """Canonical JSON of the output's JSON Schema (Draft 2020-12), or `None`."""
    validate: Callable[[Any, Any], Any] | None
    """`validate(output, ctx) -> value`: raise to reject (the message goes to the model);
    the returned value becomes the step output."""
    tools: tuple[str, ...] | None
    """Pi's built-in tools the model may use beside `workflow` (`None`: none)."""
    model: str | None
    provider: str | None
    thinking: str | None
    timeout_ms: int | None
    """Node deadline in milliseconds, `None` for no deadline."""
    visible: bool = False
    """An assistant-message step (`assistant_message`): the model's final visible reply
    of its turn is the output, with no `workflow` tool submission; interactive runs only."""
    max_chars: int | None = None
    """A visible step's bound on `text` (the rest is kept as `overflow`); `None`: none."""

    @property
    def output_schema(self) -> Any:
        """A fresh copy of the output's JSON Schema, or `None`."""
        return None if self.output_schema_json is None else loads(self.output_schema_json)


@dataclass(frozen=True, slots=True)
class HumanDecisionNode:
    """A protected human decision: the run waits, and only a person (`decision.answer`
    from the CLI, Pi's `/workflow answer`, a channel such as Telegram) or the saved
    timeout default answers it; never a model. Its kind is `checkpoint` (it waits and
    continues like one), marked `protected` in the definition snapshot."""

    kind: ClassVar[Literal["checkpoint"]] = "checkpoint"
    summary: str | Callback
    """Static text, or `summary(ctx) -> str`: what the person decides about."""
    choices: tuple[Choice, ...]
    """The options (empty when `answer_schema_json` is given instead)."""
    answer_schema_json: bytes | None
    """Canonical JSON of the answer's JSON Schema, when the decision has no choices."""
    audience: str
    """Who decides (`operator` unless named); channel profiles select by it."""
    timeout_after_ms: int | None
    """`on_timeout`'s delay in milliseconds, or None (the decision waits for a person)."""
    default_answer_json: bytes | None
    """Canonical JSON of `on_timeout`'s default answer (checked against the choices)."""

    timeout_ms: ClassVar[None] = None

    @property
    def answer_schema(self) -> Any:
        """A fresh copy of the answer's JSON Schema, or `None`."""
        return None if self.answer_schema_json is None else loads(self.answer_schema_json)

    @property
    def default_answer(self) -> Any:
        """A fresh copy of the timeout default answer, or `None`."""
        return None if self.default_answer_json is None else loads(self.default_answer_json)


Node: TypeAlias = (
    ComputeNode
    | ActionNode
    | ShellNode
    | CheckpointNode
    | NotifyNode
    | AgentNode
    | HumanDecisionNode
)
_NODE_TYPES = (
    ComputeNode,
    ActionNode,
    ShellNode,
    CheckpointNode,
    NotifyNode,
    AgentNode,
    HumanDecisionNode,
)


def _timeout_ms(value: object, *, what: str, default: float) -> int | None:
    seconds = default if value is None else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise WorkflowDefinitionError(
            f"{what}: timeout must be a number of seconds, None (the default of "
            f"{default:g} s) or math.inf (no deadline), got {type(value).__name__}"
        )
    if seconds == math.inf:
        return None
    if not (0 < seconds <= _MAX_TIMEOUT_SECONDS):
        raise WorkflowDefinitionError(
            f"{what}: timeout must be positive seconds, at most one year "
            f"(math.inf for no deadline), got {seconds!r}"
        )
    return max(1, round(seconds * 1000))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require_callable(value: object, what: str, param: str) -> None:
    if not callable(value):
        raise WorkflowDefinitionError(
            f"{what}: {param} must be a function taking the context, got {type(value).__name__}"
        )


def _schema_json(schema: object, what: str, param: str = "input_schema") -> bytes | None:
    if schema is None:
        return None
    if not isinstance(schema, dict | bool):
        raise WorkflowDefinitionError(
            f"{what}: {param} must be a JSON Schema (a dict), got {type(schema).__name__}"
        )
    try:
        if not known_valid_schema(schema):  # the common schema skips jsonschema's walk
            Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise WorkflowDefinitionError(
            f"{what}: {param} is not a valid Draft 2020-12 JSON Schema: {exc.message}"
        ) from None
    try:
        return dumps(schema)
    except CanonicalJSONError as exc:
        raise WorkflowDefinitionError(f"{what}: {param} is not plain JSON: {exc}") from None


def compute(
    fn: Callback, timeout: float | None = None, *, limits: Mapping[str, int] | None = None
) -> ComputeNode:
    """A pure node: `fn(ctx)` returns its JSON output. It may run again after a crash.

    Args:
        fn: called with the node context (`ctx.input`, `ctx.outputs`, `ctx.results`).
        timeout: seconds; `None` uses DEFAULT_NODE_TIMEOUT, `math.inf` means no deadline.
        limits: `{"memory_mb": n, "processes": n}`, either key optional; unset keys
            come from the workflow's `limits`, then the server default.
    """
    _require_callable(fn, "compute(fn)", "fn")
    return ComputeNode(
        fn=fn,
        timeout_ms=_timeout_ms(timeout, what="compute", default=DEFAULT_NODE_TIMEOUT),
        limits=parse_limits(limits, "compute"),
    )


def action(
    fn: Callback, timeout: float | None = None, *, limits: Mapping[str, int] | None = None
) -> ActionNode:
    """A side-effecting node: `fn(ctx)` performs effects through `ctx.effect(...)`.

    Args:
        fn: called with an action context; `ctx.effect(type, request, apply=..., read_back=...)`
            runs `apply(key, request)` at most once per engine-derived idempotency key.
        timeout: seconds; `None` uses DEFAULT_NODE_TIMEOUT, `math.inf` means no deadline.
        limits: `{"memory_mb": n, "processes": n}`, as for `compute`.
    """
    _require_callable(fn, "action(fn)", "fn")
    return ActionNode(
        fn=fn,
        timeout_ms=_timeout_ms(timeout, what="action", default=DEFAULT_NODE_TIMEOUT),
        limits=parse_limits(limits, "action"),
    )


def shell(
    argv_fn: Callback,
    timeout: float | None = DEFAULT_SHELL_TIMEOUT,
    max_output_bytes: int = DEFAULT_SHELL_MAX_OUTPUT_BYTES,
    *,
    idempotent: bool = False,
    read_back: Callable[[str, Any], Any] | None = None,
    limits: Mapping[str, int] | None = None,
) -> ShellNode:
    """A command node: `argv_fn(ctx)` returns the argv list; the runner runs it as an effect.

    The command's environment has `PI_WORKFLOWS_EFFECT_KEY`, the effect's idempotency
    key (the same for every run of this node visit). If a crash, pause or stop
    interrupts the command, the next runner cannot know whether it took effect: by
    default the effect becomes `ambiguous` and the run parks for the operator.

    Args:
        argv_fn: called with the node context; returns a non-empty list of strings.
        timeout: seconds before SIGTERM to the command's group (then SIGKILL);
            `None` uses DEFAULT_SHELL_TIMEOUT, `math.inf` means no deadline.
        max_output_bytes: bytes kept from each of stdout and stderr.
        idempotent: the command is safe to repeat (for example, it deduplicates by
            `PI_WORKFLOWS_EFFECT_KEY`): an interrupted command runs again.
        read_back: `read_back(key, request)` proves the outcome of an interrupted
            command, the way an action's effect does: it returns the node's result
            when the command took effect, `NOT_APPLIED` when it did not (the command
            then runs), and raises when it cannot tell (ambiguous). `request` is
            `{"argv": [...]}`. Give `idempotent` or `read_back`, not both.
        limits: `{"memory_mb": n, "processes": n}`, as for `compute`; the command runs
            under them (its memory limit is inherited, its processes are counted).
    """
    _require_callable(argv_fn, "shell(argv_fn)", "argv_fn")
    if not isinstance(idempotent, bool):
        raise WorkflowDefinitionError(
            f"shell: idempotent must be True or False, got {idempotent!r}"
        )
    if read_back is not None:
        if not callable(read_back):
            raise WorkflowDefinitionError(
                "shell: read_back must be a function (key, request), "
                f"got {type(read_back).__name__}"
            )
        if idempotent:
            raise WorkflowDefinitionError(
                "shell: give idempotent=True (the command runs again) or read_back "
                "(prove the outcome), not both"
            )
    if not _is_int(max_output_bytes) or not 0 < max_output_bytes <= _MAX_SAFE_INTEGER:
        raise WorkflowDefinitionError(
            f"shell: max_output_bytes must be a positive integer, got {max_output_bytes!r}"
        )
    return ShellNode(
        argv_fn=argv_fn,
        timeout_ms=_timeout_ms(timeout, what="shell", default=DEFAULT_SHELL_TIMEOUT),
        max_output_bytes=max_output_bytes,
        idempotent=idempotent,
        read_back=read_back,
        limits=parse_limits(limits, "shell"),
    )


def checkpoint(
    summary: str | Callback | None = None, input_schema: Mapping[str, Any] | None = None
) -> CheckpointNode:
    """A waiting point: the run ends `waiting`; an answer starts one continuation run.

    Args:
        summary: text shown while waiting, or `summary(ctx) -> str`.
        input_schema: JSON Schema (Draft 2020-12) the answer must satisfy; the server
            checks it from the definition snapshot without loading workflow code.
    """
    if (
        summary is not None
        and not callable(summary)
        and (not isinstance(summary, str) or not summary.strip())
    ):
        raise WorkflowDefinitionError(
            "checkpoint: summary must be non-empty text or a function of the context"
        )
    return CheckpointNode(
        summary=summary, input_schema_json=_schema_json(input_schema, "checkpoint")
    )


_CHOICE_ID = re.compile(CHOICE_ID_PATTERN)
_AUDIENCE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
DEFAULT_AUDIENCE = "operator"
"""The audience of a `human_decision` that names none."""


def choice(
    label: str,
    *,
    input: str | None = None,
    prompt: str | None = None,
    min_length: int = 1,
    max_length: int = MAX_INPUT_CHARS,
) -> Choice:
    """One option of a `human_decision`, optionally asking the person for text.

    Args:
        label: what the person sees (a button's text in Telegram), at most 64 characters.
        input: the name of the text the choice asks for (the answer is then
            `{"choice": id, "input": {name: text}}`), or None.
        prompt: the question for that text (default: the label).
        min_length, max_length: bounds of the text (after stripping, at most 4000).
    """
    problem = (
        label_problem(label, limit=MAX_LABEL_CHARS) if isinstance(label, str) else "is no text"
    )
    if problem is not None:
        raise WorkflowDefinitionError(f"choice: the label {problem}")
    if input is not None and (not isinstance(input, str) or not _CHOICE_ID.match(input)):
        raise WorkflowDefinitionError(
            f"choice {label!r}: input must be a name like 'reason' (letters, digits, '_', '-')"
        )
    if prompt is not None and (
        not isinstance(prompt, str) or label_problem(prompt, limit=MAX_SUMMARY_CHARS)
    ):
        raise WorkflowDefinitionError(f"choice {label!r}: prompt must be non-empty text")
    if not (
        _is_int(min_length)
        and _is_int(max_length)
        and 0 <= min_length <= max_length
        and 0 < max_length <= MAX_INPUT_CHARS
    ):
        raise WorkflowDefinitionError(
            f"choice {label!r}: need 0 <= min_length <= max_length <= {MAX_INPUT_CHARS}"
        )
    if input is None and (prompt is not None or min_length != 1 or max_length != MAX_INPUT_CHARS):
        raise WorkflowDefinitionError(
            f"choice {label!r}: prompt and lengths need input=NAME (the text it asks for)"
        )
    return Choice("", label, input, prompt, min_length, max_length)


def human_decision(
    summary: str | Callback,
    *,
    choices: Mapping[str, str | Choice] | None = None,
    answer_schema: Mapping[str, Any] | None = None,
    on_timeout: tuple[float, Any] | None = None,
    audience: str | None = None,
) -> HumanDecisionNode:
    """A protected decision: the run waits until a person answers, or the timeout's
    default does. It never starts a model turn and no model tool can answer it.

    People answer with `pi-workflows decision answer RUN_ID --input-json JSON`,
    `/workflow answer JSON` in the run's Pi session, or a channel such as Telegram. The
    first valid answer wins; the continuation run routes on it (`switch` on `$.choice`)
    and sees it as `ctx.outputs[node_id]`.

    Args:
        summary: what is decided (plain text, at most 16,000 characters), or
            `summary(ctx) -> str`.
        choices: choice id (letters, digits, '_', '-') → label, or → `choice(label,
            input=NAME)` for one that asks for text; answered `{"choice": id}` or
            `{"choice": id, "input": {NAME: text}}`. At most 16.
        answer_schema: instead of choices, a JSON Schema (Draft 2020-12) the answer
            satisfies.
        on_timeout: `(seconds, default_answer)`: when no person answered by then, the
            default answer wins (provenance `timeout`); it is checked here.
        audience: who decides (default `operator`); channel profiles select by it.

    Raises:
        WorkflowDefinitionError: naming the problem and the fix.
    """
    if callable(summary):
        pass
    elif not isinstance(summary, str) or label_problem(
        summary, limit=MAX_SUMMARY_CHARS, multiline=True
    ):
        raise WorkflowDefinitionError(
            "human_decision: summary must be non-empty text (at most 16,000 characters, "
            "no control characters but newlines and tabs) or a function of the context"
        )
    if (choices is None) == (answer_schema is None):
        raise WorkflowDefinitionError(
            "human_decision: give choices={id: label, ...} or answer_schema={...}, one of them"
        )
    parsed = _decision_choices(choices) if choices is not None else ()
    schema_json = (
        _schema_json(answer_schema, "human_decision", "answer_schema")
        if answer_schema is not None
        else None
    )
    if audience is None:
        audience = DEFAULT_AUDIENCE
    if not isinstance(audience, str) or not _AUDIENCE.match(audience) or audience == "checkpoint":
        raise WorkflowDefinitionError(
            f"human_decision: audience {audience!r} must be a name like 'operator' "
            "(letters, digits, '.', '_', '-'; not 'checkpoint')"
        )
    after_ms, default_json = _decision_timeout(on_timeout, parsed, answer_schema)
    return HumanDecisionNode(
        summary=summary,
        choices=parsed,
        answer_schema_json=schema_json,
        audience=audience,
        timeout_after_ms=after_ms,
        default_answer_json=default_json,
    )


def _decision_choices(choices: object) -> tuple[Choice, ...]:
    if not isinstance(choices, Mapping) or not choices:
        raise WorkflowDefinitionError(
            "human_decision: choices must be a non-empty dict of choice id → label"
        )
    if len(choices) > MAX_CHOICES:
        raise WorkflowDefinitionError(f"human_decision: at most {MAX_CHOICES} choices")
    parsed: list[Choice] = []
    for choice_id, value in choices.items():
        if not isinstance(choice_id, str) or not _CHOICE_ID.match(choice_id):
            raise WorkflowDefinitionError(
                f"human_decision: choice id {choice_id!r} must be letters, digits, '_' and "
                "'-', starting with a letter or '_' (at most 64 characters)"
            )
        made = choice(value) if isinstance(value, str) else value
        if not isinstance(made, Choice):
            raise WorkflowDefinitionError(
                f"human_decision: choice {choice_id!r} must be a label or choice(label, ...)"
            )
        parsed.append(
            Choice(
                choice_id,
                made.label,
                made.input_name,
                made.prompt,
                made.min_length,
                made.max_length,
            )
        )
    labels = [c.label for c in parsed]
    if len(set(labels)) != len(labels):
        raise WorkflowDefinitionError("human_decision: two choices have the same label")
    return tuple(parsed)


def _decision_timeout(
    on_timeout: object, choices: tuple[Choice, ...], answer_schema: Any
) -> tuple[int | None, bytes | None]:
    if on_timeout is None:
        return None, None
    if not isinstance(on_timeout, tuple) or len(on_timeout) != 2:
        raise WorkflowDefinitionError(
            "human_decision: on_timeout must be (seconds, default_answer), "
            'e.g. (3600, {"choice": "reject"})'
        )
    seconds, default = on_timeout
    if seconds == math.inf:
        raise WorkflowDefinitionError(
            "human_decision: on_timeout needs finite seconds; leave it out to wait for a person"
        )
    after_ms = _timeout_ms(seconds, what="human_decision on_timeout", default=1.0)
    if seconds is None or after_ms is None:
        raise WorkflowDefinitionError("human_decision: on_timeout needs a number of seconds")
    try:
        default_json = dumps(default)
    except CanonicalJSONError as exc:
        raise WorkflowDefinitionError(
            f"human_decision: the on_timeout default answer is not plain JSON: {exc}"
        ) from None
    problem = answer_problem(default, choices=choices, answer_schema=answer_schema)
    if problem is not None:
        pointer, message = problem
        where = f" at {pointer}" if pointer else ""
        raise WorkflowDefinitionError(
            f"human_decision: the on_timeout default answer cannot answer it{where}: {message}"
        )
    return after_ms, default_json


def notify(
    message_fn: str | Callback,
    kind: Literal["progress", "final"] = "progress",
    timeout: float | None = None,
) -> NotifyNode:
    """A notification node: `message_fn(ctx)` returns the text sent to the origin session.

    Args:
        message_fn: static text, or a function of the context returning non-empty text.
        kind: `progress` or `final`.
        timeout: seconds; `None` uses DEFAULT_NODE_TIMEOUT, `math.inf` means no deadline.
    """
    if not callable(message_fn) and not (isinstance(message_fn, str) and message_fn.strip()):
        raise WorkflowDefinitionError(
            "notify: message_fn must be non-empty text or a function of the context"
        )
    if kind not in ("progress", "final"):
        raise WorkflowDefinitionError(f"notify: kind must be 'progress' or 'final', got {kind!r}")
    return NotifyNode(
        message_fn=message_fn,
        notify_kind=kind,
        timeout_ms=_timeout_ms(timeout, what="notify", default=DEFAULT_NODE_TIMEOUT),
    )


def _optional_name(value: object, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > 256:
        raise WorkflowDefinitionError(
            f"agent: {what} must be a non-empty name (at most 256 characters) or None"
        )
    return value


def _agent_tools(tools: object) -> tuple[str, ...] | None:
    if tools is None:
        return None
    if isinstance(tools, str) or not isinstance(tools, list | tuple):
        raise WorkflowDefinitionError(
            "agent: tools must be a list of Pi tool names (e.g. ['read', 'bash']) or None"
        )
    names = tuple(tools)
    for name in names:
        if not isinstance(name, str) or not _TOOL_NAME.match(name) or name == "workflow":
            raise WorkflowDefinitionError(
                f"agent: tool {name!r} is not a Pi tool name (lowercase; `workflow` is "
                "always given)"
            )
    if len(set(names)) != len(names):
        raise WorkflowDefinitionError("agent: tools lists a name twice")
    return names


def agent(
    *,
    prompt: str | Callback,
    output_schema: Mapping[str, Any] | None = None,
    validate: Callable[[Any, Any], Any] | None = None,
    tools: list[str] | tuple[str, ...] | None = None,
    model: str | None = None,
    provider: str | None = None,
    thinking: str | None = None,
    timeout: float | None = None,
) -> AgentNode:
    """An agent step: a Pi model does the work and submits the step's output.

    Args:
        prompt: the task text, or `prompt(ctx) -> str`.
        output_schema: JSON Schema (Draft 2020-12) of the output; it is also the
            `workflow` tool's parameter schema.
        validate: `validate(output, ctx) -> value`; raise to reject with a message the
            model sees. Both checks run in a validation child, never in the server.
        tools: Pi's built-in tools the model may use beside `workflow`.
        model, provider: passed to pi as `--model` / `--provider` (else pi's settings).
        thinking: pi's thinking level (`off` … `xhigh`).
        timeout: seconds; `None` uses DEFAULT_AGENT_TIMEOUT, `math.inf` means no deadline.
    """
    if not callable(prompt) and not (isinstance(prompt, str) and prompt.strip()):
        raise WorkflowDefinitionError(
            "agent: prompt must be non-empty text or a function of the context"
        )
    if validate is not None:
        _require_callable(validate, "agent", "validate")
    if thinking is not None and thinking not in _THINKING_LEVELS:
        raise WorkflowDefinitionError(
            f"agent: thinking must be one of {', '.join(_THINKING_LEVELS)} or None, "
            f"got {thinking!r}"
        )
    return AgentNode(
        prompt=prompt,
        output_schema_json=_schema_json(output_schema, "agent", "output_schema"),
        validate=validate,
        tools=_agent_tools(tools),
        model=_optional_name(model, "model"),
        provider=_optional_name(provider, "provider"),
        thinking=thinking,
        timeout_ms=_timeout_ms(timeout, what="agent", default=DEFAULT_AGENT_TIMEOUT),
    )


MAX_ASSISTANT_CHARS = 1_000_000
"""The largest `max_chars` an assistant-message step may set."""


def assistant_message(
    prompt: str | Callback,
    max_chars: int | None = None,
    *,
    timeout: float | None = None,
    output_schema: object = None,
    validate: object = None,
) -> AgentNode:
    """A visible assistant-message step: the model answers the prompt with a normal reply
    in the run's origin Pi session, and its final visible text of that turn becomes the
    output `{"text": ...}` (no `workflow` tool call). Interactive runs only: a headless
    start of a workflow with one is refused (`headlessVisibleStep`).

    Args:
        prompt: the task text, or `prompt(ctx) -> str`.
        max_chars: the most characters `text` keeps; a longer reply's rest is kept in
            the output as `overflow` (with `truncated: true`). `None`: no bound.
        timeout: seconds of model turns; `None` uses DEFAULT_AGENT_TIMEOUT, `math.inf`
            means no deadline.
        output_schema, validate: not allowed (a reply is text, and nothing checks it);
            given, they raise WorkflowDefinitionError.
    """
    if output_schema is not None or validate is not None:
        raise WorkflowDefinitionError(
            "assistant_message: a visible reply takes no output_schema or validate; use "
            "agent(...) for a checked, submitted output"
        )
    if not callable(prompt) and not (isinstance(prompt, str) and prompt.strip()):
        raise WorkflowDefinitionError(
            "assistant_message: prompt must be non-empty text or a function of the context"
        )
    if max_chars is not None and (
        not _is_int(max_chars) or not 0 < max_chars <= MAX_ASSISTANT_CHARS
    ):
        raise WorkflowDefinitionError(
            f"assistant_message: max_chars must be a positive integer (at most "
            f"{MAX_ASSISTANT_CHARS:,}) or None, got {max_chars!r}"
        )
    return AgentNode(
        prompt=prompt,
        output_schema_json=None,
        validate=None,
        tools=None,
        model=None,
        provider=None,
        thinking=None,
        timeout_ms=_timeout_ms(timeout, what="assistant_message", default=DEFAULT_AGENT_TIMEOUT),
        visible=True,
        max_chars=max_chars,
    )


# ---------------------------------------------------------------------------
# Includes, exits, edges


@dataclass(frozen=True, slots=True)
class Include:
    """A child workflow mounted under a mount name (`includes={"mount": include_workflow(...)}`)."""

    workflow: str | WorkflowDefinition
    """A discovered command name (or a `.workflow.py` path relative to the including
    file), or a definition object."""
    input_fn: Callback | None
    """`input_fn(parent_ctx) -> child input`; `None` passes the parent's `ctx.input` on."""


def include_workflow(workflow: str | WorkflowDefinition, input: Callback | None = None) -> Include:
    """Mount a child workflow; parent edges enter it with `to: "mount"` and leave it
    with `from: "mount.<exit>"`.

    Args:
        workflow: a command name resolved through discovery, a path ending in
            `.workflow.py` relative to the including file, or a definition object.
        input: `input(parent_ctx)` returns the child's input (checked by the child's
            `input_schema` and `input`); `None` passes the parent's input on.
    """
    if isinstance(workflow, str):
        if not workflow.strip():
            raise WorkflowDefinitionError("include_workflow: the workflow name is empty")
    elif not isinstance(workflow, WorkflowDefinition):
        raise WorkflowDefinitionError(
            "include_workflow: pass a workflow name or a define_workflow(...) result, got "
            f"{type(workflow).__name__}"
        )
    if input is not None:
        _require_callable(input, "include_workflow(input)", "input")
    return Include(workflow=workflow, input_fn=input)


@dataclass(frozen=True, slots=True)
class Exit:
    """A named successful end of a workflow that others include."""

    name: str
    source: str
    """The terminal node whose output leaves through this exit."""
    validate_fn: Callback | None
    """`validate_fn(output) -> output` (may normalise or raise); `None` passes it on."""


@dataclass(frozen=True, slots=True)
class Switch:
    """A conditional edge body: route on a selector's value, stringified like JavaScript."""

    on: str
    """`$.path` / `$output.path` (the node output) or `$result.outcome`."""
    cases: Mapping[str, str]
    """Stringified value → target."""
    default: str | None
    """Target when no case matches (a missing field included), or `None`."""

    @property
    def selector(self) -> Literal["output", "result"]:
        """`output` for `$.`/`$output.` selectors, `result` for `$result.outcome`."""
        return "result" if self.on.startswith("$result.") else "output"

    @property
    def path(self) -> tuple[str, ...]:
        """The dotted path after the selector prefix."""
        return tuple(self.on.split(".")[1:])

    def targets(self) -> list[str]:
        """Every target this switch may route to, cases first."""
        found = list(self.cases.values())
        if self.default is not None:
            found.append(self.default)
        return found


@dataclass(frozen=True, slots=True)
class Edge:
    """The one outgoing edge of a node: unconditional (`target`) or a `switch`."""

    source: str
    target: str | None
    switch: Switch | None

    def targets(self) -> list[str]:
        """Every node this edge may route to."""
        if self.switch is not None:
            return self.switch.targets()
        return [self.target] if self.target is not None else []

    def to_wire(self) -> dict[str, Any]:
        """The edge as data, as authors write it (cases stringified)."""
        if self.switch is None:
            return {"from": self.source, "to": self.target}
        body: dict[str, Any] = {"on": self.switch.on, "cases": dict(self.switch.cases)}
        if self.switch.default is not None:
            body["default"] = self.switch.default
        return {"from": self.source, "switch": body}


def js_string(value: Any) -> str | None:
    """Stringify a scalar the way JavaScript's `String(value)` does; `None` if not a scalar.

    `True` → `"true"`, `1` → `"1"`, `1.0` → `"1"`, `1.5` → `"1.5"`, `None` → `"null"`.
    """
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value) if abs(value) <= _MAX_SAFE_INTEGER else js_string(float(value))
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return format_number(value)
    return None


# ---------------------------------------------------------------------------
# The definition


@dataclass(frozen=True, slots=True, eq=False)
class WorkflowDefinition:
    """A validated, immutable workflow graph; build it with `define_workflow`.

    Identity equality: two definitions are the same only if they are the same object.
    """

    name: str
    start_at: str
    nodes: Mapping[str, Node]
    edges: tuple[Edge, ...]
    outgoing: Mapping[str, Edge]
    """Edge by source (a node id, or `mount.exit` for an include)."""
    max_steps: int
    input_schema_json: bytes | None
    """Canonical JSON of the run input's JSON Schema (Draft 2020-12), or `None`."""
    input_fn: Callback | None
    """`input_fn(value) -> normalised input` (may raise); returning `None` keeps the value."""
    includes: Mapping[str, Include]
    exits: Mapping[str, Exit]
    title: str | Callback | None
    """Run title, or `title(ctx)` with `ctx.input` and `ctx.workflow_name`."""
    source_path: str | None = field(default=None)
    """The file that called `define_workflow` (hashed when this definition is included)."""
    limits: Limits | None = field(default=None)
    """Limits of every node that sets none itself (an include's nodes too, unless the
    included workflow sets its own); unset keys come from the server default."""

    @property
    def input_schema(self) -> Any:
        """A fresh copy of the input JSON Schema, or `None`."""
        return None if self.input_schema_json is None else loads(self.input_schema_json)


def define_workflow(
    *,
    name: str,
    start_at: str,
    nodes: Mapping[str, Node],
    edges: Iterable[Mapping[str, Any]] = (),
    max_steps: int = DEFAULT_MAX_STEPS,
    input_schema: Mapping[str, Any] | None = None,
    input: Callback | None = None,
    includes: Mapping[str, Include] | None = None,
    exits: Mapping[str, Mapping[str, Any]] | None = None,
    title: str | Callback | None = None,
    limits: Mapping[str, int] | None = None,
) -> WorkflowDefinition:
    """Define a workflow; every graph rule is checked here.

    Args:
        name: the workflow's name (WORKFLOW_NAME_PATTERN).
        start_at: the first node id (or mount name).
        nodes: node id (NODE_ID_PATTERN) → `compute(...)`, `action(...)`, `shell(...)`,
            `checkpoint(...)`, `human_decision(...)`, `notify(...)`, `agent(...)` or
            `assistant_message(...)`.
        edges: `{"from": a, "to": b}` or `{"from": a, "switch": {"on": "$.field" |
            "$result.outcome", "cases": {value: target}, "default": target}}`; at most one
            per source. Sources of an include are `"mount.exit"`.
        max_steps: node attempts one run may make (loops count every visit).
        input_schema: JSON Schema (Draft 2020-12) of the run input, checked first.
        input: `input(value)` checks the input after the schema; it may return a
            normalised input (`None` keeps the value) or raise to refuse the start.
        includes: mount name → `include_workflow(...)`.
        exits: exit name → `{"from": terminal_node, "validate": optional fn(output)}`;
            needed only by workflows that others include.
        title: run title, or `title(ctx)` with `ctx.input` and `ctx.workflow_name`.
        limits: `{"memory_mb": n, "processes": n}` for every node that sets none itself
            (see `compute`); unset keys come from the server default.

    Raises:
        WorkflowDefinitionError: naming the node (or mount, exit, edge) and the fix.
    """
    if not isinstance(name, str) or not _WORKFLOW_NAME.match(name):
        raise WorkflowDefinitionError(
            f"name {name!r} is not a valid workflow name; use letters, digits, '.', '_' "
            "and '-', starting with a letter or digit (at most 128 characters)"
        )

    def fail(node: str | None, message: str) -> WorkflowDefinitionError:
        return WorkflowDefinitionError(message, workflow=name, node=node)

    node_map = _parse_nodes(nodes, fail)
    include_map = _parse_includes(includes, node_map, fail)

    if not _is_int(max_steps) or not 0 < max_steps <= 1_000_000:
        raise fail(None, f"max_steps must be a positive integer (≤ 1,000,000), got {max_steps!r}")
    schema_json = _schema_json(input_schema, f"workflow {name!r}")
    if input is not None:
        _require_callable(input, f"workflow {name!r}: input", "input")
    if title is not None and not callable(title) and not (isinstance(title, str) and title.strip()):
        raise fail(None, "title must be non-empty text or a function of a context")
    workflow_limits = parse_limits(limits, f"workflow {name!r}")

    targets = set(node_map) | set(include_map)
    if not isinstance(start_at, str) or start_at not in targets:
        raise fail(
            start_at if isinstance(start_at, str) else None,
            f"start_at {start_at!r} is not a node id or mount name; pick one of {sorted(targets)}",
        )

    edge_list = _parse_edges(edges, node_map, include_map, targets, fail)
    outgoing: dict[str, Edge] = {}
    for edge in edge_list:
        if edge.source in outgoing:
            raise fail(
                edge.source,
                "has more than one outgoing edge; merge them into one edge with a switch",
            )
        outgoing[edge.source] = edge

    _check_choice_switches(node_map, outgoing, fail)
    exit_map = _parse_exits(exits, node_map, outgoing, fail)
    _check_reachable(start_at, node_map, include_map, outgoing, fail)

    caller = sys._getframe(1).f_globals.get("__file__")
    return WorkflowDefinition(
        name=name,
        start_at=start_at,
        nodes=MappingProxyType(node_map),
        edges=tuple(edge_list),
        outgoing=MappingProxyType(outgoing),
        max_steps=max_steps,
        input_schema_json=schema_json,
        input_fn=input,
        includes=MappingProxyType(include_map),
        exits=MappingProxyType(exit_map),
        title=title,
        source_path=caller if isinstance(caller, str) else None,
        limits=workflow_limits,
    )


_Fail: TypeAlias = Callable[[str | None, str], WorkflowDefinitionError]


def _check_choice_switches(
    nodes: Mapping[str, Node], outgoing: Mapping[str, Edge], fail: _Fail
) -> None:
    """A switch on `$.choice` after a decision with choices names only its choices."""
    for source, edge in outgoing.items():
        node = nodes.get(source)
        if not isinstance(node, HumanDecisionNode) or not node.choices or edge.switch is None:
            continue
        if edge.switch.on != "$.choice":
            continue
        known = {c.choice_id for c in node.choices}
        unknown = sorted(set(edge.switch.cases) - known)
        if unknown:
            raise fail(
                source,
                f"switches on $.choice with cases {unknown} that are not its choices "
                f"{sorted(known)}",
            )


def _parse_nodes(nodes: Mapping[str, Node], fail: _Fail) -> dict[str, Node]:
    if not isinstance(nodes, Mapping) or not nodes:
        raise fail(None, "nodes must be a non-empty dict of node id → node")
    node_map: dict[str, Node] = {}
    for node_id, node in nodes.items():
        _check_id(node_id, "node id", fail)
        if not isinstance(node, _NODE_TYPES):
            raise fail(
                node_id,
                f"is a {type(node).__name__}, not a node; wrap it with compute(fn), action(fn), "
                "shell(argv_fn), checkpoint(...), human_decision(...), notify(message_fn) or "
                "agent(prompt=...)",
            )
        if (
            isinstance(node, AgentNode)
            and node.visible
            and (node.validate is not None or node.output_schema_json is not None)
        ):
            raise fail(
                node_id,
                "is an assistant_message step with an output_schema or validate; a visible "
                "reply is not checked: use agent(...) for a checked, submitted output",
            )
        node_map[node_id] = node
    return node_map


def _parse_includes(
    includes: Mapping[str, Include] | None, nodes: Mapping[str, Node], fail: _Fail
) -> dict[str, Include]:
    if includes is not None and not isinstance(includes, Mapping):
        raise fail(None, "includes must be a dict of mount name → include_workflow(...)")
    include_map: dict[str, Include] = {}
    for mount, include in (includes or {}).items():
        _check_id(mount, "mount name", fail)
        if mount in nodes:
            raise fail(mount, "is both a node id and an include mount name; rename one")
        if not isinstance(include, Include):
            raise fail(mount, "includes values must be include_workflow(...) results")
        include_map[mount] = include
    return include_map


def _check_id(value: object, what: str, fail: _Fail) -> None:
    if not isinstance(value, str):
        raise fail(None, f"{what} {value!r} must be a string")
    if value.startswith("$"):
        raise fail(value, f"{what}s starting with '$' are reserved for switch selectors; rename it")
    if "/" in value:
        raise fail(
            value, f"{what}s must not contain '/', which is reserved for include paths; rename it"
        )
    if "." in value:
        raise fail(
            value,
            f"{what}s must not contain '.', which is reserved for 'mount.exit' edge sources; "
            "rename it",
        )
    if value.startswith("__piw_"):
        raise fail(value, f"the '__piw_' prefix is reserved for engine nodes; rename this {what}")
    if not _NODE_ID.match(value):
        raise fail(
            value,
            f"is not a valid {what}; use a letter or '_' followed by letters, digits, '_' or "
            "'-' (at most 64 characters)",
        )


def _parse_edges(
    edges: Iterable[Mapping[str, Any]],
    nodes: Mapping[str, Node],
    includes: Mapping[str, Include],
    targets: set[str],
    fail: _Fail,
) -> list[Edge]:
    if isinstance(edges, str | bytes | Mapping):
        raise fail(None, "edges must be a list of edge dicts")
    parsed: list[Edge] = []
    for index, raw in enumerate(edges):
        if not isinstance(raw, Mapping):
            raise fail(None, f"edge #{index} must be a dict like {{'from': 'a', 'to': 'b'}}")
        source = raw.get("from")
        label = source if isinstance(source, str) else None
        if not isinstance(source, str):
            raise fail(None, f"edge #{index} needs a 'from' node id")
        _check_source(source, nodes, includes, fail)
        extra = set(raw) - {"from", "to", "switch"}
        if extra:
            raise fail(label, f"edge from {source!r} has unknown keys {sorted(extra)}")
        if ("to" in raw) == ("switch" in raw):
            raise fail(label, f"edge from {source!r} needs exactly one of 'to' or 'switch'")
        if "to" in raw:
            target = raw["to"]
            _check_target(target, source, targets, fail)
            parsed.append(Edge(source=source, target=target, switch=None))
        else:
            switch = _parse_switch(raw["switch"], source, targets, fail)
            parsed.append(Edge(source=source, target=None, switch=switch))
    return parsed


def _check_source(
    source: str, nodes: Mapping[str, Node], includes: Mapping[str, Include], fail: _Fail
) -> None:
    if source in nodes:
        return
    if source in includes:
        raise fail(
            source,
            f"is an include mount; leave it with an edge from '{source}.<exit>' naming one "
            "of the child's exits",
        )
    mount, dot, exit_name = source.partition(".")
    if dot and mount in includes:
        child = includes[mount].workflow
        if isinstance(child, WorkflowDefinition) and exit_name not in child.exits:
            raise fail(
                source,
                f"names exit {exit_name!r}, but the included workflow {child.name!r} has exits "
                f"{sorted(child.exits)}",
            )
        return
    raise fail(source, "is the source of an edge but is not a node; define it or fix the edge")


def _check_target(target: object, source: str, targets: set[str], fail: _Fail) -> None:
    if not isinstance(target, str) or target not in targets:
        raise fail(
            source,
            f"routes to unknown target {target!r}; use a node id or mount name "
            f"({', '.join(sorted(targets))})",
        )


def _parse_switch(raw: object, source: str, targets: set[str], fail: _Fail) -> Switch:
    if not isinstance(raw, Mapping):
        raise fail(source, "switch must be a dict with 'on' and 'cases'")
    extra = set(raw) - {"on", "cases", "default"}
    if extra:
        raise fail(source, f"switch has unknown keys {sorted(extra)}")
    on = raw.get("on")
    if not isinstance(on, str) or not _valid_selector(on):
        raise fail(
            source,
            f"switch on {on!r} is not supported; use '$.field' (a dotted path into the "
            "node output, also '$output.field') or '$result.outcome'",
        )
    cases_raw = raw.get("cases")
    if not isinstance(cases_raw, Mapping) or not cases_raw:
        raise fail(source, "switch needs a non-empty 'cases' dict of value → target")
    cases: dict[str, str] = {}
    for value, target in cases_raw.items():
        key = js_string(value)
        if key is None:
            raise fail(source, f"switch case {value!r} must be a string, number, bool or None")
        if key in cases:
            raise fail(
                source,
                f"switch cases {value!r} and another both read as {key!r} in JavaScript; keep one",
            )
        _check_target(target, source, targets, fail)
        cases[key] = target
    default = raw.get("default")
    if default is not None:
        _check_target(default, source, targets, fail)
    return Switch(on=on, cases=MappingProxyType(cases), default=default)


def _valid_selector(on: str) -> bool:
    if on == "$result.outcome":
        return True
    for prefix in ("$.", "$output."):
        if on.startswith(prefix):
            rest = on[len(prefix) :]
            return bool(rest) and all(_PATH_SEGMENT.match(part) for part in rest.split("."))
    return False


def _parse_exits(
    exits: Mapping[str, Mapping[str, Any]] | None,
    nodes: Mapping[str, Node],
    outgoing: Mapping[str, Edge],
    fail: _Fail,
) -> dict[str, Exit]:
    if exits is None:
        return {}
    if not isinstance(exits, Mapping) or not exits:
        raise fail(None, "exits must be a non-empty dict of exit name → {'from': node}")
    parsed: dict[str, Exit] = {}
    by_source: dict[str, str] = {}
    for exit_name, spec in exits.items():
        _check_id(exit_name, "exit name", fail)
        if not isinstance(spec, Mapping) or set(spec) - {"from", "validate"}:
            raise fail(exit_name, "exit must be a dict {'from': node, 'validate': optional fn}")
        source = spec.get("from")
        if not isinstance(source, str) or source not in nodes:
            raise fail(
                source if isinstance(source, str) else exit_name,
                f"exit {exit_name!r} leaves from {source!r}, which is not a node",
            )
        if source in outgoing:
            raise fail(
                source,
                f"exit {exit_name!r} leaves from a node with an outgoing edge; an exit must "
                "leave from a terminal node",
            )
        if source in by_source:
            raise fail(
                source, f"exits {by_source[source]!r} and {exit_name!r} leave from the same node"
            )
        validate = spec.get("validate")
        if validate is not None:
            _require_callable(validate, f"exit {exit_name!r}: validate", "validate")
        by_source[source] = exit_name
        parsed[exit_name] = Exit(name=exit_name, source=source, validate_fn=validate)
    return parsed


def _check_reachable(
    start_at: str,
    nodes: Mapping[str, Node],
    includes: Mapping[str, Include],
    outgoing: Mapping[str, Edge],
    fail: _Fail,
) -> None:
    exit_sources: dict[str, list[str]] = {}
    for source in outgoing:
        mount, dot, _ = source.partition(".")
        if dot:
            exit_sources.setdefault(mount, []).append(source)
    seen = {start_at}
    queue = deque([start_at])
    while queue:
        current = queue.popleft()
        following = list(exit_sources.get(current, ()))
        edge = outgoing.get(current)
        if edge is not None:
            following.extend(edge.targets())
        for nxt in following:
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    for node_id in [*nodes, *includes]:
        if node_id not in seen:
            raise fail(
                node_id,
                f"is unreachable from start_at {start_at!r}; add an edge to it or remove it",
            )
