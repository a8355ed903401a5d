"""Typed runner-channel records: what a runner proposes and what the server answers.

Implements workflow-server.md § Runner protocol. Both ends build and read these msgspec
records, and check a frame once, where it is read, by converting it into its record;
`runner.v1.schema.json` is the same contract (tests run the fixtures through both)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Final, Literal, TypeAlias, TypeVar

import msgspec
from msgspec import UNSET, Struct, UnsetType

from pi_workflows.wire._records import checked
from pi_workflows.wire._runner_payloads import (
    MAX_VALUE_CAP,
    RUNNER_PAYLOADS,
    UPLOAD_PART_BYTES,
    ContentRead,
    ContentRef,
    ContentWrite,
    Count,
    EffectReserve,
    EffectSettle,
    Id,
    InteractionAccepted,
    InteractionRejected,
    InteractionRequested,
    JsonObject,
    LastNode,
    MessageKind,
    NodeFailed,
    NodeFinished,
    NodeStarted,
    NodeUpdate,
    NotificationRequested,
    Outcome,
    PresentationRequested,
    ProcessRegister,
    ProcessUnregister,
    Record,
    RunFinished,
    RunnerError,
    RunnerExiting,
    RunnerPayload,
    RunnerReady,
    RunParked,
    SafeError,
    Schema,
    TurnEnded,
    UploadRef,
    WholeError,
)
from pi_workflows.wire._runner_results import (
    ContentPart,
    ContentWritten,
    EffectReservation,
    EffectSettled,
    EffectSummary,
    InteractionAnswer,
    StartedVisit,
    TurnVerdict,
    result_value,
)
from pi_workflows.wire.canonical import dumps
from pi_workflows.wire.framing import MAX_FRAME_BYTES
from pi_workflows.wire.protocol import LAUNCH_SCHEMA

__all__ = [
    "DEFAULT_MAX_VALUE_BYTES",
    "INLINE_ERROR_BYTES",
    "INLINE_VALUE_BYTES",
    "MAX_VALUE_CAP",
    "MAX_VALUE_ENV",
    "MIN_VALUE_CAP",
    "PIPELINED_KINDS",
    "RUNNER_PAYLOADS",
    "UNSET",
    "UPLOAD_PART_BYTES",
    "ContentPart",
    "ContentRead",
    "ContentRef",
    "ContentWrite",
    "ContentWritten",
    "EffectReservation",
    "EffectReserve",
    "EffectSettle",
    "EffectSettled",
    "EffectSummary",
    "FinishedStep",
    "InteractionAccepted",
    "InteractionAnswer",
    "InteractionRejected",
    "InteractionRequested",
    "JsonObject",
    "LastNode",
    "NodeFailed",
    "NodeFinished",
    "NodeStarted",
    "NodeUpdate",
    "NotificationRequested",
    "PresentationRequested",
    "ProcessRegister",
    "ProcessUnregister",
    "RunFinished",
    "RunParked",
    "RunState",
    "RunnerAddress",
    "RunnerCommand",
    "RunnerError",
    "RunnerExiting",
    "RunnerMessage",
    "RunnerPayload",
    "RunnerReady",
    "RunnerReply",
    "SafeError",
    "ServerFrame",
    "StartedVisit",
    "TurnEnded",
    "TurnVerdict",
    "UnfinishedStep",
    "UnsetType",
    "UploadRef",
    "decode_server_frame",
    "max_value_bytes",
    "result_as",
    "whole_error",
]

# --- the largest value ---------------------------------------------------------------------

MAX_VALUE_ENV: Final = "PI_WORKFLOWS_MAX_VALUE_BYTES"
"""The environment variable that sets the largest value (canonical JSON bytes) a runner
may send: a node output or error, a run output, an effect request or result, a prompt."""
DEFAULT_MAX_VALUE_BYTES: Final = 64 * 1024 * 1024
MIN_VALUE_CAP: Final = 64 * 1024
INLINE_VALUE_BYTES: Final = MAX_FRAME_BYTES - 64 * 1024
"""The largest value (canonical JSON) sent inside a frame; a larger one goes by reference."""
INLINE_ERROR_BYTES: Final = 16 * 1024
"""The largest error (its JSON) sent inside a frame, the runner.v1 bound of `message`
and `traceback`; a larger one goes whole by reference."""


PIPELINED_KINDS: Final = frozenset({"compute"})
"""Node kinds whose start and finish the runner sends without waiting: pure work that may
run again. Every other kind (effects, waits, notifications) waits for each answer. The
server refuses a pipelined start whose visit is not the one the runner assumed."""


def max_value_bytes(environ: Mapping[str, str] | None = None) -> int:
    """The largest value a runner may send, from `PI_WORKFLOWS_MAX_VALUE_BYTES`.

    Unset or empty: 64 MiB. The server checks it at start, and a runner reads the same
    variable (the server's environment is its environment).

    Raises:
        ValueError: not a whole number of bytes from 64 KiB to 1 GiB; names the variable.
    """
    raw = (os.environ if environ is None else environ).get(MAX_VALUE_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_VALUE_BYTES
    value = int(raw) if raw.isdecimal() and raw.isascii() else -1
    if not MIN_VALUE_CAP <= value <= MAX_VALUE_CAP:
        raise ValueError(
            f"{MAX_VALUE_ENV} must be a whole number of bytes from {MIN_VALUE_CAP} to "
            f"{MAX_VALUE_CAP}, got {raw[:40]!r}"
        )
    return value


# --- runner to server: the message ---------------------------------------------------------


class RunnerAddress(Struct, frozen=True):
    """Who sends: the run, its generation and the runner epoch (from the launch)."""

    run_id: str
    generation: int
    runner_epoch: str


class _Envelope(Record, frozen=True):
    schema: Schema
    kind: MessageKind
    run_id: Id
    generation: Count
    runner_epoch: Id
    expected_revision: Count
    message_id: Id
    payload: Any
    attempt_id: Id | UnsetType = UNSET


class RunnerMessage(Struct, frozen=True, kw_only=True):
    """One runner-to-server message: the envelope's fields and its typed payload."""

    run_id: str
    generation: int
    runner_epoch: str
    message_id: str
    expected_revision: int
    body: RunnerPayload
    attempt_id: str | None = None

    @property
    def kind(self) -> str:
        return self.body.kind

    @classmethod
    def from_wire(cls, value: object) -> RunnerMessage:
        """Check and type one decoded frame from a runner (once, where it is read).

        Raises:
            ProtocolViolation: not a runner message of `runner.v1`.
        """
        envelope: _Envelope = checked(value, _Envelope)
        payload_type = RUNNER_PAYLOADS[envelope.kind]
        body: RunnerPayload = checked(envelope.payload, payload_type, at="/payload")
        if body.needs_attempt and envelope.attempt_id is UNSET:
            checked({}, _AttemptRequired)  # the one wording of a missing field
        return cls(
            run_id=envelope.run_id,
            generation=envelope.generation,
            runner_epoch=envelope.runner_epoch,
            message_id=envelope.message_id,
            expected_revision=envelope.expected_revision,
            body=body,
            attempt_id=None if envelope.attempt_id is UNSET else envelope.attempt_id,
        )

    def to_wire(self) -> dict[str, Any]:
        """The message as a JSON object (its canonical bytes are the frame)."""
        wire = {
            "schema": LAUNCH_SCHEMA,
            "kind": self.kind,
            "runId": self.run_id,
            "generation": self.generation,
            "runnerEpoch": self.runner_epoch,
            "expectedRevision": self.expected_revision,
            "messageId": self.message_id,
            "payload": msgspec.to_builtins(self.body),
        }
        if self.attempt_id is not None:
            wire["attemptId"] = self.attempt_id
        return wire

    def encode(self) -> bytes:
        """The frame body: canonical JSON, without its newline."""
        return dumps(self.to_wire())


class _AttemptRequired(Record, frozen=True):
    attempt_id: Id


# --- server to runner ------------------------------------------------------------------------


class FinishedStep(Struct, frozen=True, kw_only=True, rename="camel"):
    """One finished visit of a node, in execution order."""

    attempt_id: str
    node_path: str
    visit: int
    status: str
    """`completed`, `failed` or `timed_out`."""
    next_node_path: str | None = None
    error: str | None = None
    """A failed or timed-out attempt's error, bounded: the run's reason names it when
    the server ended the attempt and no route follows."""


class UnfinishedStep(Struct, frozen=True, kw_only=True, rename="camel"):
    """The run's running or waiting attempt: a waiting one continues in place."""

    attempt_id: str
    node_path: str
    visit: int
    status: str
    node_type: str | None = None


class RunState(Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """The durable state a runner continues from (a command's `payload.state`)."""

    run_id: str | None = None
    revision: int | None = None
    input: Any = None
    outputs: dict[str, Any] = msgspec.field(default_factory=dict)
    """Per node path, the output of its last completed attempt."""
    visits: dict[str, int] = msgspec.field(default_factory=dict)
    finished: list[FinishedStep] = msgspec.field(default_factory=list)
    unfinished: UnfinishedStep | None = None
    origin_session_id: str | None = None
    """The Pi session an interactive run is bound to: its agent steps run there."""


class _CommandPayload(Record, frozen=True):
    state: JsonObject | UnsetType = UNSET
    """The durable run state the runner continues from (a `RunState`)."""
    state_ref: ContentRef | UnsetType = UNSET
    parent_attempt_id: Id | UnsetType = UNSET

    def __post_init__(self) -> None:
        if self.state is not UNSET and self.state_ref is not UNSET:
            raise ValueError("state and stateRef are exclusive")


class RunnerCommand(Record, frozen=True, kw_only=True, tag_field="kind", tag="command"):
    """Server to runner: the one explicit command after `runner.ready`."""

    schema: Schema = LAUNCH_SCHEMA
    run_id: Id
    generation: Count
    runner_epoch: Id
    expected_revision: Count
    message_id: Id
    command: Literal["start", "resume", "continue", "restart"]
    payload: _CommandPayload = msgspec.field(default_factory=_CommandPayload)

    def __post_init__(self) -> None:
        named = self.payload.parent_attempt_id is not UNSET
        if named != (self.command == "continue"):
            raise ValueError("a continue command, and only it, names its parentAttemptId")

    @classmethod
    def build(
        cls,
        address: RunnerAddress,
        revision: int,
        command: Literal["start", "resume", "continue", "restart"],
        state: RunState,
        parent_attempt_id: str | None = None,
    ) -> RunnerCommand:
        payload = _CommandPayload(
            state=msgspec.to_builtins(state),
            parent_attempt_id=UNSET if parent_attempt_id is None else parent_attempt_id,
        )
        return cls(
            run_id=address.run_id,
            generation=address.generation,
            runner_epoch=address.runner_epoch,
            expected_revision=revision,
            message_id=f"command-{address.runner_epoch}",
            command=command,
            payload=payload,
        )

    def with_state_ref(self, ref: ContentRef) -> RunnerCommand:
        """The command with its state named by reference (too large for one frame)."""
        payload = msgspec.structs.replace(self.payload, state=UNSET, state_ref=ref)
        return msgspec.structs.replace(self, payload=payload)

    def run_state(self, state: object | None = None) -> RunState:
        """The command's state as a record (`state`: one read by reference instead).

        Raises:
            ProtocolViolation: the state is not a run state.
        """
        value = self.payload.state if state is None else state
        found = {} if value is UNSET else value
        run_state: RunState = checked(found, RunState, at="/payload/state")
        return run_state

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = msgspec.to_builtins(self)
        return wire


class RunnerReply(Record, frozen=True, kw_only=True, tag_field="kind", tag="reply"):
    """Server to runner: the answer to one message (`replyTo`)."""

    schema: Schema = LAUNCH_SCHEMA
    run_id: Id
    generation: Count
    runner_epoch: Id
    reply_to: Id
    outcome: Outcome
    revision: Count | UnsetType = UNSET
    result: Any | UnsetType = UNSET
    result_ref: ContentRef | UnsetType = UNSET
    """Set instead of `result` when the reply would not fit one frame."""
    error: SafeError | UnsetType = UNSET

    def __post_init__(self) -> None:
        if self.result is not UNSET and self.result_ref is not UNSET:
            raise ValueError("result and resultRef are exclusive")
        if self.outcome in ("accepted", "adopted") and self.error is not UNSET:
            raise ValueError("an accepted reply has no error")

    @classmethod
    def to(
        cls,
        message: RunnerMessage,
        outcome: Outcome,
        *,
        revision: int | None = None,
        result: Any = None,
        error: tuple[str, str] | None = None,
    ) -> RunnerReply:
        """The reply to `message` (a None result or revision is left out)."""
        return cls.build(
            RunnerAddress(message.run_id, message.generation, message.runner_epoch),
            message.message_id,
            outcome,
            revision=revision,
            result=result,
            error=error,
        )

    @classmethod
    def build(
        cls,
        address: RunnerAddress,
        reply_to: str,
        outcome: Outcome,
        *,
        revision: int | None = None,
        result: Any = None,
        error: tuple[str, str] | None = None,
    ) -> RunnerReply:
        return cls(
            run_id=address.run_id,
            generation=address.generation,
            runner_epoch=address.runner_epoch,
            reply_to=reply_to,
            outcome=outcome,
            revision=UNSET if revision is None else revision,
            result=UNSET if result is None else result,
            error=UNSET if error is None else SafeError(code=error[0], message=error[1][:1000]),
        )

    @property
    def ok(self) -> bool:
        return self.outcome in ("accepted", "adopted")

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = msgspec.to_builtins(self)
        return wire


ServerFrame: TypeAlias = RunnerCommand | RunnerReply


def decode_server_frame(value: object) -> ServerFrame:
    """Check and type one decoded frame from the server (in the runner's channel).

    Raises:
        ProtocolViolation: not a command or reply of `runner.v1`.
    """
    frame: ServerFrame = checked(value, ServerFrame)
    return frame


def whole_error(value: object) -> RunnerError:
    """An error read back from an `errorRef`: only the value cap bounds it.

    Raises:
        ProtocolViolation: the value is not a runner error.
    """
    whole: WholeError = checked(value, WholeError, at="/errorRef")
    # Built directly: a record's bounds are checked when it is decoded, not when it is
    # made, so this one holds the whole text the reference carried.
    return RunnerError(
        code=whole.code, message=whole.message, traceback=whole.traceback, retryable=whole.retryable
    )


_T = TypeVar("_T")


def result_as(reply: RunnerReply, result_type: type[_T]) -> _T:
    """The accepted reply's result as its record (see `_runner_results`).

    Raises:
        ProtocolViolation: the result is not one.
    """
    return result_value(reply.result, result_type)
