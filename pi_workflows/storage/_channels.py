"""External-channel delivery and settlement of protected decisions, as managed effects.

Implements workflow-server.md § Supervised channel adapters and § Durable protocol
records (`channel_messages`, `effects`, `effect_attempts`); the rules are below.
"""

# - Before an adapter child sends (`channel.deliver`) or edits (`channel.settle`) a
#   Telegram message, the server records the effect and its numbered attempt, in one
#   transaction with the `channel_messages` change and the decision's state check (a
#   settled decision gets no new delivery). The waiting run holds no claim: these writes
#   check the decision and the channel row instead, and append one run event.
# - Each new attempt bumps `channel_revision`. A result is accepted only for the channel
#   row's current revision and adapter epoch and the effect's in-flight attempt of that
#   epoch; anything else is stale and refused (`StaleChannelResultError`).
# - A confirmed result stores the Telegram message IDs in the effect result; the
#   `channel_messages` row keeps only the delivery and settlement states.
# - A known rejection (HTTP 4xx) reopens the effect for the next attempt, at most
#   `MAX_CHANNEL_ATTEMPTS` rejections in all; an unknown outcome (a timeout or a dropped
#   connection after the request was written) and an attempt interrupted by a crash
#   become `ambiguous` and are never sent again automatically; the operator's
#   `channel recover` decides (`recover_channel_effect`: the same states, SQL and event
#   as `run recover`).
# - A `notSent` result (nothing reached the Bot API, or it answered 429 or 5xx) closes
#   the attempt `cancelled` and reopens the effect; the row's `retry_at` holds the next
#   attempt back (a 429: its retry_after plus jitter, for the whole chat; else an
#   exponential backoff with jitter), durably, so a restart keeps the wait. Once not-sent
#   attempts have gone on for the retry bound, the effect is `rejected` and the row
#   `failed`; `channel recover ... retry` reopens a failed one as an ambiguous one.

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any, Final, Literal

from pi_workflows.storage import _queries as q
from pi_workflows.storage._content import put_json_blob, read_json_blob
from pi_workflows.storage._db import Reader, Tx
from pi_workflows.storage._effects import EFFECT_RECOVERED, effect_fingerprint
from pi_workflows.storage._errors import EffectRecoveryError, StorageError
from pi_workflows.storage._interactions import record_interaction_event
from pi_workflows.storage._phases import EventType

__all__ = [
    "DELIVER",
    "MAX_CHANNEL_ATTEMPTS",
    "RETRY_BOUND_MS",
    "SETTLE",
    "ChannelAttempt",
    "ChannelCounts",
    "ChannelRecovery",
    "ChannelResult",
    "ChannelTrouble",
    "SettledAttempt",
    "StaleChannelResultError",
    "ambiguous_channel_effects",
    "channel_counts",
    "channel_message_ids",
    "channel_trouble",
    "chat_hold",
    "delivered_decisions",
    "interrupt_channel_attempts",
    "parse_attempt_id",
    "recover_channel_effect",
    "reserve_channel_attempt",
    "settle_channel_attempt",
]

DELIVER: Final = "channel.deliver"
SETTLE: Final = "channel.settle"
KINDS: Final = (DELIVER, SETTLE)
MAX_CHANNEL_ATTEMPTS: Final = 3
"""Known rejections (4xx) one delivery or settlement may get in all."""
RETRY_BOUND_MS: Final = 10 * 60 * 1000
"""How long not-sent attempts of one delivery go on before it is `failed` (default)."""
RETRY_BASE_MS: Final = 1000
RETRY_MAX_MS: Final = 60 * 1000
"""The exponential backoff after a not-sent attempt: from the base, at most this."""
RATE_LIMITED: Final = "rateLimited"
NOT_SENT_IN_TIME: Final = "not sent within the retry bound"
INTERRUPTED: Final = "interrupted while applying (server or adapter stopped)"
UNKNOWN_OUTCOME: Final = "the outcome is unknown"

Kind = Literal["channel.deliver", "channel.settle"]


class StaleChannelResultError(StorageError):
    """A result or answer from another adapter epoch, attempt or channel revision."""


@dataclass(frozen=True, slots=True)
class ChannelAttempt:
    """An attempt reserved for an adapter child to perform (send or edit)."""

    kind: str
    decision_id: str
    run_id: str
    channel: str
    effect_id: str
    attempt_number: int
    attempt_id: str
    """Stable: `<effect ID>/<attempt number>`, the channel.v1 `attemptId`."""
    channel_revision: int
    request: dict[str, Any]
    """What the child gets: the presentation (deliver) or the message IDs and text."""


