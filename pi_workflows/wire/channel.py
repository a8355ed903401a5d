"""Typed records of `channel.v1`, the private server <-> Telegram adapter child protocol.

Implements workflow-server.md § Supervised channel adapters. The contract is the schema
`wire/schemas/channel.v1.schema.json` (checked by `pi_workflows.wire.protocol`, whose
per-kind branches compile with fastjsonschema); these TypedDicts name its shapes, and
`ChannelStamp`/`ChannelSequenceCheck` carry the envelope rules both ends share.

Directions. The server sends `channel.present` (a presentation to send) and
`channel.settle` (messages to edit to show the outcome), each for one recorded effect
attempt. The adapter answers each with the same kind carrying a `result`, and sends
`channel.ready`, `channel.answer` and `channel.exiting` on its own.

Every message carries the adapter epoch, the profile and a sequence that increases by
one per message in each direction per adapter epoch; present and settle carry the
attempt ID and the expected channel revision. The receiver refuses a message whose
epoch or profile is not its own or whose sequence does not follow (`ChannelSequenceCheck`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal, NotRequired, TypeAlias, TypedDict, cast

from pi_workflows.wire.protocol import (
    CHANNEL_SCHEMA,
    ProtocolViolation,
    channel_message_from_wire,
    decode_channel_message,
    encode_channel_message,
)

__all__ = [
    "CHANNEL_SCHEMA",
    "MAX_CALLBACK_DATA_BYTES",
    "MAX_TEXT_CHARS",
    "AdapterMessage",
    "Answer",
    "AttemptResult",
    "Button",
    "CallbackAnswer",
    "ChannelAnswer",
    "ChannelExiting",
    "ChannelReady",
    "ChannelSequenceCheck",
    "ChannelStamp",
    "PresentCommand",
    "PresentResult",
    "Presentation",
    "ReplyAnswer",
    "ResultApplied",
    "ResultFailed",
    "ResultNotSent",
    "ResultRejected",
    "ServerMessage",
    "SettleCommand",
    "SettleResult",
    "check_message",
    "decode_from_adapter",
    "decode_from_server",
    "encode_from_adapter",
    "encode_from_server",
    "event_id",
]

MAX_CALLBACK_DATA_BYTES: Final = 64
"""Telegram's limit on inline-button callback data; the schema allows printable ASCII."""

MAX_TEXT_CHARS: Final = 4096
"""Telegram's limit on one message's text."""


class _Envelope(TypedDict):
    schema: Literal["pi-workflows.channel.v1"]
    adapterEpoch: str
    profile: str
    sequence: int


class Button(TypedDict):
    """One inline button (one per row); `callbackData` is opaque and server-made."""

    label: str
    callbackData: str


class Presentation(TypedDict):
    """The complete operator presentation, plain text; the child adds nothing to it."""

    text: str
    buttons: list[Button]


class ResultApplied(TypedDict):
    """The Bot API did it; `messageIds` are the sent (or edited) messages."""

    status: Literal["applied"]
    messageIds: list[int]


class ResultRejected(TypedDict):
    """The Bot API answered a known 4xx error: nothing was sent or edited."""

    status: Literal["rejected"]
    httpStatus: int
    description: str


class ResultNotSent(TypedDict):
    """Nothing was sent: the request never reached the Bot API (no byte of it written),
    or the API answered 429 or 5xx. The server tries again itself (after `retryAfterMs`
    for a 429)."""

    status: Literal["notSent"]
    reason: str
    retryAfterMs: NotRequired[int]


class ResultFailed(TypedDict):
    """The request may have reached the Bot API (a timeout or a dropped connection after
    it was written): the outcome is unknown."""

    status: Literal["failed"]
    reason: str


AttemptResult: TypeAlias = ResultApplied | ResultRejected | ResultNotSent | ResultFailed


class ChannelReady(_Envelope):
    """Adapter -> server: `getMe` succeeded."""

    kind: Literal["channel.ready"]
    botUsername: NotRequired[str]


class PresentCommand(_Envelope):
    """Server -> adapter: send this presentation to the profile's chat."""

    kind: Literal["channel.present"]
    attemptId: str
    channelRevision: int
    presentation: Presentation


class PresentResult(_Envelope):
    """Adapter -> server: what `sendMessage` did for the attempt."""

    kind: Literal["channel.present"]
    attemptId: str
    channelRevision: int
    result: AttemptResult


class SettleCommand(_Envelope):
    """Server -> adapter: edit these messages to `text` and drop their buttons."""

    kind: Literal["channel.settle"]
    attemptId: str
    channelRevision: int
    messageIds: list[int]
    text: str


