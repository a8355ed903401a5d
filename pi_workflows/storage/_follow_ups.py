"""Follow-ups (`followUp.add`), per workflow-server.md § Conformance: each waits for its
chain's final completed outcome, its terminal turn, earlier follow-ups and the release of
the reservation, then is presented as one `follow_up` message of the chain's final leaf;
failure and cancellation cancel them. Every write runs in the caller's transaction.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Final

from pi_workflows.storage._content import put_json_blob, read_json_blob
from pi_workflows.storage._db import Reader, Tx
from pi_workflows.storage._messages import insert_message

__all__ = [
    "MAX_FOLLOW_UP_CHARS",
    "FollowUpRow",
    "add_follow_up",
    "cancel_chain_follow_ups",
    "chain_leaf",
    "chain_root",
    "pending_follow_up_count",
    "present_next_follow_up",
]

MAX_FOLLOW_UP_CHARS: Final = 64 * 1024
"""The longest follow-up text (a protocol frame holds it with room to spare)."""


@dataclass(frozen=True, slots=True)
class FollowUpRow:
    follow_up_id: str
    run_id: str
    chain_run_id: str
    target_session_id: str
    content_hash: str
    state: str
    message_id: str | None


_COLUMNS = "follow_up_id, run_id, chain_run_id, target_session_id, content_hash, state, message_id"

# Every run of the chain that starts at :root, following continuations down.
_CHAIN = """
WITH RECURSIVE chain(run_id, depth) AS (
    SELECT :root, 0
    UNION ALL
    SELECT r.run_id, c.depth + 1 FROM runs r JOIN chain c ON r.continuation_of = c.run_id
)
"""


def chain_root(reader: Reader, run_id: str) -> str:
    """The first run of `run_id`'s checkpoint-continuation chain."""
    current = run_id
    while True:
        parent = reader.fetch_value(
            "SELECT continuation_of FROM runs WHERE run_id = :r", {"r": current}
        )
        if parent is None:
            return current
        current = str(parent)


def _leaf(reader: Reader, root: str) -> str:
    value = reader.fetch_value(
        _CHAIN + "SELECT run_id FROM chain ORDER BY depth DESC LIMIT 1", {"root": root}
    )
    return root if value is None else str(value)


def chain_leaf(reader: Reader, run_id: str) -> str:
    """The last run of `run_id`'s chain (the one no continuation follows yet)."""
    return _leaf(reader, chain_root(reader, run_id))


def add_follow_up(tx: Tx, run_id: str, session_id: str, text: str) -> FollowUpRow:
    """Queue one follow-up of `run_id`'s chain, then present it at once when everything
    it waits for is already done (the caller checked the run and its session)."""
    follow_up_id = f"follow-up-{uuid.uuid4().hex}"
    tx.execute(
        "INSERT INTO follow_ups (follow_up_id, run_id, chain_run_id, target_session_id, "
        "content_hash, state, created_at, updated_at) VALUES (:f, :r, :c, :s, :h, 'pending', "
        ":now, :now)",
        {
            "f": follow_up_id,
            "r": run_id,
            "c": chain_root(tx, run_id),
            "s": session_id,
            "h": put_json_blob(tx, {"text": text}),
            "now": tx.now,
        },
    )
    tx.execute("UPDATE runs SET view_changes = view_changes + 1 WHERE run_id = :r", {"r": run_id})
    present_next_follow_up(tx, run_id)
    row = _read(tx, follow_up_id)
    assert row is not None
    return row


def _read(reader: Reader, follow_up_id: str) -> FollowUpRow | None:
    return reader.fetch_one(
        f"SELECT {_COLUMNS} FROM follow_ups WHERE follow_up_id = :f",
        {"f": follow_up_id},
        FollowUpRow,
    )


# The leaf completed and released its reservation, and its terminal message's first
# turn ended.
_LEAF_DONE = """
SELECT 1 FROM runs r JOIN run_bindings b ON b.run_id = r.run_id
WHERE r.run_id = :leaf AND r.status = 'completed' AND b.reserved = 0
  AND EXISTS (
    SELECT 1 FROM workflow_messages m JOIN workflow_turns t ON t.message_id = m.message_id
    WHERE m.run_id = :leaf AND m.kind = 'terminal' AND t.status != 'open')
"""
# A presented follow-up of the chain whose first turn has not ended yet.
_EARLIER_OPEN = """
SELECT 1 FROM follow_ups f JOIN workflow_messages m ON m.message_id = f.message_id
WHERE f.chain_run_id = :root AND f.state = 'presented' AND m.state != 'cancelled'
  AND NOT EXISTS (SELECT 1 FROM workflow_turns t
                  WHERE t.message_id = m.message_id AND t.status != 'open')
"""


def present_next_follow_up(tx: Tx, run_id: str) -> str | None:
    """Present the chain's next pending follow-up if everything before it is done: the
    chain's final leaf completed, its reservation is released, its terminal message's
    first turn ended, and every earlier follow-up's first turn ended. Returns the new
    message's ID. Called after a follow-up is added and after a terminal or follow-up
    turn ends."""
    root = chain_root(tx, run_id)
    leaf = _leaf(tx, root)
    if tx.fetch_value(_LEAF_DONE, {"leaf": leaf}) is None:
        return None
    if tx.fetch_value(_EARLIER_OPEN, {"root": root}) is not None:
        return None
    row = tx.fetch_one(
        f"SELECT {_COLUMNS} FROM follow_ups WHERE chain_run_id = :root AND state = 'pending' "
        "ORDER BY created_at, rowid LIMIT 1",
        {"root": root},
        FollowUpRow,
    )
    if row is None:
        return None
    text = read_json_blob(tx, row.content_hash)
    content: dict[str, Any] = {
        "runId": leaf,
        "followUpId": row.follow_up_id,
        "text": text.get("text") if isinstance(text, dict) else None,
    }
    message_id = insert_message(
        tx,
        run_id=leaf,
        session_id=row.target_session_id,
        kind="follow_up",
        source_id=row.follow_up_id,
        content=content,
    )
    tx.execute(
        "UPDATE follow_ups SET state = 'presented', message_id = :m, updated_at = :now "
        "WHERE follow_up_id = :f",
        {"m": message_id, "f": row.follow_up_id, "now": tx.now},
    )
    return message_id


def cancel_chain_follow_ups(tx: Tx, run_id: str) -> int:
    """In a failed, timed-out or cancelled run's terminal transaction: its chain ends
    without a completed outcome, so its pending follow-ups are cancelled."""
    return tx.execute(
        "UPDATE follow_ups SET state = 'cancelled', updated_at = :now "
        "WHERE chain_run_id = :root AND state = 'pending'",
        {"root": chain_root(tx, run_id), "now": tx.now},
    )


def pending_follow_up_count(reader: Reader) -> int:
    """Follow-ups not yet delivered: queued, or presented and still pending in Pi."""
    count = reader.fetch_value(
        "SELECT count(*) FROM follow_ups f WHERE f.state = 'pending' OR (f.state = 'presented' "
        "AND EXISTS (SELECT 1 FROM workflow_messages m WHERE m.message_id = f.message_id "
        "AND m.state = 'pending'))",
        {},
    )
    return int(count or 0)