@dataclass(frozen=True, slots=True)
class ChannelResult:
    """A child's report on one attempt (channel.v1 `result`)."""

    status: Literal["applied", "rejected", "notSent", "failed"]
    message_ids: tuple[int, ...] = ()
    http_status: int | None = None
    reason: str | None = None
    """A short safe description (never echoed from Telegram into status)."""
    retry_after_ms: int | None = None
    """A 429's `retry_after` (notSent)."""


@dataclass(frozen=True, slots=True)
class SettledAttempt:
    """What `settle_channel_attempt` committed."""

    kind: str
    decision_id: str
    run_id: str
    state: str
    """The effect's state now: applied, pending (a new attempt may follow), rejected,
    ambiguous."""
    decision_open: bool
    """The decision is still pending (an applied delivery waits for its answer)."""
    retry_at: int | None = None
    """notSent: when the next attempt may start (None: none follows)."""


@dataclass(frozen=True, slots=True)
class ChannelCounts:
    pending: int
    ambiguous: int
    failed: int = 0
    retrying: int = 0
    """Pending deliveries or settlements waiting for their `retry_at` (not sent yet)."""


@dataclass(frozen=True, slots=True)
class ChannelRecovery:
    run_id: str
    effect_id: str
    kind: str
    channel: str
    action: str
    attempt_number: int
    next_attempt_number: int | None
    revision: int


@dataclass(frozen=True, slots=True)
class _Decision:
    decision_id: str
    run_id: str
    attempt_id: str | None
    status: str


@dataclass(frozen=True, slots=True)
class _Row:
    decision_id: str
    channel: str
    channel_revision: int
    adapter_epoch: str | None
    delivery_state: str
    settlement_state: str
    delivery_effect_id: str | None
    settlement_effect_id: str | None
    retry_at: int | None = None
    retry_since: int | None = None
    retry_reason: str | None = None


@dataclass(frozen=True, slots=True)
class _Effect:
    effect_id: str
    run_id: str
    effect_type: str
    state: str
    result_hash: str | None
    request_hash: str | None
    last_attempt: int | None
    last_executor: str | None
    last_attempt_state: str | None


