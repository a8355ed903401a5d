"""runner.v1 reply results: what an accepted reply's `result` holds, per message kind.

Part of `wire/runner.py` (import from there). The schema leaves `result` open; these
records are the contract both ends keep: the server builds them, and the runner reads
a reply's result into one with `result_as` (once, where the reply is read).
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from msgspec import UNSET, UnsetType

from pi_workflows.wire._records import checked
from pi_workflows.wire._runner_payloads import Count, Digest, PositiveCount, Record

__all__ = [
    "ContentPart",
    "ContentWritten",
    "EffectReservation",
    "EffectSettled",
    "EffectSummary",
    "InteractionAnswer",
    "StartedVisit",
    "TurnVerdict",
    "result_value",
]


class StartedVisit(Record, frozen=True):
    """The result of `node.started`: the visit the server counted."""

    visit: PositiveCount


class ContentWritten(Record, frozen=True):
    """The result of `content.write`: the digest the part was stored under."""

    digest: Digest


class ContentPart(Record, frozen=True):
    """The result of `content.read`: the part's bytes, in base64."""

    offset: Count
    data: str

    def __repr__(self) -> str:
        return f"ContentPart(offset={self.offset}, <{len(self.data)} base64 characters>)"


class EffectSummary(Record, frozen=True):
    """A managed effect as a reply carries it (no request, no fingerprint)."""

    effect_id: str
    effect_type: str
    idempotency_key: str
    state: Literal["pending", "applying", "applied", "rejected", "cancelled", "ambiguous"]
    result: Any = None
    error: str | None = None
    attempt_count: int = 0


class EffectReservation(Record, frozen=True):
    """The result of `effect.reserve` (and of a settle that a read-back said to retry)."""

    decision: Literal["proceed", "adopt", "uncertain", "ambiguous"]
    effect: EffectSummary
    attempt_number: int | None = None


class EffectSettled(Record, frozen=True):
    """The result of `effect.settle`: the effect's state after it."""

    state: str


class TurnVerdict(Record, frozen=True):
    """The result of `interaction.turnEnded`: remind the model, fail the step, or read
    the accepted value back."""

    action: Literal["remind", "fail", "accepted"]
    count: int | UnsetType = UNSET


class InteractionAnswer(Record, frozen=True):
    """The result of `interaction.requested`: the request's state and, once a submission
    was accepted, its value (adopted instead of asking again)."""

    status: str
    request_id: str | UnsetType = UNSET
    accepted_submission_id: str | UnsetType = UNSET
    value: Any | UnsetType = UNSET
    existing: bool | UnsetType = UNSET
    """The request was there before this message: the step is presented again."""
    resumed: bool | UnsetType = UNSET
    """A new request carries on an interrupted attempt's: presented again too."""

    @property
    def accepted(self) -> bool:
        return self.accepted_submission_id is not UNSET


_T = TypeVar("_T")


def result_value(result: Any, result_type: type[_T]) -> _T:
    """An accepted reply's `result` (UNSET: none) as its record.

    Raises:
        ProtocolViolation: the result is not one.
    """
    value: _T = checked(None if result is UNSET else result, result_type, at="/result")
    return value
