"""`run.logs`: what a run's processes printed, mapped from the run (issue 13, item 8).

Two sources, both the run's own: the stdout and stderr a shell node's command wrote
(its stored result), and the stderr of each runner epoch of the run
(`<state dir>/logs/runners/<runner epoch>.log`: workflow code's prints, tracebacks).
The epochs come from `runner_epochs` for this run ID, so a user never names an epoch,
and no other run's log or any server log is ever read.

Entries are ordered by the time they finished (`at`), then by `key`; a live runner
epoch (no `at` yet) comes last. A response holds at most `TEXT_BUDGET` bytes of text;
`more` says another request (from the last complete entry) has the rest.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pi_workflows.storage import (
    ContentUnavailableError,
    NodeAttemptRow,
    Reader,
    RunnerEpochRow,
    list_attempts,
    list_runner_epochs,
    read_json_blob,
)

__all__ = [
    "STREAM_JSON_BYTES",
    "TEXT_BUDGET",
    "RunLogsQuery",
    "RunLogsQueryError",
    "parse_run_logs_query",
    "run_logs",
]

TEXT_BUDGET: Final = 600 * 1024
"""JSON bytes of text in one response (one entry may pass it by at most
`STREAM_JSON_BYTES` twice), well under the 1 MiB frame."""
STREAM_JSON_BYTES: Final = 160 * 1024
"""The JSON size of one text field: a shell stream's head, or one chunk of a runner log.
Bounded as JSON, not as bytes: control characters escape to six bytes each."""
_MAX_OFFSETS: Final = 8
_MAX_TIME_MS: Final = 2**53 - 1


class RunLogsQueryError(ValueError):
    """A `run.logs` payload the server refuses: `code` is the safe error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class RunLogsQuery:
    since: int = 0
    """Entries finished at or after this time (epoch ms)..."""
    after_key: str = ""
    """... and, at exactly `since`, with a key after this one."""
    offsets: Mapping[str, int] | None = None
    """Runner epoch → bytes of its log the client already has."""


def parse_run_logs_query(payload: Mapping[str, Any]) -> RunLogsQuery:
    """Check a `run.logs` payload; raises `RunLogsQueryError` with a safe message."""
    unknown = sorted(set(payload) - {"since", "afterKey", "offsets"})
    if unknown:
        raise RunLogsQueryError("payloadInvalid", f"unknown run.logs field {unknown[0]}")
    since = payload.get("since", 0)
    if isinstance(since, bool) or not isinstance(since, int) or not 0 <= since <= _MAX_TIME_MS:
        raise RunLogsQueryError("payloadInvalid", "since must be epoch milliseconds")
    after_key = payload.get("afterKey", "")
    if not isinstance(after_key, str) or len(after_key) > 300:
        raise RunLogsQueryError("payloadInvalid", "afterKey must be an entry key")
    offsets = payload.get("offsets", {})
    if (
        not isinstance(offsets, dict)
        or len(offsets) > _MAX_OFFSETS
        or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in offsets.values()
        )
    ):
        raise RunLogsQueryError(
            "payloadInvalid", f"offsets maps at most {_MAX_OFFSETS} runner epochs to byte counts"
        )
    return RunLogsQuery(since, after_key, offsets)


def run_logs(reader: Reader, run_id: str, query: RunLogsQuery, state_dir: Path) -> dict[str, Any]:
    """The receipt of `run.logs` for an existing run; call it in one read transaction."""
    attempts = list_attempts(reader, run_id)
    numbers = _attempt_numbers(attempts)
    entries: list[tuple[int | None, str, Any]] = []
    for attempt in attempts:
        if attempt.node_type == "shell" and attempt.finished_at is not None:
            entries.append((attempt.finished_at, f"shell:{attempt.attempt_id}", attempt))
    for epoch in list_runner_epochs(reader, run_id):
        entries.append((epoch.finished_at, f"runner:{epoch.runner_epoch}", epoch))
    entries.sort(key=lambda e: (e[0] is None, e[0] or 0, e[1]))
    offsets = query.offsets or {}
    budget = TEXT_BUDGET
    shown: list[dict[str, Any]] = []
    more = False
    for at, key, row in entries:
        if at is not None and (at, key) <= (query.since, query.after_key):
            continue
        if isinstance(row, NodeAttemptRow):
            entry = _shell_entry(reader, row, numbers[row.attempt_id])
        else:
            room = min(budget, STREAM_JSON_BYTES) if shown else STREAM_JSON_BYTES
            entry = _runner_entry(row, attempts, numbers, state_dir, offsets, room)
        size = _text_bytes(entry)
        if shown and size > budget:
            more = True  # it goes first in the next response
            break
        entry["key"], entry["at"] = key, at
        budget -= size
        shown.append(entry)
        if entry.get("nextOffset") is not None:
            more = True  # this log continues; the next request starts at its offset
            break
    return {"runId": run_id, "entries": shown, "more": more}


