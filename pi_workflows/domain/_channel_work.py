"""The channel-adapter actor's units of work: plain functions of data, run by the
database actor (`Transact`) or the reader actor (`Read`).

Implements workflow-server.md § Supervised channel adapters on the server side: which
protected decisions a profile serves, the presentation a child gets (the complete
operator text and opaque callback data, never the decision subject), reserving each
send or edit as a managed effect before the child acts (`storage/_channels.py`),
recording its result, and turning a Telegram answer into the decision's one answer
through the decisions core (source channel `telegram`, provenance `human`).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import orjson

from pi_workflows.storage import (
    DELIVER,
    RETRY_BOUND_MS,
    SETTLE,
    ChannelAttempt,
    ChannelCounts,
    ChannelResult,
    Database,
    SettledAttempt,
    StaleChannelResultError,
    Tx,
    answer_protected_decision,
    channel_counts,
    channel_message_ids,
    chat_hold,
    decision_outcome,
    delivered_decisions,
    interrupt_channel_attempts,
    pending_protected_decisions,
    protected_decision_row,
    read_json_blob,
    read_protected_decision,
    reserve_channel_attempt,
    settle_channel_attempt,
)
from pi_workflows.wire.decisions import Choice, choices_from_wire
from pi_workflows.wire.decisions import presentation_text as decision_text

__all__ = [
    "AnswerOutcome",
    "DecisionView",
    "ProfileScope",
    "WorkItem",
    "answer_from_channel",
    "callback_data",
    "counts_by_channel",
    "find_work",
    "interrupt_adapter",
    "presentation_text",
    "record_result",
    "recover_channels_at_startup",
    "reserve_work",
]

log = logging.getLogger(__name__)

CALLBACK_PREFIX: Final = "pw1"
MAX_TEXT: Final = 4096
"""Telegram's limit on one message's text (channel.v1 refuses longer)."""


@dataclass(frozen=True, slots=True)
class ProfileScope:
    """What the units need of a profile: its channel and what it serves (no credential)."""

    channel: str
    workflows: frozenset[str]
    decisions: frozenset[str]

    def serves(self, workflow_name: str, node_path: str) -> bool:
        return workflow_name in self.workflows or node_path in self.decisions


@dataclass(frozen=True, slots=True)
class DecisionView:
    """One pending protected decision as the channel side sees it (no subject)."""

    decision_id: str
    run_id: str
    workflow_name: str
    node_path: str
    presentation: dict[str, Any] = field(repr=False)
    """The decision's operator presentation (summary, choices; never a subject)."""
    expires_at: int | None = None
    has_default: bool = False

    @property
    def summary(self) -> str:
        return str(self.presentation.get("summary") or "")

    @property
    def choices(self) -> tuple[Choice, ...]:
        return choices_from_wire(self.presentation.get("choices"))


@dataclass(frozen=True, slots=True)
class WorkItem:
    """A send or an edit a profile's child should make next."""

    kind: Literal["channel.deliver", "channel.settle"]
    channel: str
    decision_id: str


@dataclass(frozen=True, slots=True)
class AnswerOutcome:
    """What a `channel.answer` became (for the log: no identity, no payload)."""

    outcome: str
    """accepted, adopted, conflict, rejected, unknown (no decision matched), invalid."""
    code: str | None = None
    run_id: str | None = None


# --- Presentation -------------------------------------------------------------------


def _tag(decision_id: str) -> str:
    return hashlib.sha256(decision_id.encode("utf-8")).hexdigest()[:24]


def callback_data(decision_id: str, index: int) -> str:
    """Opaque, server-made button data: `pw1:<decision tag>:<choice index>` (<= 64 bytes)."""
    return f"{CALLBACK_PREFIX}:{_tag(decision_id)}:{index}"


def presentation_text(view: DecisionView) -> str:
    """The complete operator presentation, plain text: the decisions core's own text,
    then where it comes from and how to answer in Telegram."""
    body = decision_text(
        {**view.presentation, "expiresAt": view.expires_at, "hasDefault": view.has_default}
    )
    lines = [body.strip(), "", f"Workflow {view.workflow_name}, run {view.run_id}."]
    if any(choice.input_name is None for choice in view.choices):
        lines.append("Press a button, or reply to this message with a choice.")
    elif view.choices:
        lines.append("Reply to this message with a choice and its text.")
    else:
        lines.append("Reply to this message with the answer as JSON.")
    text = "\n".join(lines)
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


def _presentation(view: DecisionView) -> dict[str, Any]:
    """Buttons for the choices that need no text (a button press carries none)."""
    return {
        "text": presentation_text(view),
        "buttons": [
            {"label": choice.label[:128], "callbackData": callback_data(view.decision_id, index)}
            for index, choice in enumerate(view.choices)
            if choice.input_name is None
        ][:32],
    }


