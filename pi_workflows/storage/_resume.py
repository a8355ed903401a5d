"""The resume state of a run: the narrow facts a new runner continues from.

Implements workflow-server.md § Process supervision ("Execution reads are narrow") and
§ Recovery ("Recovery resumes from the last committed boundary"): node outputs, visit
counts, the finished-attempt order with recorded routes, the unfinished attempt, the input.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from pi_workflows.storage import _queries as q
from pi_workflows.storage._content import read_json_blob
from pi_workflows.storage._db import Reader
from pi_workflows.storage._errors import RunNotFoundError

__all__ = ["FinishedAttempt", "ResumeState", "UnfinishedAttempt", "read_resume_state"]

# Attempt statuses that count as a finished visit (as `start_node_attempt` counts them).
_FINISHED = frozenset({"completed", "failed", "timed_out"})
_UNFINISHED = frozenset({"running", "waiting"})
ERROR_TEXT = 4000
"""The most characters of a finished attempt's error a resume state carries."""


@dataclass(frozen=True, slots=True)
class FinishedAttempt:
    """One finished visit of a node, in execution order."""

    attempt_id: str
    node_path: str
    visit: int
    status: str
    """`completed`, `failed` or `timed_out`."""
    next_node_path: str | None
    """The route the runner recorded when it finished (None: none, or the end)."""
    error: str | None = None
    """A failed or timed-out attempt's error, bounded (`ERROR_TEXT`): when the server
    ended it (an agent step's unproductive turns, a deadline), the runner that routes
    the failure names it in the run's reason."""


@dataclass(frozen=True, slots=True)
class UnfinishedAttempt:
    """The run's current node attempt (`running` or `waiting`)."""

    attempt_id: str
    node_path: str
    node_type: str
    visit: int
    status: str


@dataclass(frozen=True, slots=True)
class ResumeState:
    """Where a runner continues a run. No events, no history beyond this."""

    run_id: str
    revision: int
    """The run revision these facts were read at."""
    input: Any
    """The run's normalized input (decoded JSON)."""
    outputs: Mapping[str, Any]
    """Per node path, the decoded output of its LAST completed attempt (None if that
    attempt stored no output). Paths that never completed are absent."""
    visits: Mapping[str, int]
    """Per node path, how many attempts finished (completed, failed or timed out); the
    next visit of a path is this plus one (`next_visit`)."""
    finished: tuple[FinishedAttempt, ...]
    """Every finished attempt in execution order; interrupted and cancelled attempts are
    left out (they did not finish, and their node runs again at the same visit)."""
    unfinished: UnfinishedAttempt | None
    """The running or waiting attempt, if any (a waiting one continues in place)."""

    @property
    def completed(self) -> tuple[FinishedAttempt, ...]:
        """The completed attempts in execution order (empty: the run has not progressed)."""
        return tuple(attempt for attempt in self.finished if attempt.status == "completed")

    @property
    def last_finished(self) -> FinishedAttempt | None:
        """The most recent finished attempt, if any."""
        return self.finished[-1] if self.finished else None

    @property
    def last_completed_node_path(self) -> str | None:
        """The node path of the most recent completed attempt, if any."""
        for attempt in reversed(self.finished):
            if attempt.status == "completed":
                return attempt.node_path
        return None

    @property
    def next_node_path(self) -> str | None:
        """The route recorded by the most recent finished attempt: where to continue.

        None when nothing finished yet (start at the workflow's start node), or when the
        last finished attempt recorded no route (the end of the graph, or an unrouted
        failure).
        """
        last = self.last_finished
        return None if last is None else last.next_node_path

    def next_visit(self, node_path: str) -> int:
        """The visit number the next attempt of `node_path` gets."""
        return self.visits.get(node_path, 0) + 1

    def to_wire(self) -> dict[str, Any]:
        """The state as JSON for the runner's command (camelCase keys)."""
        unfinished = self.unfinished
        return {
            "runId": self.run_id,
            "revision": self.revision,
            "input": self.input,
            "outputs": dict(self.outputs),
            "visits": dict(self.visits),
            "finished": [
                {
                    "attemptId": a.attempt_id,
                    "nodePath": a.node_path,
                    "visit": a.visit,
                    "status": a.status,
                    "nextNodePath": a.next_node_path,
                    **({} if a.error is None else {"error": a.error}),
                }
                for a in self.finished
            ],
            "unfinished": None
            if unfinished is None
            else {
                "attemptId": unfinished.attempt_id,
                "nodePath": unfinished.node_path,
                "nodeType": unfinished.node_type,
                "visit": unfinished.visit,
                "status": unfinished.status,
            },
            "lastCompletedNodePath": self.last_completed_node_path,
            "nextNodePath": self.next_node_path,
        }


@dataclass(frozen=True, slots=True)
class _Head:
    input: str
    revision: int


@dataclass(frozen=True, slots=True)
class _AttemptRow:
    attempt_id: str
    node_path: str
    node_type: str
    visit: int
    status: str
    output_hash: str | None
    next_node_path: str | None
    error: str | None


def read_resume_state(reader: Reader, run_id: str) -> ResumeState:
    """Read what a runner needs to continue `run_id` from its last durable boundary.

    Call it in one transaction (or from the database actor, which serializes every
    statement) so the facts belong to one revision. Outputs are read whole from the
    blob store; the server measures the reply and sends large values by reference.

    Raises:
        RunNotFoundError: there is no such run.
        ContentUnavailableError: a stored output blob is missing or corrupt.
    """
    head = reader.fetch_one(q.SELECT_RUN_RESUME_HEAD, {"run_id": run_id}, _Head)
    if head is None:
        raise RunNotFoundError(run_id)
    rows = reader.fetch_all(q.SELECT_RESUME_ATTEMPTS, {"run_id": run_id}, _AttemptRow)
    last_output: dict[str, str | None] = {}
    visits: dict[str, int] = {}
    finished: list[FinishedAttempt] = []
    unfinished: UnfinishedAttempt | None = None
    for row in rows:
        if row.status in _FINISHED:
            visits[row.node_path] = visits.get(row.node_path, 0) + 1
            finished.append(
                FinishedAttempt(
                    row.attempt_id,
                    row.node_path,
                    row.visit,
                    row.status,
                    row.next_node_path,
                    None if row.error is None else row.error[:ERROR_TEXT],
                )
            )
            if row.status == "completed":
                last_output[row.node_path] = row.output_hash
        elif row.status in _UNFINISHED:
            unfinished = UnfinishedAttempt(
                row.attempt_id, row.node_path, row.node_type, row.visit, row.status
            )
    outputs = {
        path: None if digest is None else read_json_blob(reader, digest)
        for path, digest in last_output.items()
    }
    return ResumeState(
        run_id=run_id,
        revision=head.revision,
        input=orjson.loads(head.input),
        outputs=outputs,
        visits=visits,
        finished=tuple(finished),
        unfinished=unfinished,
    )
