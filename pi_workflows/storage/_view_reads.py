"""Reads behind the live run view (`pi-workflows.run-view.v1`), and failure tracebacks.

Implements the storage side of workflow-server.md § Live run view: each an indexed read
beyond the run, queue and attempt rows; call them inside one `Database.read()` block so
the whole view is one snapshot. Internal; `pi_workflows.storage` exports the names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pi_workflows.storage._content import ContentRef, put_view_content
from pi_workflows.storage._db import Reader, Tx

__all__ = [
    "TRACEBACK_MEDIA_TYPE",
    "LineageLinks",
    "PendingRequest",
    "failure_tracebacks",
    "lineage_links",
    "pending_requests",
    "put_traceback",
    "run_result_payload",
]

TRACEBACK_MEDIA_TYPE = "text/x-python-traceback; charset=utf-8"
"""The media type a failed node's traceback is stored under in `run_view_content`."""

_SELECT_PENDING_REQUESTS = """
SELECT r.request_id, r.kind, a.node_path, r.last_turn_error FROM interactive_requests r
JOIN node_attempts a ON a.attempt_id = r.attempt_id
WHERE r.run_id = :run_id AND r.status = 'pending'
ORDER BY r.created_at, r.request_id
"""
# The newest terminal result event; a terminal run appends it last but for protected
# writes, so walking the primary key backwards finds it in a few steps.
_SELECT_RESULT_PAYLOAD = """
SELECT payload FROM events
WHERE run_id = :run_id AND event_type IN ('run_completed', 'run_failed', 'run_timed_out')
ORDER BY revision DESC LIMIT 1
"""
_SELECT_TRACEBACKS = """
SELECT json_extract(payload, '$.attemptId') AS attempt_id,
       json_extract(payload, '$.traceback.digest') AS digest,
       json_extract(payload, '$.traceback.byteCount') AS byte_length
FROM events
WHERE run_id = :run_id AND event_type = 'node_failed'
  AND json_extract(payload, '$.traceback') IS NOT NULL
"""
_SELECT_RESTARTED_BY = """
SELECT run_id FROM runs WHERE restart_of = :run_id ORDER BY created_at, run_id LIMIT 16
"""
_SELECT_CONTINUED_BY = """
SELECT run_id FROM runs WHERE continuation_of = :run_id ORDER BY created_at, run_id LIMIT 16
"""


@dataclass(frozen=True, slots=True)
class PendingRequest:
    """One pending interactive request of a run (no contract, no payload)."""

    request_id: str
    kind: str
    """`agent`, `assistant`, `checkpoint` or `decision`."""
    node_path: str
    last_turn_error: str | None


@dataclass(frozen=True, slots=True)
class LineageLinks:
    """The runs that came from this one: its restarts and continuations (first 16)."""

    restarted_by: list[str]
    continued_by: list[str]


@dataclass(frozen=True, slots=True)
class _RunId:
    run_id: str


@dataclass(frozen=True, slots=True)
class _Payload:
    payload: str


@dataclass(frozen=True, slots=True)
class _Traceback:
    attempt_id: str | None
    digest: str
    byte_length: int


def pending_requests(reader: Reader, run_id: str) -> list[PendingRequest]:
    """Return the run's pending interactive requests, oldest first."""
    return reader.fetch_all(_SELECT_PENDING_REQUESTS, {"run_id": run_id}, PendingRequest)


def run_result_payload(reader: Reader, run_id: str) -> dict[str, Any] | None:
    """Return the payload of the run's terminal result event (`run_completed`: its
    `output` or `outputRef`), or None before the run ended that way."""
    row = reader.fetch_one(_SELECT_RESULT_PAYLOAD, {"run_id": run_id}, _Payload)
    if row is None:
        return None
    value = json.loads(row.payload)  # event rows are JSON text, not always canonical
    return value if isinstance(value, dict) else None


def failure_tracebacks(reader: Reader, run_id: str) -> dict[str, ContentRef]:
    """Return the stored traceback of each failed attempt, by attempt ID."""
    rows = reader.fetch_all(_SELECT_TRACEBACKS, {"run_id": run_id}, _Traceback)
    return {
        row.attempt_id: ContentRef(run_id, row.digest, TRACEBACK_MEDIA_TYPE, row.byte_length)
        for row in rows
        if row.attempt_id is not None
    }


def lineage_links(reader: Reader, run_id: str) -> LineageLinks:
    """Return the restarts and continuations of a run (indexed, at most 16 each)."""
    params = {"run_id": run_id}
    return LineageLinks(
        restarted_by=[r.run_id for r in reader.fetch_all(_SELECT_RESTARTED_BY, params, _RunId)],
        continued_by=[r.run_id for r in reader.fetch_all(_SELECT_CONTINUED_BY, params, _RunId)],
    )


def put_traceback(tx: Tx, run_id: str, traceback: str) -> dict[str, Any]:
    """Store a failed node's bounded traceback as view content; return its event reference.

    **Durability:** call it in the transaction that records the failure, so the
    `node_failed` event never names content that is not stored.
    """
    ref = put_view_content(tx, run_id, TRACEBACK_MEDIA_TYPE, traceback.encode("utf-8"))
    return {"mediaType": ref.media_type, "byteCount": ref.byte_length, "digest": ref.digest}