_SELECT_DECISION = """
SELECT decision_id, run_id, attempt_id, status FROM human_decisions WHERE decision_id = :d
"""
_SELECT_ROW = """
SELECT decision_id, channel, channel_revision, adapter_epoch, delivery_state,
       settlement_state, delivery_effect_id, settlement_effect_id, retry_at, retry_since,
       retry_reason
FROM channel_messages WHERE decision_id = :d AND channel = :c
"""
_SELECT_ROW_BY_EFFECT = """
SELECT decision_id, channel, channel_revision, adapter_epoch, delivery_state,
       settlement_state, delivery_effect_id, settlement_effect_id, retry_at, retry_since,
       retry_reason
FROM channel_messages WHERE delivery_effect_id = :e OR settlement_effect_id = :e
"""
_COUNT_REJECTIONS = """
SELECT count(*) FROM effect_attempts WHERE effect_id = :e AND state = 'rejected'
"""
# A failed (not sent within the bound, or rejected too often) delivery or settlement
# the operator retries: the effect is pending again.
_REOPEN_REJECTED = """
UPDATE effects SET state = 'pending', result_hash = NULL, error = NULL,
    updated_at = :now, settled_at = NULL
WHERE effect_id = :effect_id AND state = 'rejected'
"""
_SELECT_EFFECT = """
SELECT e.effect_id, e.run_id, e.effect_type, e.state, e.result_hash, e.request_hash,
       a.attempt_number AS last_attempt, a.executor_epoch AS last_executor,
       a.state AS last_attempt_state
FROM effects AS e
LEFT JOIN effect_attempts AS a ON a.effect_id = e.effect_id AND a.attempt_number =
    (SELECT max(b.attempt_number) FROM effect_attempts AS b WHERE b.effect_id = e.effect_id)
WHERE e.effect_id = :e
"""
_INSERT_ROW = """
INSERT INTO channel_messages (
    decision_id, channel, channel_revision, adapter_epoch, delivery_state,
    settlement_state, created_at, updated_at
) VALUES (:d, :c, 1, NULL, 'pending', 'none', :now, :now)
"""
_UPDATE_ROW = """
UPDATE channel_messages SET channel_revision = :revision, adapter_epoch = :epoch,
    delivery_state = :delivery, settlement_state = :settlement,
    delivery_effect_id = :delivery_effect, settlement_effect_id = :settlement_effect,
    retry_at = :retry_at, retry_since = :retry_since, retry_reason = :retry_reason,
    updated_at = :now
WHERE decision_id = :d AND channel = :c
"""
_INSERT_EFFECT = """
INSERT INTO effects (
    effect_id, run_id, attempt_id, effect_type, idempotency_key, request_fingerprint,
    request_hash, idempotent, state, created_at, updated_at
) VALUES (:effect_id, :run_id, :attempt_id, :effect_type, :key, :fingerprint,
    :request_hash, 0, 'applying', :now, :now)
"""
_START_EFFECT = "UPDATE effects SET state = 'applying', updated_at = :now WHERE effect_id = :e"
_REOPEN_APPLYING = """
UPDATE effects SET state = 'pending', updated_at = :now WHERE effect_id = :e AND state = 'applying'
"""
_CLOSE_ATTEMPT = """
UPDATE effect_attempts SET state = :state, finished_at = :now, result_hash = :result_hash,
    error = :error
WHERE effect_id = :e AND attempt_number = :n AND state = 'applying'
"""
# Every in-flight channel attempt (optionally of one channel and adapter epoch).
_APPLYING_ATTEMPTS = """
SELECT m.decision_id, m.channel, e.effect_id, a.attempt_number, e.effect_type
FROM effect_attempts AS a
JOIN effects AS e ON e.effect_id = a.effect_id
JOIN channel_messages AS m
  ON m.delivery_effect_id = e.effect_id OR m.settlement_effect_id = e.effect_id
WHERE a.state = 'applying' AND e.effect_type IN ('channel.deliver', 'channel.settle')
  AND (:channel IS NULL OR m.channel = :channel)
  AND (:epoch IS NULL OR a.executor_epoch = :epoch)
"""
_COUNTS = """
SELECT
  (SELECT count(*) FROM channel_messages WHERE channel = :c
     AND (delivery_state IN ('pending', 'presenting')
          OR settlement_state IN ('pending', 'settling'))) AS pending,
  (SELECT count(*) FROM channel_messages WHERE channel = :c
     AND (delivery_state = 'ambiguous' OR settlement_state = 'ambiguous')) AS ambiguous,
  (SELECT count(*) FROM channel_messages WHERE channel = :c
     AND (delivery_state = 'failed' OR settlement_state = 'failed')) AS failed,
  (SELECT count(*) FROM channel_messages WHERE channel = :c AND retry_at > :now
     AND (delivery_state = 'pending' OR settlement_state = 'pending')) AS retrying
"""
# When the chat's rate limit (the latest 429's retry_after) lets the next call go.
_CHAT_HOLD = """
SELECT max(retry_at) FROM channel_messages
WHERE channel = :c AND retry_reason = 'rateLimited' AND retry_at > :now
"""
# A run's deliveries and settlements that are not sent yet or failed (the run view).
_RUN_TROUBLE = """
SELECT m.channel, m.decision_id,
       CASE WHEN m.delivery_state = 'failed' OR m.settlement_state = 'failed'
            THEN 'failed' ELSE 'retrying' END AS state,
       CASE WHEN m.settlement_state IN ('pending', 'failed') THEN 'settle' ELSE 'deliver' END
         AS operation,
       m.retry_at, m.retry_reason
FROM channel_messages AS m JOIN human_decisions AS d ON d.decision_id = m.decision_id
WHERE d.run_id = :run_id
  AND (m.delivery_state = 'failed' OR m.settlement_state = 'failed'
       OR (m.retry_at IS NOT NULL
           AND (m.delivery_state = 'pending' OR m.settlement_state = 'pending')))
ORDER BY m.created_at
"""
# Delivered (or delivering) decisions of a channel that still need work: an open
# decision's callback data, a settled decision whose message is not edited yet.
_DELIVERED = """
SELECT m.decision_id, d.run_id, d.status, m.delivery_state, m.settlement_state,
       m.delivery_effect_id, m.settlement_effect_id, m.retry_at
FROM channel_messages AS m JOIN human_decisions AS d ON d.decision_id = m.decision_id
WHERE m.channel = :c AND m.delivery_state IN ('pending', 'presenting', 'presented')
  AND (d.status = 'pending' OR m.settlement_state IN ('none', 'pending'))
ORDER BY m.created_at
"""
_EFFECT_RUN = "SELECT run_id FROM effects WHERE effect_id = :e"
_AMBIGUOUS = """
SELECT e.effect_id, e.effect_type, m.channel, m.decision_id,
       (SELECT max(a.attempt_number) FROM effect_attempts AS a WHERE a.effect_id = e.effect_id)
         AS attempt_number, e.state
FROM effects AS e
JOIN channel_messages AS m
  ON m.delivery_effect_id = e.effect_id OR m.settlement_effect_id = e.effect_id
WHERE e.run_id = :run_id AND e.effect_type IN ('channel.deliver', 'channel.settle')
  AND (e.state = 'ambiguous'
       OR (e.state = 'rejected' AND :failed = 1
           AND ((m.delivery_effect_id = e.effect_id AND m.delivery_state = 'failed')
                OR (m.settlement_effect_id = e.effect_id AND m.settlement_state = 'failed'))))
ORDER BY e.rowid
"""


