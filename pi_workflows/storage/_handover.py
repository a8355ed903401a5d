"""Handing an unfinished interactive run over: to another origin session (adopt), or to
a headless pi child (headless). Each function writes in the caller's transaction.

Implements the storage side of workflow-server.md § Interactive Pi execution and
§ Detached execution for a run whose origin Pi session cannot come back. Internal module.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from pi_workflows.storage import _queries as q
from pi_workflows.storage._db import Reader, Tx
from pi_workflows.storage._deadlines import suspend_run_time
from pi_workflows.storage._follow_ups import cancel_chain_follow_ups, chain_root
from pi_workflows.storage._messages import present_resumed_steps, touch_run_view

__all__ = [
    "make_run_headless",
    "move_origin_session",
    "waits_at_agent_step",
]


@dataclass(frozen=True, slots=True)
class _Pending:
    message_id: str


@dataclass(frozen=True, slots=True)
class _Decision:
    decision_id: str
    content_digest: str


def _end_open_turns(tx: Tx, run_id: str) -> None:
    """The old session's open turns are over: nobody reports their end any more."""
    tx.execute(q.UPDATE_RUN_OPEN_TURNS_LOST, {"run_id": run_id, "now": tx.now})


def _next_order(tx: Tx, session_id: str) -> int:
    return int(tx.fetch_value(q.SELECT_NEXT_SESSION_ORDER, {"session_id": session_id}))


def move_origin_session(tx: Tx, run_id: str, session_id: str, *, paused: bool) -> None:
    """Make `session_id` the run's origin session (adopt), keeping its one reservation.

    The run's pending requests, pending messages and pending follow-ups move with it, in
    session order; open turns of the old session end as `lost`; the step time stops. An
    agent step that was presented in the old session gets one `resumed` step message in
    the new one, and a protected decision shown there one decision message (unless the
    run is paused: its resume presents the step).
    """
    suspend_run_time(tx, run_id)
    params = {"run_id": run_id, "session_id": session_id, "now": tx.now}
    tx.execute(q.UPDATE_BINDING_ORIGIN_SESSION, params)
    tx.execute(q.UPDATE_RUN_REQUESTS_TARGET, params)
    _end_open_turns(tx, run_id)
    # Moved one by one so each takes the next place in the new session's order.
    for pending in tx.fetch_all(q.SELECT_RUN_PENDING_MESSAGES, {"run_id": run_id}, _Pending):
        tx.execute(
            q.UPDATE_MESSAGE_TARGET,
            {
                "message_id": pending.message_id,
                "session_id": session_id,
                "order": _next_order(tx, session_id),
                "now": tx.now,
            },
        )
    root = chain_root(tx, run_id)
    tx.execute(q.UPDATE_CHAIN_FOLLOW_UPS_TARGET, {**params, "root": root})
    if not paused:
        present_resumed_steps(tx, run_id)
        _present_decisions_again(tx, run_id, session_id)
    touch_run_view(tx, run_id)


def _present_decisions_again(tx: Tx, run_id: str, session_id: str) -> None:
    """A protected decision shown in the old session (no pending message left) is shown
    once more in the new one, with the same content."""
    rows = tx.fetch_all(q.SELECT_DECISIONS_TO_PRESENT_AGAIN, {"run_id": run_id}, _Decision)
    for row in rows:
        tx.execute(
            q.INSERT_DECISION_MESSAGE_AGAIN,
            {
                "message_id": f"message-{uuid.uuid4().hex}",
                "run_id": run_id,
                "session_id": session_id,
                "source_id": row.decision_id,
                "digest": row.content_digest,
                "order": _next_order(tx, session_id),
                "now": tx.now,
            },
        )


def make_run_headless(tx: Tx, run_id: str) -> None:
    """Turn the interactive run headless: no origin session, no reservation.

    Its pending requests no longer target a session (a headless pi child's bridge
    answers them), its pending step and decision messages are cancelled, open turns end
    as `lost`, and its chain's pending follow-ups are cancelled (a headless run has no
    session to present them in). Notifications already committed stay where they are.
    """
    suspend_run_time(tx, run_id)
    params = {"run_id": run_id, "now": tx.now}
    tx.execute(q.UPDATE_BINDING_HEADLESS, params)
    tx.execute(q.UPDATE_RUN_REQUESTS_UNTARGETED, params)
    tx.execute(q.UPDATE_RUN_STEP_DECISION_MESSAGES_CANCEL, params)
    _end_open_turns(tx, run_id)
    cancel_chain_follow_ups(tx, run_id)
    touch_run_view(tx, run_id)


def waits_at_agent_step(reader: Reader, run_id: str) -> bool:
    """The run waits (parked, no runner) at a pending agent step's request."""
    return reader.fetch_value(q.SELECT_RUN_WAITS_AT_AGENT_STEP, {"run_id": run_id}) is not None