# --- Finding work (a read) ------------------------------------------------------------


def find_work(db: Database, *, scopes: Sequence[ProfileScope]) -> list[WorkItem]:
    """Every delivery and settlement the profiles should attempt now, oldest first.

    A pending protected decision a profile serves and has not delivered (or whose
    delivery was reopened) is a delivery; a settled decision whose delivered message
    is not edited yet is a settlement. Reservation re-checks all of it. A row whose
    last attempt was not sent waits for its `retry_at`, and a chat under a 429 waits
    as a whole (the actor scans again at least every `SCAN_EVERY_S`).
    """
    items: list[WorkItem] = []
    pending = _pending_decisions(db)
    now = db.clock.now_ms()
    for scope in scopes:
        if chat_hold(db, scope.channel, now) is not None:
            continue
        rows = {row.decision_id: row for row in delivered_decisions(db, scope.channel)}
        for view in pending:
            if not scope.serves(view.workflow_name, view.node_path):
                continue
            row = rows.get(view.decision_id)
            if row is None or (row.delivery_state == "pending" and _due(row.retry_at, now)):
                items.append(WorkItem(DELIVER, scope.channel, view.decision_id))
        for row in rows.values():
            settled = row.status != "pending" and row.delivery_state == "presented"
            open_settlement = row.settlement_state == "none" or (
                row.settlement_state == "pending" and _due(row.retry_at, now)
            )
            if settled and open_settlement:
                items.append(WorkItem(SETTLE, scope.channel, row.decision_id))
    return items


def _due(retry_at: int | None, now: int) -> bool:
    return retry_at is None or retry_at <= now


def counts_by_channel(db: Database, *, channels: Sequence[str]) -> dict[str, ChannelCounts]:
    """Pending, retrying, ambiguous and failed deliveries per channel (`channel.status`)."""
    now = db.clock.now_ms()
    return {channel: channel_counts(db, channel, now) for channel in channels}


# --- Reserving and recording (writes) -------------------------------------------------


def reserve_work(db: Database, *, item: WorkItem, adapter_epoch: str) -> ChannelAttempt | None:
    """Reserve the item's next attempt for `adapter_epoch`, or None (nothing to do)."""
    with db.write() as tx:
        request: dict[str, Any] | None
        if item.kind == DELIVER:
            view = _pending_decision(tx, item.decision_id)
            if view is None:
                return None
            request = {"channel": item.channel, "presentation": _presentation(view)}
        else:
            request = _settlement_request(tx, item)
            if request is None:
                return None
        return reserve_channel_attempt(
            tx,
            kind=item.kind,
            decision_id=item.decision_id,
            channel=item.channel,
            adapter_epoch=adapter_epoch,
            request=request,
        )


def record_result(
    db: Database,
    *,
    channel: str,
    adapter_epoch: str,
    attempt_id: str,
    channel_revision: int,
    result: ChannelResult,
    retry_bound_ms: int = RETRY_BOUND_MS,
) -> SettledAttempt | None:
    """Record a child's result; None when it was stale (refused, nothing written)."""
    try:
        with db.write() as tx:
            return settle_channel_attempt(
                tx,
                channel=channel,
                adapter_epoch=adapter_epoch,
                attempt_id=attempt_id,
                channel_revision=channel_revision,
                result=result,
                retry_bound_ms=retry_bound_ms,
            )
    except StaleChannelResultError:
        return None


def interrupt_adapter(db: Database, *, channel: str, adapter_epoch: str) -> int:
    """An adapter child ended: its in-flight attempts become ambiguous."""
    with db.write() as tx:
        return interrupt_channel_attempts(tx, channel=channel, adapter_epoch=adapter_epoch)


def recover_channels_at_startup(db: Database) -> None:
    """Recovery: every channel attempt a dead server left applying becomes ambiguous."""
    with db.write() as tx:
        count = interrupt_channel_attempts(tx)
    if count:
        log.warning(
            "channel attempts interrupted by a server stop are ambiguous",
            extra={"action": "channel.ambiguous", "count": count},
        )


# --- Answers ----------------------------------------------------------------------------


def answer_from_channel(
    db: Database,
    *,
    channel: str,
    profile: str,
    event_id: str,
    answer: dict[str, Any],
) -> AnswerOutcome:
    """Turn a `channel.answer` into the decision's answer (or a refusal).

    The callback data (or the replied-to message) names the decision among this
    channel's open deliveries; the choice is the button's, or the reply's text matched
    against the choices. The decisions core takes it with source channel `telegram`
    and idempotency key `telegram:<profile>:<update_id>`, in one transaction.
    """
    update_id = event_id.removeprefix("telegram:")
    key = f"telegram:{profile}:{update_id}"
    with db.write() as tx:
        resolved = _resolve(tx, channel, answer)
        if resolved is None:
            return AnswerOutcome("unknown")
        decision_id, value = resolved
        if value is None:
            return AnswerOutcome("invalid", "choiceUnknown")
        return _answer_decision(tx, decision_id, value, key)


