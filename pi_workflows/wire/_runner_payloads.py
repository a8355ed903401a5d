"""runner.v1 payload records: what a runner sends, field by field as the schema says.

Part of `wire/runner.py` (import from there). Every record refuses unknown fields and
keeps absent optional fields `UNSET`, so a record encodes back to the exact frame it
came from; `RUNNER_PAYLOADS` maps each message kind to its record.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Final, Literal, TypeAlias

from msgspec import UNSET, Meta, Struct, UnsetType

__all__ = [
    "MAX_UPLOAD_PARTS",
    "MAX_VALUE_CAP",
    "RUNNER_PAYLOADS",
    "UPLOAD_PART_BYTES",
    "ContentRead",
    "ContentRef",
    "ContentWrite",
    "Count",
    "Digest",
    "EffectReserve",
    "EffectSettle",
    "Id",
    "InteractionAccepted",
    "InteractionRejected",
    "InteractionRequested",
    "JsonObject",
    "LastNode",
    "MessageKind",
    "NodeFailed",
    "NodeFinished",
    "NodeStarted",
    "NodeUpdate",
    "NotificationRequested",
    "Outcome",
    "PositiveCount",
    "PresentationRequested",
    "ProcessRegister",
    "ProcessUnregister",
    "Record",
    "RunFinished",
    "RunParked",
    "RunnerError",
    "RunnerExiting",
    "RunnerPayload",
    "RunnerReady",
    "SafeError",
    "Schema",
    "TurnEnded",
    "UploadRef",
    "WholeError",
]

MAX_VALUE_CAP: Final = 1024 * 1024 * 1024
"""The wire's own ceiling: an `uploadRef` names at most this many bytes."""
UPLOAD_PART_BYTES: Final = 512 * 1024
"""Every `content.write` part but the last holds exactly this many bytes."""
MAX_UPLOAD_PARTS: Final = MAX_VALUE_CAP // UPLOAD_PART_BYTES

# --- field types (runner.v1 $defs) --------------------------------------------------------

_NO_CONTROL = r"^[^\x00-\x1f\x7f]+\Z"
Id: TypeAlias = Annotated[str, Meta(min_length=1, max_length=256, pattern=_NO_CONTROL)]
Count: TypeAlias = Annotated[int, Meta(ge=0, le=2**53 - 1)]
PositiveCount: TypeAlias = Annotated[int, Meta(ge=1, le=2**53 - 1)]
Digest: TypeAlias = Annotated[str, Meta(pattern=r"^sha256:[0-9a-f]{64}\Z")]
Code: TypeAlias = Annotated[
    str, Meta(min_length=1, max_length=64, pattern=r"^[a-z][A-Za-z0-9_.-]*\Z")
]
Detail: TypeAlias = Annotated[str, Meta(max_length=16384)]
NodePath: TypeAlias = Annotated[str, Meta(min_length=1, max_length=1024, pattern=_NO_CONTROL)]
Pid: TypeAlias = Annotated[int, Meta(ge=1, le=4294967295)]
JsonObject: TypeAlias = dict[str, Any]
"""A workflow value that must be a JSON object (its contents are never checked here)."""
NodeKind: TypeAlias = Literal[
    "compute",
    "action",
    "shell",
    "agent",
    "checkpoint",
    "notify",
    "humanDecision",
    "includeWorkflow",
]
Outcome: TypeAlias = Literal[
    "accepted", "adopted", "rejected", "conflict", "notFound", "claimLost", "unavailable"
]
MessageKind: TypeAlias = Literal[
    "runner.ready",
    "node.started",
    "node.update",
    "node.finished",
    "node.failed",
    "run.parked",
    "run.finished",
    "interaction.requested",
    "interaction.accepted",
    "interaction.rejected",
    "notification.requested",
    "presentation.requested",
    "effect.reserve",
    "effect.settle",
    "runner.progress",
    "runner.exiting",
    "content.read",
    "content.write",
]
Schema: TypeAlias = Literal["pi-workflows.worker-launch.v1"]


