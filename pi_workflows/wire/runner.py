"""Typed runner-channel records: what a runner proposes and what the server answers.

Implements workflow-server.md § Runner protocol. A frame is checked against
`runner.v1` where it is read (the listener's loop for the server, the runner's channel
for the runner), then becomes one of these frozen records; handlers never index into
raw dicts. `RUNNER_PAYLOADS` is the one codec table from message kind to payload type.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, TypeAlias

from pi_workflows.wire.protocol import LAUNCH_SCHEMA, runner_message_from_wire

__all__ = [
    "MAX_UPLOAD_BYTES",
    "RUNNER_PAYLOADS",
    "ContentRead",
    "ContentWrite",
    "EffectReserve",
    "EffectSettle",
    "InteractionRequested",
    "NodeFailed",
    "NodeFinished",
    "NodeStarted",
    "NotificationRequested",
    "RunFinished",
    "RunParked",
    "RunnerCommand",
    "RunnerError",
    "RunnerExiting",
    "RunnerMessage",
    "RunnerPayload",
    "RunnerProgress",
    "RunnerReady",
    "RunnerReply",
    "TurnEnded",
    "UploadRef",
]

MAX_UPLOAD_BYTES: Final = 32 * 1024 * 1024
"""The largest value a runner sends by reference (in `content.write` parts): a result
or output too large for one frame, for example a shell command's escaped output."""


@dataclass(frozen=True, slots=True)
class RunnerError:
    """A bounded error a runner reports: a code and a message."""

    code: str
    message: str
    traceback: str | None = None
    """A failed node's bounded traceback, if the runner sent one."""

    @classmethod
    def from_wire(cls, value: Mapping[str, Any]) -> RunnerError:
        tb = value.get("traceback")
        return cls(str(value["code"]), str(value["message"]), None if tb is None else str(tb))

    def text(self, limit: int = 4000) -> str:
        """`code: message`, bounded, as stored in attempt and run rows."""
        return f"{self.code}: {self.message}"[:limit]


@dataclass(frozen=True, slots=True)
class UploadRef:
    """A value a runner sent before as `content.write` parts, named by its digest."""

    media_type: str
    byte_count: int
    digest: str
    parts: tuple[str, ...]
    """The digests of the parts, in order."""

    @classmethod
    def from_wire(cls, value: Mapping[str, Any] | None) -> UploadRef | None:
        if value is None:
            return None
        return cls(
            str(value["mediaType"]),
            int(value["byteCount"]),
            str(value["digest"]),
            tuple(str(part) for part in value["parts"]),
        )


@dataclass(frozen=True, slots=True)
class RunnerReady:
    kind: ClassVar[str] = "runner.ready"
    protocol_version: int
    definition_digest: str

    @classmethod
    def from_wire(cls, p: Mapping[str, Any]) -> RunnerReady:
        return cls(int(p["protocolVersion"]), str(p["definitionDigest"]))


@dataclass(frozen=True, slots=True)
class NodeStarted:
    kind: ClassVar[str] = "node.started"
    node_path: str
    node_kind: str
    visit: int
    timeout_ms: int | None

    @classmethod
    def from_wire(cls, p: Mapping[str, Any]) -> NodeStarted:
        timeout = p.get("timeoutMs")
        return cls(str(p["nodePath"]), str(p["nodeKind"]), int(p["visit"]), timeout)


@dataclass(frozen=True, slots=True)
class NodeFinished:
    kind: ClassVar[str] = "node.finished"
    node_path: str
    output: Any
    route: str | None
    output_ref: UploadRef | None = None
    """Set instead of `output` when the output was too large for one frame."""

    @classmethod
    def from_wire(cls, p: Mapping[str, Any]) -> NodeFinished:
        return cls(
            str(p["nodePath"]),
            p.get("output"),
            p.get("route"),
            UploadRef.from_wire(p.get("outputRef")),
        )


@dataclass(frozen=True, slots=True)
class NodeFailed:
    kind: ClassVar[str] = "node.failed"
    node_path: str
    error: RunnerError

    @classmethod
    def from_wire(cls, p: Mapping[str, Any]) -> NodeFailed:
        return cls(str(p["nodePath"]), RunnerError.from_wire(p["error"]))


@dataclass(frozen=True, slots=True)
class RunParked:
    kind: ClassVar[str] = "run.parked"
    reason: str
    detail: str | None

    @classmethod
    def from_wire(cls, p: Mapping[str, Any]) -> RunParked:
        return cls(str(p["reason"]), p.get("detail"))