@dataclass(frozen=True, slots=True)
class DeliveredDecision:
    """A decision delivered (or being delivered) on a channel, with its open work."""

    decision_id: str
    run_id: str
    status: str
    delivery_state: str
    settlement_state: str
    delivery_effect_id: str | None
    settlement_effect_id: str | None
    retry_at: int | None = None


@dataclass(frozen=True, slots=True)
class AmbiguousChannelEffect:
    effect_id: str
    effect_type: str
    channel: str
    decision_id: str
    attempt_number: int
    state: str = "ambiguous"
    """`ambiguous`, or `rejected` for a failed delivery (`recover_channel_effect`)."""


@dataclass(frozen=True, slots=True)
class ChannelTrouble:
    """A run's delivery or settlement that is not sent yet or failed (the run view)."""

    channel: str
    decision_id: str
    state: str
    """`retrying` (not sent yet, another attempt follows at `retry_at`) or `failed`."""
    operation: str
    retry_at: int | None
    retry_reason: str | None


def attempt_id_of(effect_id: str, number: int) -> str:
    """The stable attempt ID the child echoes: `<effect ID>/<number>`."""
    return f"{effect_id}/{number}"


def parse_attempt_id(attempt_id: str) -> tuple[str, int] | None:
    """`(effect ID, attempt number)` of an attempt ID, or None when malformed."""
    effect_id, _, number = attempt_id.rpartition("/")
    if not effect_id or not number.isdigit() or len(number) > 9:
        return None
    return effect_id, int(number)


def _effect_id(kind: str, channel: str, decision_id: str) -> str:
    key = f"{kind}:{channel}:{decision_id}"
    return "effect-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]


def _effect(reader: Reader, effect_id: str | None) -> _Effect | None:
    if effect_id is None:
        return None
    return reader.fetch_one(_SELECT_EFFECT, {"e": effect_id}, _Effect)


def _save_row(tx: Tx, row: _Row, **changes: Any) -> _Row:
    fields = {
        "channel_revision": row.channel_revision,
        "adapter_epoch": row.adapter_epoch,
        "delivery_state": row.delivery_state,
        "settlement_state": row.settlement_state,
        "delivery_effect_id": row.delivery_effect_id,
        "settlement_effect_id": row.settlement_effect_id,
        "retry_at": row.retry_at,
        "retry_since": row.retry_since,
        "retry_reason": row.retry_reason,
        **changes,
    }
    tx.execute(
        _UPDATE_ROW,
        {
            "d": row.decision_id,
            "c": row.channel,
            "revision": fields["channel_revision"],
            "epoch": fields["adapter_epoch"],
            "delivery": fields["delivery_state"],
            "settlement": fields["settlement_state"],
            "delivery_effect": fields["delivery_effect_id"],
            "settlement_effect": fields["settlement_effect_id"],
            "retry_at": fields["retry_at"],
            "retry_since": fields["retry_since"],
            "retry_reason": fields["retry_reason"],
            "now": tx.now,
        },
    )
    return _Row(row.decision_id, row.channel, **fields)


def _event(tx: Tx, run_id: str, event_type: str, payload: dict[str, Any]) -> int:
    return record_interaction_event(tx, run_id, event_type, payload)


# --- Reserve ------------------------------------------------------------------------