class SettleResult(_Envelope):
    """Adapter -> server: what `editMessageText` did ("not modified" is applied)."""

    kind: Literal["channel.settle"]
    attemptId: str
    channelRevision: int
    result: AttemptResult


class CallbackAnswer(TypedDict):
    """A button press: the pressed button's callback data."""

    callbackData: str


class ReplyAnswer(TypedDict):
    """A text reply to one of the bot's messages."""

    replyToMessageId: int
    text: str


Answer: TypeAlias = CallbackAnswer | ReplyAnswer


class ChannelAnswer(_Envelope):
    """Adapter -> server: an allowed user in the profile's chat answered.

    `eventId` is `telegram:<update_id>`; the server answers with idempotency key
    `telegram:<profile>:<update_id>`. No user or chat identity crosses the channel.
    """

    kind: Literal["channel.answer"]
    eventId: str
    answer: Answer


class ChannelExiting(_Envelope):
    """Adapter -> server: the adapter stops (`shutdown`, `unauthorized`, `unreachable`,
    `badFrame`)."""

    kind: Literal["channel.exiting"]
    reason: str


AdapterMessage: TypeAlias = (
    ChannelReady | PresentResult | SettleResult | ChannelAnswer | ChannelExiting
)
ServerMessage: TypeAlias = PresentCommand | SettleCommand


def event_id(update_id: int) -> str:
    """The `eventId` of the Telegram update `update_id`."""
    return f"telegram:{update_id}"


def decode_from_adapter(frame: bytes | bytearray | memoryview) -> AdapterMessage:
    """Decode one frame body the server read from an adapter (shape and direction only;
    run `ChannelSequenceCheck` for the envelope).

    Raises:
        FrameTooLargeError, CanonicalJSONError, ProtocolViolation: the frame is bad;
            close the channel.
    """
    return cast(AdapterMessage, decode_channel_message(frame, sender="adapter"))


def decode_from_server(frame: bytes | bytearray | memoryview) -> ServerMessage:
    """Decode one frame body an adapter read from the server.

    Raises:
        FrameTooLargeError, CanonicalJSONError, ProtocolViolation: as `decode_from_adapter`.
    """
    return cast(ServerMessage, decode_channel_message(frame, sender="server"))


def encode_from_adapter(message: AdapterMessage) -> bytes:
    """Validate an adapter's message and return its canonical bytes (no newline)."""
    return encode_channel_message(message, sender="adapter")


def encode_from_server(message: ServerMessage) -> bytes:
    """Validate a server command and return its canonical bytes (no newline)."""
    return encode_channel_message(message, sender="server")


def check_message(value: object, *, sender: Literal["adapter", "server"]) -> dict[str, Any]:
    """Check an already-decoded value as a message from `sender`.

    Raises:
        ProtocolViolation: it is not one.
    """
    return channel_message_from_wire(value, sender=sender)


@dataclass
class ChannelStamp:
    """The sending side's envelope: one epoch and profile, the next sequence number."""

    adapter_epoch: str
    profile: str
    _last: int = field(default=0, repr=False)

    def envelope(self) -> dict[str, Any]:
        """The next envelope; each call uses one sequence number."""
        self._last += 1
        return {
            "schema": CHANNEL_SCHEMA,
            "adapterEpoch": self.adapter_epoch,
            "profile": self.profile,
            "sequence": self._last,
        }


@dataclass
class ChannelSequenceCheck:
    """The receiving side's envelope rule: the expected epoch and profile, and a sequence
    that increases by one from 1."""

    adapter_epoch: str
    profile: str
    last: int = 0

    def check(self, message: _Envelope) -> None:
        """Accept `message`'s envelope or raise.

        Raises:
            ProtocolViolation: a stale or foreign epoch, another profile, or a sequence
                that does not follow the last one accepted.
        """
        if message["adapterEpoch"] != self.adapter_epoch:
            raise _envelope_violation("adapterEpoch", "not the current adapter epoch")
        if message["profile"] != self.profile:
            raise _envelope_violation("profile", "not this channel's profile")
        if message["sequence"] != self.last + 1:
            raise _envelope_violation("sequence", "does not follow the previous message")
        self.last = message["sequence"]


def _envelope_violation(field_name: str, why: str) -> ProtocolViolation:
    return ProtocolViolation(
        f"message violates channel.v1 at /{field_name}: {why}",
        schema_name="channel.v1",
        keyword=field_name,
        location=f"/{field_name}",
    )