@dataclass(frozen=True, slots=True)
class RunFinished:
    kind: ClassVar[str] = "run.finished"
    status: str
    output: Any
    error: RunnerError | None
    output_ref: UploadRef | None = None
    """Set instead of `output` when the output was too large for one frame."""

    @classmethod
    def from_wire(cls, p: Mapping[str, Any]) -> RunFinished:
        error = p.get("error")
        return cls(
            str(p["status"]),
            p.get("output"),
            RunnerError.from_wire(error) if error else None,
            UploadRef.from_wire(p.get("outputRef")),
        )


@dataclass(frozen=True, slots=True)
class NotificationRequested:
    kind: ClassVar[str] = "notification.requested"
    notification_id: str
    content: Mapping[str, Any]

    @classmethod
    def from_wire(cls, p: Mapping[str, Any]) -> NotificationRequested:
        return cls(str(p["notificationId"]), p["content"])


@dataclass(frozen=True, slots=True)
class InteractionRequested:
    kind: ClassVar[str] = "interaction.requested"
    interaction_id: str
    interaction_kind: str
    contract_hash: str
    request: Mapping[str, Any]
    target_session_id: str | None = None

    @classmethod
    def from_wire(cls, p: Mapping[str, Any]) -> InteractionRequested:
        return cls(
            str(p["interactionId"]),
            str(p["interactionKind"]),
            str(p["contractHash"]),
            p["request"],
            p.get("targetSessionId"),
        )


@dataclass(frozen=True, slots=True)
class EffectReserve:
    kind: ClassVar[str] = "effect.reserve"
    effect_type: str
    idempotency_key: str
    request: Any
    idempotent: bool = False
    """The external system deduplicates by the key: an interrupted apply may repeat."""

    @classmethod
    def from_wire(cls, p: Mapping[str, Any]) -> EffectReserve:
        return cls(
            str(p["effectType"]),
            str(p["idempotencyKey"]),
            p["request"],
            bool(p.get("idempotent", False)),
        )


@dataclass(frozen=True, slots=True)
class EffectSettle:
    kind: ClassVar[str] = "effect.settle"
    idempotency_key: str
    outcome: str
    """`succeeded`, `failed` or `ambiguous`."""
    result: Any
    error: RunnerError | None
    read_back: str | None
    """`applied` or `notApplied` when a read-back decided this settlement."""
    result_ref: UploadRef | None = None
    """Set instead of `result` when the result was too large for one frame."""

    @classmethod
    def from_wire(cls, p: Mapping[str, Any]) -> EffectSettle:
        error = p.get("error")
        return cls(
            str(p["idempotencyKey"]),
            str(p["outcome"]),
            p.get("result"),
            RunnerError.from_wire(error) if error else None,
            p.get("readBack"),
            UploadRef.from_wire(p.get("resultRef")),
        )


@dataclass(frozen=True, slots=True)
class RunnerProgress:
    kind: ClassVar[str] = "runner.progress"
    operation: str
    """`process.register` or `process.unregister`."""
    pid: int
    start_identity: str

    @classmethod
    def from_wire(cls, p: Mapping[str, Any]) -> RunnerProgress | TurnEnded:
        if p["operation"] == TurnEnded.operation:
            return TurnEnded.from_wire(p)
        return cls(str(p["operation"]), int(p["pid"]), str(p["startIdentity"]))


@dataclass(frozen=True, slots=True)
class TurnEnded:
    """`runner.progress` operation `interaction.turnEnded`: an agent step's pi run ended
    (`agent_end`) and its workflow tool reported no accepted submission. The server counts
    it under the live claim (workflow-server.md, the unproductive-turn rule) and answers
    `remind` or `fail` (or `accepted` when the request is settled after all)."""

    kind: ClassVar[str] = "runner.progress"
    operation: ClassVar[str] = "interaction.turnEnded"
    interaction_id: str
    stop_reason: str
    """pi's last `stopReason`: stop, toolUse, length, error, aborted (unknown: none)."""
    error: str | None = field(default=None, repr=False)
    """For `error`: the provider's message, bounded (kept for the run view)."""

    @classmethod
    def from_wire(cls, p: Mapping[str, Any]) -> TurnEnded:
        error = p.get("error")
        return cls(
            str(p["interactionId"]), str(p["stopReason"]), None if error is None else str(error)
        )


@dataclass(frozen=True, slots=True)
class RunnerExiting:
    kind: ClassVar[str] = "runner.exiting"
    reason: str

    @classmethod
    def from_wire(cls, p: Mapping[str, Any]) -> RunnerExiting:
        return cls(str(p["reason"]))


