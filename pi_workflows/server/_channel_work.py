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
from dataclasses import dataclass
from typing import Any, Final, Literal

from pi_workflows.storage import Database, Tx
from pi_workflows.storage._channels import (
    DELIVER,
    SETTLE,
    ChannelAttempt,
    ChannelCounts,
    ChannelResult,
    SettledAttempt,
    StaleChannelResultError,
    channel_counts,
    channel_message_ids,
    delivered_decisions,
    interrupt_channel_attempts,
    reserve_channel_attempt,
    settle_channel_attempt,
)
from pi_workflows.storage._content import read_json_blob

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
    summary: str
    choices: tuple[tuple[str, str], ...]
    """(choice ID, label), in order; each is one button."""
    expires_at: int | None


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
    """The complete operator presentation, plain text."""
    lines = [view.summary.strip(), "", f"Workflow {view.workflow_name}, run {view.run_id}"]
    if len(view.choices) > 0:
        lines.append("Choose below, or reply to this message with a choice.")
    text = "\n".join(lines)
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


def _presentation(view: DecisionView) -> dict[str, Any]:
    return {
        "text": presentation_text(view),
        "buttons": [
            {"label": label[:128], "callbackData": callback_data(view.decision_id, index)}
            for index, (_, label) in enumerate(view.choices[:32])
        ],
    }


# --- Finding work (a read) ------------------------------------------------------------


def find_work(db: Database, *, scopes: Sequence[ProfileScope]) -> list[WorkItem]:
    """Every delivery and settlement the profiles should attempt now, oldest first.

    A pending protected decision a profile serves and has not delivered (or whose
    delivery was reopened) is a delivery; a settled decision whose delivered message
    is not edited yet is a settlement. Reservation re-checks all of it.
    """
    items: list[WorkItem] = []
    pending = _pending_decisions(db)
    for scope in scopes:
        rows = {row.decision_id: row for row in delivered_decisions(db, scope.channel)}
        for view in pending:
            if not scope.serves(view.workflow_name, view.node_path):
                continue
            row = rows.get(view.decision_id)
            if row is None or row.delivery_state == "pending":
                items.append(WorkItem(DELIVER, scope.channel, view.decision_id))
        for row in rows.values():
            settled = row.status != "pending" and row.delivery_state == "presented"
            if settled and row.settlement_state in ("none", "pending"):
                items.append(WorkItem(SETTLE, scope.channel, row.decision_id))
    return items


def counts_by_channel(db: Database, *, channels: Sequence[str]) -> dict[str, ChannelCounts]:
    """Pending and ambiguous deliveries per channel, for `channel.status`."""
    return {channel: channel_counts(db, channel) for channel in channels}


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
    rows = delivered_decisions(tx, channel)
    if "callbackData" in answer:
        data = str(answer["callbackData"])
        prefix, _, rest = data.partition(":")
        tag, _, index = rest.partition(":")
        if prefix != CALLBACK_PREFIX or not index.isdigit():
            return None
        for row in rows:
            if _tag(row.decision_id) == tag:
                view = _decision_view(tx, row.decision_id)
                if view is None or int(index) >= len(view.choices):
                    return row.decision_id, None
                return row.decision_id, {"choice": view.choices[int(index)][0]}
        return None
    reply_to = answer.get("replyToMessageId")
    text = str(answer.get("text", "")).strip().casefold()
    for row in rows:
        if reply_to in channel_message_ids(tx, row.delivery_effect_id):
            view = _decision_view(tx, row.decision_id)
            if view is None:
                return row.decision_id, None
            for choice_id, label in view.choices:
                if text in (choice_id.casefold(), label.casefold()):
                    return row.decision_id, {"choice": choice_id}
            return row.decision_id, None
    return None


# --- Settlement text ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Resolution:
    outcome: str
    provenance: str | None
    response_hash: str | None
    source_channel: str | None


def _settlement_request(tx: Tx, item: WorkItem) -> dict[str, Any] | None:
    rows = delivered_decisions(tx, item.channel)
    row = next((r for r in rows if r.decision_id == item.decision_id), None)
    if row is None:
        return None
    message_ids = channel_message_ids(tx, row.delivery_effect_id)
    if not message_ids:
        return None  # confirmed by an operator without message IDs: nothing to edit
    found = tx.fetch_one(
        "SELECT outcome, provenance, response_hash, source_channel "
        "FROM human_decision_resolutions WHERE decision_id = :d",
        {"d": item.decision_id},
        _Resolution,
    )
    view = _decision_view(tx, item.decision_id)
    summary = view.summary.strip() if view is not None else "Decision"
    outcome = _outcome_line(tx, found, view)
    text = f"{summary}\n\n{outcome}"
    return {
        "channel": item.channel,
        "messageIds": list(message_ids),
        "text": text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…",
    }


def _outcome_line(tx: Tx, found: _Resolution | None, view: DecisionView | None) -> str:
    if found is None or found.outcome != "accepted" or found.response_hash is None:
        return "Closed: the decision was cancelled."
    value = read_json_blob(tx, found.response_hash)
    label = _choice_label(value, view)
    if found.provenance == "timeout":
        return f"Timed out: the default ({label}) was applied."
    where = "in Telegram" if found.source_channel == "telegram" else "by the operator"
    return f"Answered {where}: {label}."


def _choice_label(value: Any, view: DecisionView | None) -> str:
    choice = value.get("choice") if isinstance(value, dict) else None
    if view is not None:
        for choice_id, label in view.choices:
            if choice_id == choice:
                return label
    return str(choice) if isinstance(choice, str) else "answered"


# --- The decisions core (i15-decisions) ---------------------------------------------------


def _pending_decisions(db: Database) -> list[DecisionView]:
    raise NotImplementedError


def _pending_decision(tx: Tx, decision_id: str) -> DecisionView | None:
    raise NotImplementedError


def _decision_view(tx: Tx, decision_id: str) -> DecisionView | None:
    raise NotImplementedError


def _answer_decision(tx: Tx, decision_id: str, value: Any, key: str) -> AnswerOutcome:
    raise NotImplementedError