def reserve_channel_attempt(
    tx: Tx,
    *,
    kind: Kind,
    decision_id: str,
    channel: str,
    adapter_epoch: str,
    request: dict[str, Any],
) -> ChannelAttempt | None:
    """Reserve the next attempt of a decision's delivery or settlement on a channel.

    One transaction: the decision's state check, the `channel_messages` row, the effect
    (`applying`) and its numbered attempt for `adapter_epoch`, a new channel revision
    and one run event. Returns None when there is nothing to do now:

    - deliver: the decision is no longer pending (a settled decision gets no new
      delivery), or its delivery is in flight, presented, failed or ambiguous;
    - settle: the decision is still pending, its delivery did not apply (no message to
      edit), or its settlement is in flight, done, failed or ambiguous;
    - either: its last attempt was not sent and its `retry_at` has not come, or a 429
      holds the chat back.

    A `pending` effect (after a known rejection, or an operator's retry) gets its next
    numbered attempt; `request` is stored with the first attempt only (the reopened
    effect keeps its request: a retry sends what was reserved).
    """
    decision = tx.fetch_one(_SELECT_DECISION, {"d": decision_id}, _Decision)
    if decision is None:
        return None
    row = tx.fetch_one(_SELECT_ROW, {"d": decision_id, "c": channel}, _Row)
    if kind == DELIVER:
        if decision.status != "pending":
            return None
        if row is None:
            tx.execute(_INSERT_ROW, {"d": decision_id, "c": channel, "now": tx.now})
            row = tx.fetch_one(_SELECT_ROW, {"d": decision_id, "c": channel}, _Row)
            assert row is not None
        effect_id = row.delivery_effect_id
    else:
        if decision.status == "pending" or row is None or row.delivery_state != "presented":
            return None
        effect_id = row.settlement_effect_id
    if _held_back(tx, row, channel):
        return None
    effect = _effect(tx, effect_id)
    if effect is None:
        new_id = _effect_id(kind, channel, decision_id)
        request_hash = put_json_blob(tx, request)
        tx.execute(
            _INSERT_EFFECT,
            {
                "effect_id": new_id,
                "run_id": decision.run_id,
                "attempt_id": decision.attempt_id,
                "effect_type": kind,
                "key": f"{kind}:{channel}:{decision_id}",
                "fingerprint": effect_fingerprint(kind, request),
                "request_hash": request_hash,
                "now": tx.now,
            },
        )
        number = 1
        stored_request = request
        effect_id = new_id
    elif effect.state == "pending":
        tx.execute(_START_EFFECT, {"e": effect.effect_id, "now": tx.now})
        number = (effect.last_attempt or 0) + 1
        assert effect.request_hash is not None
        stored_request = read_json_blob(tx, effect.request_hash)
        effect_id = effect.effect_id
    else:
        return None  # in flight, or terminal: nothing is sent again automatically
    tx.execute(
        q.INSERT_EFFECT_ATTEMPT,
        {
            "effect_id": effect_id,
            "attempt_number": number,
            "executor_epoch": adapter_epoch,
            "now": tx.now,
        },
    )
    revision = row.channel_revision + 1
    if kind == DELIVER:
        row = _save_row(
            tx,
            row,
            channel_revision=revision,
            adapter_epoch=adapter_epoch,
            delivery_state="presenting",
            delivery_effect_id=effect_id,
        )
    else:
        row = _save_row(
            tx,
            row,
            channel_revision=revision,
            adapter_epoch=adapter_epoch,
            settlement_state="settling",
            settlement_effect_id=effect_id,
        )
    _event(
        tx,
        decision.run_id,
        EventType.EFFECT_RESERVED if number == 1 else EventType.EFFECT_RETRIED,
        {
            "effectId": effect_id,
            "effectType": kind,
            "channel": channel,
            "decisionId": decision_id,
            "attemptNumber": number,
            "channelRevision": revision,
        },
    )
    return ChannelAttempt(
        kind=kind,
        decision_id=decision_id,
        run_id=decision.run_id,
        channel=channel,
        effect_id=effect_id,
        attempt_number=number,
        attempt_id=attempt_id_of(effect_id, number),
        channel_revision=revision,
        request=stored_request,
    )


def _held_back(tx: Tx, row: _Row | None, channel: str) -> bool:
    """Its last attempt was not sent and its `retry_at` has not come, or the chat's 429
    holds every call back."""
    if row is not None and row.retry_at is not None and row.retry_at > tx.now:
        return True
    return chat_hold(tx, channel, tx.now) is not None


# --- Settle -------------------------------------------------------------------------