def _resolve(tx: Tx, channel: str, answer: dict[str, Any]) -> tuple[str, Any] | None:
    """The decision this answer is for, and the answer value (None: not a valid one)."""
    rows = delivered_decisions(tx, channel)
    if "callbackData" in answer:
        prefix, _, rest = str(answer["callbackData"]).partition(":")
        tag, _, index = rest.partition(":")
        if prefix != CALLBACK_PREFIX or not index.isdigit() or len(index) > 3:
            return None
        for row in rows:
            if _tag(row.decision_id) == tag:
                view = _decision_view(tx, row.decision_id)
                choices = view.choices if view is not None else ()
                if int(index) >= len(choices) or choices[int(index)].input_name is not None:
                    return row.decision_id, None
                return row.decision_id, {"choice": choices[int(index)].choice_id}
        return None
    reply_to = answer.get("replyToMessageId")
    for row in rows:
        if reply_to in channel_message_ids(tx, row.delivery_effect_id):
            view = _decision_view(tx, row.decision_id)
            text = str(answer.get("text", "")).strip()
            return row.decision_id, (None if view is None else _reply_answer(view, text))
    return None


def _reply_answer(view: DecisionView, text: str) -> Any:
    """A reply's answer: a choice's ID or label (then its text, for a choice that asks
    for one), or JSON for a decision with an answer schema. None: no match."""
    if not view.choices:
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            return None
    folded = text.casefold()
    for choice in view.choices:
        for name in (choice.choice_id, choice.label):
            key = name.casefold()
            if choice.input_name is None and folded == key:
                return {"choice": choice.choice_id}
            if choice.input_name is not None and folded.startswith(key):
                rest = text[len(key) :].lstrip(" :\n").strip()
                if rest:
                    return {"choice": choice.choice_id, "input": {choice.input_name: rest}}
    return None


# --- Settlement text ----------------------------------------------------------------------


def _settlement_request(tx: Tx, item: WorkItem) -> dict[str, Any] | None:
    rows = delivered_decisions(tx, item.channel)
    row = next((r for r in rows if r.decision_id == item.decision_id), None)
    if row is None:
        return None
    message_ids = channel_message_ids(tx, row.delivery_effect_id)
    if not message_ids:
        return None  # confirmed by an operator without message IDs: nothing to edit
    view = _decision_view(tx, item.decision_id)
    summary = view.summary.strip() if view is not None else "Decision"
    text = f"{summary}\n\n{_outcome_line(tx, item.decision_id)}"
    return {
        "channel": item.channel,
        "messageIds": list(message_ids),
        "text": text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…",
    }


def _outcome_line(tx: Tx, decision_id: str) -> str:
    outcome = decision_outcome(tx, decision_id)
    if outcome is None or outcome.status != "accepted":
        return "Closed: the decision was cancelled with its run."
    label = outcome.label or outcome.choice or "answered"
    if outcome.provenance == "timeout":
        return f"Timed out: the default answer ({label}) was taken."
    where = "in Telegram" if outcome.source_channel == "telegram" else "elsewhere"
    return f"Answered {where}: {label}."


# --- The decisions core (i15-decisions) ---------------------------------------------------


def _view(found: Any) -> DecisionView:
    return DecisionView(
        decision_id=found.decision_id,
        run_id=found.run_id,
        workflow_name=found.workflow_name,
        node_path=found.node_path,
        presentation=dict(found.presentation),
        expires_at=found.expires_at,
        has_default=bool(found.has_default),
    )


def _pending_decisions(db: Database) -> list[DecisionView]:
    return [_view(found) for found in pending_protected_decisions(db)]


def _pending_decision(tx: Tx, decision_id: str) -> DecisionView | None:
    found = read_protected_decision(tx, decision_id)
    return None if found is None else _view(found)


def _decision_view(tx: Tx, decision_id: str) -> DecisionView | None:
    """A protected decision's presentation in any state (a late press still resolves)."""
    found = protected_decision_row(tx, decision_id)
    if found is None:
        return None
    presentation = read_json_blob(tx, found.request_hash)
    return DecisionView(
        decision_id=found.decision_id,
        run_id=found.run_id,
        workflow_name=found.workflow_name,
        node_path=found.node_path,
        presentation=presentation if isinstance(presentation, dict) else {},
    )


def _answer_decision(tx: Tx, decision_id: str, value: Any, key: str) -> AnswerOutcome:
    answered = answer_protected_decision(
        tx, decision_id, value, source_channel="telegram", idempotency_key=key
    )
    return AnswerOutcome(answered.outcome, answered.reason, answered.run_id)