class Record(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    """A runner.v1 object: camelCase on the wire, unknown fields refused, absent optional
    fields `UNSET` (so a record encodes back to exactly the frame it came from)."""


def _one_of(record: Any, name: str, *, required: bool = True) -> None:
    """At most one of `name` and `name`Ref is set (exactly one when `required`)."""
    inline = getattr(record, name) is not UNSET
    ref = getattr(record, f"{name}_ref") is not UNSET
    if inline and ref:
        raise ValueError(f"{name} and {name}Ref are exclusive")
    if required and not (inline or ref):
        raise ValueError(f"missing required field {name!r} or {name + 'Ref'!r}")


# --- shared objects -------------------------------------------------------------------------


class SafeError(Record, frozen=True):
    """A bounded error the server sends: a code and a short message."""

    code: Code
    message: Annotated[str, Meta(min_length=1, max_length=2048)]


class RunnerError(Record, frozen=True):
    """A failure a runner reports. In a frame its message and traceback are bounded
    (16 KiB each); a larger error goes whole by reference (`errorRef`) and is read back
    into this record without those bounds (`whole`)."""

    code: Code
    message: Annotated[str, Meta(min_length=1, max_length=16384)]
    traceback: Annotated[str, Meta(max_length=16384)] | UnsetType = UNSET
    """A failed node's traceback (the workflow's frames), if the runner sent one."""
    retryable: bool | UnsetType = UNSET

    def text(self) -> str:
        """`code: message`, as stored in attempt and run rows."""
        return f"{self.code}: {self.message}"


class WholeError(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    """A `RunnerError` read back from an `errorRef`: bounded by the value cap only."""

    code: Code
    message: Annotated[str, Meta(min_length=1)]
    traceback: str | UnsetType = UNSET
    retryable: bool | UnsetType = UNSET


class ContentRef(Record, frozen=True):
    """Server to runner: a digest-bound value in the blob store, read in bounded parts."""

    media_type: Annotated[str, Meta(max_length=128, pattern=r"^[a-z]+/[A-Za-z0-9.+-]+\Z")]
    byte_count: Count
    digest: Digest


class UploadRef(Record, frozen=True, kw_only=True):
    """Runner to server: a value sent before as `content.write` parts, named by digest."""

    media_type: Literal["application/json"] = "application/json"
    byte_count: Annotated[int, Meta(ge=1, le=MAX_VALUE_CAP)]
    digest: Digest
    parts: Annotated[tuple[Digest, ...], Meta(min_length=1, max_length=MAX_UPLOAD_PARTS)]
    """The digests of the parts, in order."""


# --- runner to server: payloads -------------------------------------------------------------


class _Payload(Record, frozen=True):
    kind: ClassVar[str]
    needs_attempt: ClassVar[bool] = False
    """runner.v1 requires `attemptId` on the message (node.*, effect.*, interaction.*)."""
    referable: ClassVar[tuple[str, ...]] = ()
    """Fields that go by reference (`<field>Ref`) when too large for one frame."""


class RunnerReady(_Payload, frozen=True):
    kind: ClassVar[str] = "runner.ready"
    protocol_version: Literal[1]
    definition_digest: Digest


class NodeStarted(_Payload, frozen=True):
    kind: ClassVar[str] = "node.started"
    needs_attempt: ClassVar[bool] = True
    node_path: NodePath
    node_kind: NodeKind
    visit: PositiveCount
    timeout_ms: PositiveCount | UnsetType = UNSET


class NodeUpdate(_Payload, frozen=True):
    kind: ClassVar[str] = "node.update"
    needs_attempt: ClassVar[bool] = True
    node_path: NodePath
    update: JsonObject


class NodeFinished(_Payload, frozen=True):
    kind: ClassVar[str] = "node.finished"
    needs_attempt: ClassVar[bool] = True
    referable: ClassVar[tuple[str, ...]] = ("output",)
    node_path: NodePath
    output: Any | UnsetType = UNSET
    route: Annotated[str, Meta(min_length=1, max_length=1024)] | UnsetType = UNSET
    output_ref: UploadRef | UnsetType = UNSET
    """Set instead of `output` when the output is too large for one frame."""

    def __post_init__(self) -> None:
        _one_of(self, "output")


class NodeFailed(_Payload, frozen=True):
    kind: ClassVar[str] = "node.failed"
    needs_attempt: ClassVar[bool] = True
    referable: ClassVar[tuple[str, ...]] = ("error",)
    node_path: NodePath
    error: RunnerError | UnsetType = UNSET
    error_ref: UploadRef | UnsetType = UNSET
    """Set instead of `error` when the error is too large for one frame."""

    def __post_init__(self) -> None:
        _one_of(self, "error")


class RunParked(_Payload, frozen=True):
    kind: ClassVar[str] = "run.parked"
    reason: Code
    detail: Detail | UnsetType = UNSET
    wake_at: Count | UnsetType = UNSET


class LastNode(Record, frozen=True):
    """The pure node whose finish completes the run: committed with it in one unit.

    Its output is the run's output (the run ends with what its last node returned), so
    the value travels once."""

    attempt_id: Id
    node_path: NodePath


class RunFinished(_Payload, frozen=True):
    kind: ClassVar[str] = "run.finished"
    referable: ClassVar[tuple[str, ...]] = ("output", "error")
    status: Literal["completed", "failed", "timed_out", "cancelled"]
    output: Any | UnsetType = UNSET
    error: RunnerError | UnsetType = UNSET
    output_ref: UploadRef | UnsetType = UNSET
    error_ref: UploadRef | UnsetType = UNSET
    last_node: LastNode | UnsetType = UNSET
    """A completed run's last (pure) node, finished in the same unit as the run."""
    receipts: Count | UnsetType = UNSET
    """How many of this runner's messages before this one the server must have accepted
    (all it sent, content reads and writes aside). The server refuses the run's end if
    any was refused, so the runner sends it behind its posted messages without waiting
    for their answers."""

    def __post_init__(self) -> None:
        _one_of(self, "output", required=self.status == "completed")
        _one_of(self, "error", required=self.status in ("failed", "timed_out"))
        if self.status == "completed" and (self.error, self.error_ref) != (UNSET, UNSET):
            raise ValueError("a completed run has no error")
        if self.status != "completed" and self.last_node is not UNSET:
            raise ValueError("only a completed run names a last node")


class InteractionRequested(_Payload, frozen=True):
    kind: ClassVar[str] = "interaction.requested"
    needs_attempt: ClassVar[bool] = True
    referable: ClassVar[tuple[str, ...]] = ("request",)
    interaction_id: Id
    interaction_kind: Literal["agent", "checkpoint", "decision", "visibleResponse"]
    contract_hash: Digest
    request: JsonObject | UnsetType = UNSET
    """The step's contract; in an origin session also its `prompt`."""
    request_ref: UploadRef | UnsetType = UNSET
    target_session_id: Id | UnsetType = UNSET

    def __post_init__(self) -> None:
        _one_of(self, "request")


class InteractionAccepted(_Payload, frozen=True):
    kind: ClassVar[str] = "interaction.accepted"
    needs_attempt: ClassVar[bool] = True
    interaction_id: Id
    submission_id: Id
    value: Any | UnsetType = UNSET


class InteractionRejected(_Payload, frozen=True):
    kind: ClassVar[str] = "interaction.rejected"
    needs_attempt: ClassVar[bool] = True
    interaction_id: Id
    submission_id: Id
    error: SafeError


class NotificationRequested(_Payload, frozen=True):
    kind: ClassVar[str] = "notification.requested"
    referable: ClassVar[tuple[str, ...]] = ("content",)
    notification_id: Id
    content: JsonObject | UnsetType = UNSET
    content_ref: UploadRef | UnsetType = UNSET

    def __post_init__(self) -> None:
        _one_of(self, "content")


class PresentationRequested(_Payload, frozen=True):
    kind: ClassVar[str] = "presentation.requested"
    presentation_id: Id
    content: JsonObject


class EffectReserve(_Payload, frozen=True):
    kind: ClassVar[str] = "effect.reserve"
    needs_attempt: ClassVar[bool] = True
    referable: ClassVar[tuple[str, ...]] = ("request",)
    effect_type: Annotated[
        str, Meta(min_length=1, max_length=128, pattern=r"^[a-z][A-Za-z0-9_.:-]*\Z")
    ]
    idempotency_key: Id
    request: Any | UnsetType = UNSET
    request_ref: UploadRef | UnsetType = UNSET
    idempotent: bool | UnsetType = UNSET
    """The external system deduplicates by the key: an interrupted apply may repeat."""

    def __post_init__(self) -> None:
        _one_of(self, "request")


class EffectSettle(_Payload, frozen=True):
    kind: ClassVar[str] = "effect.settle"
    needs_attempt: ClassVar[bool] = True
    referable: ClassVar[tuple[str, ...]] = ("result", "error")
    idempotency_key: Id
    outcome: Literal["succeeded", "failed", "ambiguous"]
    result: Any | UnsetType = UNSET
    error: RunnerError | UnsetType = UNSET
    read_back: Literal["applied", "notApplied"] | UnsetType = UNSET
    """Set when a read-back of an uncertain earlier attempt decided this settlement."""
    result_ref: UploadRef | UnsetType = UNSET
    error_ref: UploadRef | UnsetType = UNSET

    def __post_init__(self) -> None:
        _one_of(self, "result", required=self.outcome == "succeeded")
        _one_of(self, "error", required=self.outcome == "failed")
        if self.outcome == "succeeded" and (self.error, self.error_ref) != (UNSET, UNSET):
            raise ValueError("a succeeded effect has no error")


class _ProcessProgress(_Payload, frozen=True, tag_field="operation"):
    kind: ClassVar[str] = "runner.progress"
    pid: Pid
    start_identity: Id
    """The process start identity that, with the PID, names exactly one process."""
    process_group_id: Pid | UnsetType = UNSET


class ProcessRegister(_ProcessProgress, frozen=True, tag="process.register"):
    """A process group the runner started (a shell command, pi): stopped with the run."""


class ProcessUnregister(_ProcessProgress, frozen=True, tag="process.unregister"):
    """A registered group that ended."""


class TurnEnded(_Payload, frozen=True, tag_field="operation", tag="interaction.turnEnded"):
    """An agent step's pi run ended (`agent_end`) and its workflow tool reported no
    accepted submission. The server counts it under the live claim (the unproductive-turn
    rule) and answers `remind` or `fail` (or `accepted` when the request settled)."""

    kind: ClassVar[str] = "runner.progress"
    interaction_id: Id
    stop_reason: Literal["stop", "toolUse", "length", "error", "aborted", "unknown"]
    error: Annotated[str, Meta(max_length=2048)] | UnsetType = UNSET
    """For `error`: the provider's message, bounded (kept for the run view)."""


class RunnerExiting(_Payload, frozen=True):
    kind: ClassVar[str] = "runner.exiting"
    reason: Code
    exit_code: Annotated[int, Meta(ge=0, le=255)] | UnsetType = UNSET
    detail: Detail | UnsetType = UNSET


class ContentRead(_Payload, frozen=True):
    """Read one bounded part of a value the server sent by reference; changes nothing."""

    kind: ClassVar[str] = "content.read"
    digest: Digest
    offset: Count
    length: Annotated[int, Meta(ge=1, le=UPLOAD_PART_BYTES)]


class ContentWrite(_Payload, frozen=True):
    """Store one part of a value too large for one frame; changes no run state."""

    kind: ClassVar[str] = "content.write"
    data: Annotated[str, Meta(min_length=4, max_length=699052, pattern=r"^[A-Za-z0-9+/]*={0,2}\Z")]
    """One part, at most 512 KiB, in base64."""

    def __repr__(self) -> str:
        return f"ContentWrite(<{len(self.data)} base64 characters>)"


RunnerPayload: TypeAlias = (
    RunnerReady
    | NodeStarted
    | NodeUpdate
    | NodeFinished
    | NodeFailed
    | RunParked
    | RunFinished
    | InteractionRequested
    | InteractionAccepted
    | InteractionRejected
    | NotificationRequested
    | PresentationRequested
    | EffectReserve
    | EffectSettle
    | ProcessRegister
    | ProcessUnregister
    | TurnEnded
    | RunnerExiting
    | ContentRead
    | ContentWrite
)

RUNNER_PAYLOADS: Final[Mapping[str, Any]] = {
    **{
        cls.kind: cls
        for cls in (
            RunnerReady,
            NodeStarted,
            NodeUpdate,
            NodeFinished,
            NodeFailed,
            RunParked,
            RunFinished,
            InteractionRequested,
            InteractionAccepted,
            InteractionRejected,
            NotificationRequested,
            PresentationRequested,
            EffectReserve,
            EffectSettle,
            RunnerExiting,
            ContentRead,
            ContentWrite,
        )
    },
    "runner.progress": ProcessRegister | ProcessUnregister | TurnEnded,
}
"""The one codec table: runner message kind → its payload record (a tagged union on
`operation` for `runner.progress`)."""