def settle_channel_attempt(
    tx: Tx,
    *,
    channel: str,
    adapter_epoch: str,
    attempt_id: str,
    channel_revision: int,
    result: ChannelResult,
    retry_bound_ms: int = RETRY_BOUND_MS,
) -> SettledAttempt:
    """Record a child's result for its in-flight attempt.

    Accepted only when every fence holds: the attempt ID names an effect of this
    channel, the channel row is at `channel_revision` with `adapter_epoch`, and that
    exact attempt is the effect's in-flight attempt run by `adapter_epoch`.

    - applied: attempt and effect `applied`, result `{"messageIds": [...]}`;
    - rejected: with rejections left, the attempt is `rejected` and the effect `pending`
      (the next reservation opens the next attempt); else both `rejected`;
    - notSent (nothing was sent): the attempt is `cancelled` and the effect `pending`,
      its row's `retry_at` set (`_next_retry_at`); once not-sent attempts have gone on
      for `retry_bound_ms`, the effect is `rejected` and the row `failed`;
    - failed (unknown outcome): attempt and effect `ambiguous`, never re-sent.

    Raises:
        StaleChannelResultError: any fence fails (nothing is written).
    """
    parsed = parse_attempt_id(attempt_id)
    if parsed is None:
        raise StaleChannelResultError("the attempt ID is malformed")
    effect_id, number = parsed
    row = tx.fetch_one(_SELECT_ROW_BY_EFFECT, {"e": effect_id}, _Row)
    effect = _effect(tx, effect_id)
    if row is None or effect is None or row.channel != channel:
        raise StaleChannelResultError("no such attempt on this channel")
    if row.adapter_epoch != adapter_epoch or row.channel_revision != channel_revision:
        raise StaleChannelResultError("a stale adapter epoch or channel revision")
    if (
        effect.state != "applying"
        or effect.last_attempt != number
        or effect.last_attempt_state != "applying"
        or effect.last_executor != adapter_epoch
    ):
        raise StaleChannelResultError("the attempt is not in flight")
    kind = effect.effect_type
    state_field = "delivery_state" if kind == DELIVER else "settlement_state"
    params: dict[str, Any] = {"e": effect_id, "n": number, "now": tx.now, "result_hash": None}
    retry: dict[str, Any] = {"retry_at": None, "retry_since": None, "retry_reason": None}
    if result.status == "notSent":
        return _not_sent(tx, row, effect, number, result=result, bound_ms=retry_bound_ms)
    if result.status == "applied":
        value = {"messageIds": list(result.message_ids)}
        params.update(state="applied", error=None, result_hash=put_json_blob(tx, value))
        tx.execute(_CLOSE_ATTEMPT, params)
        tx.execute(q.UPDATE_EFFECT_SETTLE, {**_settle(params), "state": "applied"})
        state, row_state = "applied", ("presented" if kind == DELIVER else "settled")
    elif result.status == "rejected":
        error = f"rejected (HTTP {result.http_status or 400})"
        params.update(state="rejected", error=error)
        tx.execute(_CLOSE_ATTEMPT, params)
        rejections = int(tx.fetch_value(_COUNT_REJECTIONS, {"e": effect_id}))
        if rejections < MAX_CHANNEL_ATTEMPTS:
            tx.execute(_REOPEN_APPLYING, {"e": effect_id, "now": tx.now})
            state, row_state = "pending", "pending"
        else:
            tx.execute(q.UPDATE_EFFECT_SETTLE, {**_settle(params), "state": "rejected"})
            state, row_state = "rejected", "failed"
    else:
        params.update(state="ambiguous", error=UNKNOWN_OUTCOME)
        tx.execute(_CLOSE_ATTEMPT, params)
        tx.execute(q.UPDATE_EFFECT_SETTLE, {**_settle(params), "state": "ambiguous"})
        state, row_state = "ambiguous", "ambiguous"
    _save_row(tx, row, **{state_field: row_state}, **retry)
    _event(
        tx,
        effect.run_id,
        EventType.EFFECT_AMBIGUOUS if state == "ambiguous" else EventType.EFFECT_SETTLED,
        {
            "effectId": effect_id,
            "effectType": kind,
            "channel": channel,
            "decisionId": row.decision_id,
            "attemptNumber": number,
            "state": state,
        },
    )
    decision = tx.fetch_one(_SELECT_DECISION, {"d": row.decision_id}, _Decision)
    return SettledAttempt(
        kind=kind,
        decision_id=row.decision_id,
        run_id=effect.run_id,
        state=state,
        decision_open=decision is not None and decision.status == "pending",
    )


def _not_sent(
    tx: Tx, row: _Row, effect: _Effect, number: int, *, result: ChannelResult, bound_ms: int
) -> SettledAttempt:
    """A `notSent` result: the attempt is `cancelled` (proven not applied), and the
    effect waits for its next attempt at `retry_at`, or is `rejected` past the bound."""
    kind = effect.effect_type
    state_field = "delivery_state" if kind == DELIVER else "settlement_state"
    reason = result.reason or "notSent"
    since = row.retry_since if row.retry_since is not None else tx.now
    params: dict[str, Any] = {
        "e": effect.effect_id,
        "n": number,
        "now": tx.now,
        "result_hash": None,
        "state": "cancelled",
        "error": f"not sent ({reason})",
    }
    tx.execute(_CLOSE_ATTEMPT, params)
    retry_at: int | None = _next_retry_at(tx.now, since, result)
    if tx.now - since >= bound_ms:
        params.update(error=f"{NOT_SENT_IN_TIME} ({reason})")
        tx.execute(q.UPDATE_EFFECT_SETTLE, {**_settle(params), "state": "rejected"})
        state, row_state, retry_at = "rejected", "failed", None
    else:
        tx.execute(_REOPEN_APPLYING, {"e": effect.effect_id, "now": tx.now})
        state, row_state = "pending", "pending"
    _save_row(
        tx,
        row,
        **{state_field: row_state},
        retry_at=retry_at,
        retry_since=since,
        retry_reason=reason,
    )
    payload: dict[str, Any] = {
        "effectId": effect.effect_id,
        "effectType": kind,
        "channel": row.channel,
        "decisionId": row.decision_id,
        "attemptNumber": number,
        "state": state,
        "notSent": reason,
    }
    if retry_at is not None:
        payload["retryAt"] = retry_at
    _event(tx, effect.run_id, EventType.EFFECT_SETTLED, payload)
    decision = tx.fetch_one(_SELECT_DECISION, {"d": row.decision_id}, _Decision)
    return SettledAttempt(
        kind=kind,
        decision_id=row.decision_id,
        run_id=effect.run_id,
        state=state,
        decision_open=decision is not None and decision.status == "pending",
        retry_at=retry_at,
    )