def _attempt_numbers(attempts: list[NodeAttemptRow]) -> dict[str, int]:
    """Each attempt's number among the attempts of its node visit (1, 2, ...)."""
    seen: dict[tuple[str, int], int] = {}
    numbers: dict[str, int] = {}
    for attempt in attempts:
        slot = (attempt.node_path, attempt.visit)
        seen[slot] = seen.get(slot, 0) + 1
        numbers[attempt.attempt_id] = seen[slot]
    return numbers


def _shell_entry(reader: Reader, attempt: NodeAttemptRow, number: int) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "kind": "shell",
        "node": attempt.node_path,
        "visit": attempt.visit,
        "attempt": number,
        "status": attempt.status,
    }
    result: Any = None
    if attempt.output_hash is not None:
        try:
            result = read_json_blob(reader, attempt.output_hash)
        except ContentUnavailableError:
            entry["unavailable"] = True
    if not isinstance(result, dict):
        return entry  # no stored result: the command did not finish (a failed attempt)
    for field in ("exitCode", "signal", "timedOut"):
        if field in result:
            entry[field] = result[field]
    for stream in ("stdout", "stderr"):
        text = result.get(stream)
        if not isinstance(text, str):
            continue
        data = text.encode("utf-8")
        head, used = _fit(data, STREAM_JSON_BYTES)
        entry[stream] = head
        dropped = result.get(f"{stream}TruncatedBytes")
        omitted = len(data) - used + (dropped if isinstance(dropped, int) else 0)
        if omitted:
            entry[f"{stream}OmittedBytes"] = omitted
    return entry


def _fit(data: bytes, limit: int) -> tuple[str, int]:
    """The longest head of `data` (halving) whose JSON string is at most `limit` bytes,
    and how many bytes of `data` it holds."""
    n = min(len(data), limit - 2)  # 2: the quotes
    while True:
        text = data[:n].decode("utf-8", "replace")  # a cut character shows as U+FFFD
        if _json_bytes(text) <= limit or n == 0:
            return text, n
        n //= 2


def _runner_entry(  # noqa: PLR0917 (one private call site)
    epoch: RunnerEpochRow,
    attempts: list[NodeAttemptRow],
    numbers: dict[str, int],
    state_dir: Path,
    offsets: Mapping[str, int],
    budget: int,
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "kind": "runner",
        "runnerEpoch": epoch.runner_epoch,
        "generation": epoch.generation,
        "status": epoch.status,
        "live": epoch.finished_at is None,
        "nodes": [
            {"node": a.node_path, "visit": a.visit, "attempt": numbers[a.attempt_id]}
            for a in attempts
            if a.generation == epoch.generation
        ],
    }
    for field, value in (("exitCode", epoch.exit_code), ("signal", epoch.signal)):
        if value is not None:
            entry[field] = value
    path = state_dir / "logs" / "runners" / f"{epoch.runner_epoch}.log"
    try:
        with path.open("rb") as log:
            size = log.seek(0, 2)
            offset = min(offsets.get(epoch.runner_epoch, 0), size)
            log.seek(offset)
            data = log.read(budget)
    except FileNotFoundError:
        size, offset, data = 0, 0, b""
    text, used = _fit(data, budget)
    entry.update(offset=offset, size=size, text=text)
    if offset + used < size:
        entry["nextOffset"] = offset + used
    return entry


def _json_bytes(text: str) -> int:
    return len(json.dumps(text, ensure_ascii=False).encode("utf-8"))


def _text_bytes(entry: Mapping[str, Any]) -> int:
    return sum(_json_bytes(entry.get(k, "")) for k in ("stdout", "stderr", "text"))