@dataclass(frozen=True, slots=True)
class ContentRead:
    kind: ClassVar[str] = "content.read"
    digest: str
    offset: int
    length: int

    @classmethod
    def from_wire(cls, p: Mapping[str, Any]) -> ContentRead:
        return cls(str(p["digest"]), int(p["offset"]), int(p["length"]))


@dataclass(frozen=True, slots=True)
class ContentWrite:
    kind: ClassVar[str] = "content.write"
    data: str = field(repr=False)
    """One part, at most 512 KiB, in base64 (checked by the schema)."""

    @classmethod
    def from_wire(cls, p: Mapping[str, Any]) -> ContentWrite:
        return cls(str(p["data"]))


RunnerPayload: TypeAlias = (
    RunnerReady
    | NodeStarted
    | NodeFinished
    | NodeFailed
    | RunParked
    | RunFinished
    | NotificationRequested
    | InteractionRequested
    | EffectReserve
    | EffectSettle
    | RunnerProgress
    | TurnEnded
    | RunnerExiting
    | ContentRead
    | ContentWrite
)

RUNNER_PAYLOADS: Final[dict[str, Any]] = {
    cls.kind: cls
    for cls in (
        RunnerReady,
        NodeStarted,
        NodeFinished,
        NodeFailed,
        RunParked,
        RunFinished,
        NotificationRequested,
        InteractionRequested,
        EffectReserve,
        EffectSettle,
        RunnerProgress,
        RunnerExiting,
        ContentRead,
        ContentWrite,
    )
}
"""The one codec table: runner message kind → its typed payload. A kind the schema
allows but the server does not handle yet (`node.update`, `interaction.accepted`/`rejected`,
`presentation.requested`) has no entry and is answered `rejected`."""


@dataclass(frozen=True, slots=True)
class RunnerMessage:
    """One runner-to-server message, checked against `runner.v1`."""

    kind: str
    run_id: str
    generation: int
    runner_epoch: str
    message_id: str
    expected_revision: int
    attempt_id: str | None
    body: RunnerPayload | None
    """The typed payload; None for a kind with no entry in `RUNNER_PAYLOADS`."""
    wire: Mapping[str, Any]
    """The message as it came: its canonical digest binds the stored reply."""

    @classmethod
    def from_wire(cls, value: object) -> RunnerMessage:
        """Check and type one decoded frame from a runner.

        Raises:
            ProtocolViolation: not a runner message of `runner.v1`.
        """
        message = runner_message_from_wire(value, sender="runner")
        payload_type = RUNNER_PAYLOADS.get(message["kind"])
        return cls(
            kind=message["kind"],
            run_id=message["runId"],
            generation=message["generation"],
            runner_epoch=message["runnerEpoch"],
            message_id=message["messageId"],
            expected_revision=message["expectedRevision"],
            attempt_id=message.get("attemptId"),
            body=payload_type.from_wire(message["payload"]) if payload_type else None,
            wire=message,
        )

    def to_wire(self) -> Mapping[str, Any]:
        return self.wire


@dataclass(frozen=True, slots=True)
class RunnerReply:
    """Server to runner: the answer to one message (`replyTo`)."""

    run_id: str
    generation: int
    runner_epoch: str
    reply_to: str
    outcome: str
    revision: int | None = None
    result: Any = None
    error: tuple[str, str] | None = None

    def to_wire(self) -> dict[str, Any]:
        reply: dict[str, Any] = {
            "schema": LAUNCH_SCHEMA,
            "kind": "reply",
            "runId": self.run_id,
            "generation": self.generation,
            "runnerEpoch": self.runner_epoch,
            "replyTo": self.reply_to,
            "outcome": self.outcome,
        }
        if self.revision is not None:
            reply["revision"] = self.revision
        if self.result is not None:
            reply["result"] = self.result
        if self.error is not None:
            reply["error"] = {"code": self.error[0], "message": self.error[1][:1000]}
        return reply


@dataclass(frozen=True, slots=True)
class RunnerCommand:
    """Server to runner: the one explicit command after `runner.ready`."""

    run_id: str
    generation: int
    runner_epoch: str
    expected_revision: int
    command: str
    state: Mapping[str, Any]
    parent_attempt_id: str | None = None

    def to_wire(self) -> dict[str, Any]:
        payload: dict[str, Any] = {"state": self.state}
        if self.parent_attempt_id is not None:
            payload["parentAttemptId"] = self.parent_attempt_id
        return {
            "schema": LAUNCH_SCHEMA,
            "kind": "command",
            "runId": self.run_id,
            "generation": self.generation,
            "runnerEpoch": self.runner_epoch,
            "expectedRevision": self.expected_revision,
            "messageId": f"command-{self.runner_epoch}",
            "command": self.command,
            "payload": payload,
        }