def _next_retry_at(now: int, since: int, result: ChannelResult) -> int:
    """When the next attempt may start after a not-sent one.

    A 429: its `retry_after` plus up to a tenth more (at least 100 ms) of jitter. Else
    an exponential backoff: each wait about as long as the streak so far (so the waits
    double), from `RETRY_BASE_MS` to `RETRY_MAX_MS`, with up to half of it as jitter
    (so many deliveries failing together do not come back together).
    """
    if result.retry_after_ms is not None:
        wait = result.retry_after_ms
        return now + wait + random.randint(0, max(100, wait // 10))  # noqa: S311 - jitter
    wait = min(max(RETRY_BASE_MS, now - since), RETRY_MAX_MS)
    return now + wait // 2 + random.randint(0, wait // 2)  # noqa: S311 - jitter


def _settle(params: dict[str, Any]) -> dict[str, Any]:
    return {
        "effect_id": params["e"],
        "result_hash": params["result_hash"],
        "error": params["error"],
        "now": params["now"],
    }


def interrupt_channel_attempts(
    tx: Tx, *, channel: str | None = None, adapter_epoch: str | None = None
) -> int:
    """Make every in-flight channel attempt `ambiguous` (its child or server died).

    At server start (every channel) and when an adapter child ends (its channel and
    epoch). The attempt may have reached Telegram, so it is never sent again
    automatically. Returns how many attempts became ambiguous.
    """
    rows = tx.fetch_all(
        _APPLYING_ATTEMPTS, {"channel": channel, "epoch": adapter_epoch}, _Interrupted
    )
    for hit in rows:
        params = {
            "e": hit.effect_id,
            "n": hit.attempt_number,
            "now": tx.now,
            "state": "ambiguous",
            "result_hash": None,
            "error": INTERRUPTED,
        }
        tx.execute(_CLOSE_ATTEMPT, params)
        tx.execute(q.UPDATE_EFFECT_SETTLE, {**_settle(params), "state": "ambiguous"})
        row = tx.fetch_one(_SELECT_ROW, {"d": hit.decision_id, "c": hit.channel}, _Row)
        assert row is not None
        field = "delivery_state" if hit.effect_type == DELIVER else "settlement_state"
        _save_row(tx, row, **{field: "ambiguous"})
        run_id = tx.fetch_value(_EFFECT_RUN, {"e": hit.effect_id})
        _event(
            tx,
            str(run_id),
            EventType.EFFECT_AMBIGUOUS,
            {
                "effectId": hit.effect_id,
                "effectType": hit.effect_type,
                "channel": hit.channel,
                "decisionId": hit.decision_id,
                "attemptNumber": hit.attempt_number,
                "reason": INTERRUPTED,
            },
        )
    return len(rows)


@dataclass(frozen=True, slots=True)
class _Interrupted:
    decision_id: str
    channel: str
    effect_id: str
    attempt_number: int
    effect_type: str


# --- Operator recovery --------------------------------------------------------------


def ambiguous_channel_effects(
    reader: Reader, run_id: str, *, failed: bool = False
) -> list[AmbiguousChannelEffect]:
    """The ambiguous channel deliveries and settlements of a run, oldest first (and
    the failed ones, with `failed`)."""
    return reader.fetch_all(
        _AMBIGUOUS, {"run_id": run_id, "failed": int(failed)}, AmbiguousChannelEffect
    )


def channel_trouble(reader: Reader, run_id: str) -> list[ChannelTrouble]:
    """A run's deliveries and settlements not sent yet (retrying) or failed."""
    return reader.fetch_all(_RUN_TROUBLE, {"run_id": run_id}, ChannelTrouble)


def chat_hold(reader: Reader, channel: str, now: int) -> int | None:
    """Until when the chat's latest 429 holds every call back (None: it does not)."""
    value = reader.fetch_value(_CHAT_HOLD, {"c": channel, "now": now})
    return None if value is None else int(value)


def recover_channel_effect(
    tx: Tx,
    run_id: str,
    *,
    action: Literal["confirm", "retry"],
    actor: str,
    effect_id: str | None = None,
    message_ids: tuple[int, ...] = (),
) -> ChannelRecovery:
    """The operator's reviewed recovery of an ambiguous or failed channel delivery or
    settlement.

    The same states, SQL and `effect_recovered` event as `recover_ambiguous_effect`:

    - `confirm`: the operator saw the message (or the edit) in Telegram. The ambiguous
      attempt and the effect become `applied` (recovery `confirmed`), with the message
      IDs the operator gives (a delivery confirmed without them can be answered by its
      buttons, but its message cannot be edited afterwards);
    - `retry`: the attempt is marked `retried` and the effect is `pending` again, so
      the channel actor sends exactly one new numbered attempt (a duplicate is
      possible). A failed one (not sent within the retry bound, or rejected too often:
      its effect `rejected`) is reopened the same way, under the same effect key, with
      a fresh retry bound; nothing of it is ambiguous to mark.

    The waiting run has no transition to make (it still waits for its answer).

    Raises:
        EffectRecoveryError: `noAmbiguousEffect` or `effectRequired`.
    """
    candidates = ambiguous_channel_effects(tx, run_id, failed=action == "retry")
    if effect_id is not None:
        candidates = [c for c in candidates if c.effect_id == effect_id]
    if not candidates:
        what = "ambiguous or failed" if action == "retry" else "ambiguous"
        raise EffectRecoveryError(run_id, "noAmbiguousEffect", f"no {what} channel delivery")
    if len(candidates) > 1:
        raise EffectRecoveryError(
            run_id, "effectRequired", f"{len(candidates)} channel effects are ambiguous; name one"
        )
    chosen = candidates[0]
    params = {
        "effect_id": chosen.effect_id,
        "attempt_number": chosen.attempt_number,
        "now": tx.now,
    }
    row = tx.fetch_one(_SELECT_ROW, {"d": chosen.decision_id, "c": chosen.channel}, _Row)
    assert row is not None
    field = "delivery_state" if chosen.effect_type == DELIVER else "settlement_state"
    if action == "confirm":
        result_hash = put_json_blob(tx, {"messageIds": list(message_ids), "confirmed": True})
        tx.execute(q.UPDATE_EFFECT_ATTEMPT_CONFIRM, {**params, "result_hash": result_hash})
        tx.execute(q.UPDATE_EFFECT_CONFIRM, {**params, "result_hash": result_hash})
        done = "presented" if chosen.effect_type == DELIVER else "settled"
        _save_row(tx, row, **{field: done})
        next_number = None
    else:
        if chosen.state == "rejected":
            tx.execute(_REOPEN_REJECTED, params)
        else:
            tx.execute(q.UPDATE_EFFECT_ATTEMPT_RETRY, params)
            tx.execute(q.UPDATE_EFFECT_REOPEN, params)
        _save_row(tx, row, **{field: "pending"}, retry_at=None, retry_since=None, retry_reason=None)
        next_number = chosen.attempt_number + 1
    payload: dict[str, Any] = {
        "effectId": chosen.effect_id,
        "effectType": chosen.effect_type,
        "channel": chosen.channel,
        "decisionId": chosen.decision_id,
        "action": action,
        "attemptNumber": chosen.attempt_number,
        "actor": {"kind": "operator", "clientId": actor},
    }
    if next_number is not None:
        payload["nextAttemptNumber"] = next_number
    revision = _event(tx, run_id, EFFECT_RECOVERED, payload)
    return ChannelRecovery(
        run_id=run_id,
        effect_id=chosen.effect_id,
        kind=chosen.effect_type,
        channel=chosen.channel,
        action=action,
        attempt_number=chosen.attempt_number,
        next_attempt_number=next_number,
        revision=revision,
    )


# --- Reads --------------------------------------------------------------------------


def channel_counts(reader: Reader, channel: str, now: int) -> ChannelCounts:
    """How many of a channel's deliveries or settlements are pending (of which how many
    wait to be tried again after a not-sent attempt), ambiguous or failed."""
    found = reader.fetch_one(_COUNTS, {"c": channel, "now": now}, ChannelCounts)
    return found if found is not None else ChannelCounts(0, 0)


def delivered_decisions(reader: Reader, channel: str) -> list[DeliveredDecision]:
    """A channel's decisions with open work (an answer to take, a message to edit)."""
    return reader.fetch_all(_DELIVERED, {"c": channel}, DeliveredDecision)


def channel_message_ids(reader: Reader, effect_id: str | None) -> tuple[int, ...]:
    """The Telegram message IDs an applied delivery stored in its effect result."""
    effect = _effect(reader, effect_id)
    if effect is None or effect.state != "applied" or effect.result_hash is None:
        return ()
    value = read_json_blob(reader, effect.result_hash)
    ids = value.get("messageIds", []) if isinstance(value, dict) else []
    return tuple(int(i) for i in ids if isinstance(i, int))
