"""The active time of an interactive agent step: its node timeout while no runner exists.

Implements workflow-server.md § Interactive Pi execution and § Recovery step 8: the
timeout runs only during reported model turns of a connected active origin session.
"""

# Durable form, on `interactive_requests`: `active_ms` (time used) and `active_since`
# (the start of the running span, NULL while suspended). The budget is the waiting
# attempt's resolved node timeout, `deadline_at - started_at`, committed with
# `node.started`. A turn start, and a branch report of the active epoch with the turn
# still open, run it; a turn's end, the epoch's end (disconnect or a replacement
# connection), a pause and a server's death stop it, keeping the time used. Each change
# is written in the transaction of the report or transition that causes it. This module
# depends only on the connection, so the lifecycle can call it.

from __future__ import annotations

from dataclasses import dataclass

from pi_workflows.storage import _queries as q
from pi_workflows.storage._db import Reader, Tx

__all__ = [
    "DueRequest",
    "due_requests",
    "next_due_at",
    "resume_session_time",
    "start_active_time",
    "suspend_after_server_death",
    "suspend_request_time",
    "suspend_run_time",
    "suspend_session_time",
    "time_out_request",
]

# `used + (now - since)` folded into `active_ms`, for rows whose span is running.
_FOLD = "active_ms = active_ms + max(0, :until - active_since), active_since = NULL"

_START = """
UPDATE interactive_requests SET active_since = :now
WHERE request_id = :request_id AND status = 'pending' AND active_since IS NULL
"""
_SUSPEND_REQUEST = f"""
UPDATE interactive_requests SET {_FOLD}
WHERE request_id = :request_id AND active_since IS NOT NULL
"""
_SUSPEND_RUN = f"""
UPDATE interactive_requests SET {_FOLD}
WHERE run_id = :run_id AND status = 'pending' AND active_since IS NOT NULL
"""
_SUSPEND_SESSION = f"""
UPDATE interactive_requests SET {_FOLD}
WHERE target_session_id = :session_id AND status = 'pending' AND active_since IS NOT NULL
"""
_SUSPEND_ALL = f"""
UPDATE interactive_requests SET {_FOLD}
WHERE status = 'pending' AND active_since IS NOT NULL
"""
# The open turn of the session belongs to a step of a pending request of an unpaused,
# unfinished run: its time runs again.
_RESUME_SESSION = """
UPDATE interactive_requests SET active_since = :now
WHERE status = 'pending' AND active_since IS NULL AND request_id IN (
    SELECT m.source_id FROM workflow_turns t
    JOIN workflow_messages m ON m.message_id = t.message_id
    WHERE t.session_id = :session_id AND t.status = 'open' AND m.kind = 'step'
) AND run_id IN (SELECT run_id FROM runs WHERE paused = 0 AND finished_at IS NULL)
"""
# The last instant the previous server was known alive: its lease's last renewal (every
# 2 s), or its release if it stopped cleanly first.
_LAST_ALIVE = """
SELECT CASE WHEN released_at IS NULL THEN heartbeat_at ELSE min(heartbeat_at, released_at) END
FROM server_lease WHERE singleton = 1
"""
# A pending request of a waiting, unpaused run whose attempt has a deadline: the instant
# its budget runs out (a suspended one only if it ran out already).
_DUE = """
SELECT i.request_id, i.run_id, i.attempt_id,
       CASE WHEN i.active_since IS NULL THEN (a.deadline_at - a.started_at) - i.active_ms
            ELSE i.active_since + (a.deadline_at - a.started_at) - i.active_ms END AS due_at,
       i.active_since IS NOT NULL AS running
FROM interactive_requests i
JOIN node_attempts a ON a.attempt_id = i.attempt_id
JOIN runs r ON r.run_id = i.run_id
WHERE i.status = 'pending' AND i.target_session_id IS NOT NULL AND a.status = 'waiting'
  AND a.deadline_at IS NOT NULL
  AND r.status = 'waiting' AND r.paused = 0
"""


@dataclass(frozen=True, slots=True)
class DueRequest:
    """A pending request and when its node timeout runs out."""

    request_id: str
    run_id: str
    attempt_id: str
    due_at: int
    """For a running span: the wall-clock instant; suspended: the budget left (ms)."""
    running: int
    """1 while its time runs (a turn of the active epoch is open), else 0."""

    def expired(self, now: int) -> bool:
        """Whether the budget is used up at `now`."""
        return self.due_at <= now if self.running else self.due_at <= 0


def start_active_time(tx: Tx, request_id: str) -> None:
    """A model turn of this request's step started: its time runs from now."""
    tx.execute(_START, {"request_id": request_id, "now": tx.now})


def suspend_request_time(tx: Tx, request_id: str) -> None:
    """The request's turn ended: keep the time used, stop the clock."""
    tx.execute(_SUSPEND_REQUEST, {"request_id": request_id, "until": tx.now})


def suspend_run_time(tx: Tx, run_id: str) -> None:
    """The run was paused: paused time does not consume the node timeout."""
    tx.execute(_SUSPEND_RUN, {"run_id": run_id, "until": tx.now})


def suspend_session_time(tx: Tx, session_id: str) -> int:
    """The session's coordinator epoch ended (disconnect or a replacement connection):
    every running span of its requests stops. Returns how many stopped."""
    return tx.execute(_SUSPEND_SESSION, {"session_id": session_id, "until": tx.now})


def resume_session_time(tx: Tx, session_id: str) -> int:
    """A branch report of the active epoch: a step turn still open runs again (the
    report's transaction closed any turn it proved lost first). Returns how many."""
    return tx.execute(_RESUME_SESSION, {"session_id": session_id, "now": tx.now})


def suspend_after_server_death(tx: Tx) -> int:
    """At start, before the new epoch is taken (in its transaction): no coordinator
    epoch outlives its server, so every running span stops at the last instant the
    previous server was alive; its downtime consumes nothing. Returns how many."""
    last = tx.fetch_value(_LAST_ALIVE, {})
    until = tx.now if last is None else min(int(last), tx.now)
    return tx.execute(_SUSPEND_ALL, {"until": until})


def time_out_request(tx: Tx, request_id: str) -> None:
    """The request's node timeout ran out: cancel it if still pending, keeping the time
    used (a running span is folded in). In the caller's transaction, which holds the
    claim check, event and revision."""
    tx.execute(q.UPDATE_REQUEST_TIME_OUT, {"request_id": request_id, "now": tx.now})


def due_requests(reader: Reader) -> list[DueRequest]:
    """Every pending request whose node timeout can run out (few: one per waiting
    interactive run), with when it does."""
    return reader.fetch_all(_DUE, {}, DueRequest)


def next_due_at(reader: Reader, now: int) -> int | None:
    """The earliest instant a pending request's budget runs out: `now` if one already
    did, None if no span is running and none ran out (nothing can expire until a
    report changes that, and every report is a commit)."""
    instants = [
        now if not due.running else due.due_at
        for due in due_requests(reader)
        if due.running or due.expired(now)
    ]
    return min(instants, default=None)
