"""`pi-workflows run list` and `pi-workflows run logs` (issue 13, item 8).

Both read through `WorkflowClient` only: `run list` collects `run.list` pages of one
revision (`pi-workflows.run-list-page.v1`); `run logs` reads `run.logs`, which maps
the run to its shell results and its runner epochs' stderr logs on the server.
A terminal gets a rich table and coloured headers; a pipe gets plain text.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from pi_workflows.cli._main import (
    _client,
    _client_errors,
    _print_json,
    _settled,
    json_option,
    run,
)
from pi_workflows.cli._palette import styled
from pi_workflows.wire.client import WorkflowClient
from pi_workflows.wire.protocol import DISPLAY_STATUSES

__all__ = ["parse_since", "run_list", "run_logs"]

DEFAULT_LIST_LIMIT = 100
FOLLOW_POLL_S = 0.5
"""How often `run logs --follow` asks the server again (a read on the reader actor)."""
FOLLOW_EXIT_GRACE_S = 10.0
"""After the run settles, how long `--follow` waits for its runner epoch to exit."""
_RELATIVE = re.compile(r"^(\d{1,9})([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
SINCE_HELP = (
    "Only runs created at or after this time: ISO-8601 (2026-12-01T09:00, local time "
    "unless it names a zone, e.g. Z or +02:00) or a duration ago (30s, 30m, 1h, 2d, 1w)."
)


def parse_since(text: str, now: datetime | None = None) -> int:
    """`--since` as epoch milliseconds; raises ValueError with the accepted forms."""
    value = text.strip()
    relative = _RELATIVE.match(value)
    current = now or datetime.now(UTC)
    if relative:
        amount, unit = int(relative.group(1)), relative.group(2)
        moment = current - timedelta(seconds=amount * _UNITS[unit])
    else:
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(
                f"{text!r} is not a time; give ISO-8601 (2026-12-01T09:00, "
                "2026-12-01T09:00Z) or a duration ago (30m, 1h, 2d)"
            ) from None
        if moment.tzinfo is None:
            moment = moment.astimezone()  # a time without a zone is local time
    return max(0, int(moment.timestamp() * 1000))


def _since_option(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """Parse `--since` as click parses options: a bad value is one usage error (exit 2)."""
    if value is None:
        return None
    try:
        return parse_since(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


# --- run list -------------------------------------------------------------------------


@run.command("list")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice(DISPLAY_STATUSES),
    help="Only runs with this display status (repeat for several).",
)
@click.option("--workflow", default=None, help="Only runs of this workflow name.")
@click.option(
    "--project",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Only runs started for this project folder.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=DEFAULT_LIST_LIMIT,
    show_default=True,
    help="Show at most this many runs (the newest).",
)
@click.option("--since", metavar="TIME", callback=_since_option, default=None, help=SINCE_HELP)
@json_option
@click.pass_context
@_client_errors
def run_list(
    ctx: click.Context,
    *,
    statuses: tuple[str, ...],
    workflow: str | None,
    project: Path | None,
    limit: int,
    since: int | None,
    as_json: bool,
) -> None:
    """List runs, newest first: status, workflow, creation time and reason.

    The list is read as pages of one revision, so it is never a mix of two moments.
    A terminal gets a table; a pipe gets one line per run (tab-separated fields:
    run ID, status, workflow, created, reason). A run that completed because its
    checkpoint was answered says "continued as RUN_ID" as its reason: the workflow
    goes on in that run, and `run wait` of either waits for the workflow's end.

    Example: pi-workflows run list --status failed --since 1d
    """
    with _client(ctx) as client:
        listed = client.list_runs(
            status=list(statuses) or None,
            workflow=workflow,
            project=None if project is None else str(project.resolve()),
            since_ms=since,
            limit=limit,
        )
    items: list[Mapping[str, Any]] = [dict(item) for item in listed.items]
    if as_json:
        _print_json({"revision": listed.revision, "items": items, "truncated": listed.truncated})
        return
    if sys.stdout.isatty():
        _list_table(items)
    else:
        for item in items:
            fields = (item["runId"], item["display"]["status"], item["workflow"])
            click.echo("\t".join((*fields, _when(item["createdAt"]), _reason(item))))
    if listed.truncated:
        click.echo(f"(the newest {limit} shown; --limit N shows more)", err=True)


def _list_table(items: list[Mapping[str, Any]]) -> None:
    table = Table(box=None, header_style="bold")
    for column in ("RUN ID", "STATUS", "WORKFLOW", "CREATED", "REASON"):
        table.add_column(column, overflow="fold")
    for item in items:
        status = item["display"]["status"]
        table.add_row(
            item["runId"],
            styled(status),
            item["workflow"],
            _when(item["createdAt"]),
            _reason(item),
        )
    console = Console()
    if items:
        console.print(table)
    else:
        console.print("no runs match")


def _when(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _reason(item: Mapping[str, Any]) -> str:
    display = item["display"]
    if item.get("continuedBy"):  # completed with no output of its own: say where it went on
        return f"continued as {item['continuedBy']}"
    return str(display.get("reason") or display.get("failureClass") or "")


# --- run logs -------------------------------------------------------------------------


@dataclass
class _LogCursor:
    """Where the next `run.logs` request starts, and what was printed already."""

    since: int = 0
    after_key: str = ""
    offsets: dict[str, int] = field(default_factory=dict)
    """Runner epoch → bytes of its log printed (a live epoch, or a long log)."""
    printed: set[str] = field(default_factory=set)
    """Keys of entries printed whole."""
    headed: set[str] = field(default_factory=set)
    """Keys whose header was printed (a log printed in parts gets one header)."""
    live: bool = False
    """The last response had a live runner epoch."""


@run.command("logs")
@click.argument("run_id")
@click.option(
    "--follow",
    "-f",
    is_flag=True,
    help=f"Keep printing as attempts finish until the run settles (asks every "
    f"{FOLLOW_POLL_S:g} s).",
)
@json_option
@click.pass_context
@_client_errors
def run_logs(ctx: click.Context, run_id: str, follow: bool, as_json: bool) -> None:
    """Print a run's shell output and runner stderr, labelled by node and attempt.

    Each shell node's stdout and stderr, and the stderr of each runner of run RUN_ID
    (workflow prints, tracebacks), in the order they finished.

    The server maps the run to its runners; nothing another run or the server wrote
    is shown. With --json: one JSON document, or with --follow one JSON line per
    entry.

    Example: pi-workflows run logs run-0123abcd --follow
    """
    cursor = _LogCursor()
    emit = _JsonLines() if (as_json and follow) else _Collect() if as_json else _Text()
    with _client(ctx) as client:
        _drain(client, run_id, cursor, emit)
        if follow:
            _follow(client, run_id, cursor, emit)
    if isinstance(emit, _Collect):
        _print_json({"runId": run_id, "entries": emit.entries})


def _follow(client: WorkflowClient, run_id: str, cursor: _LogCursor, emit: _Emitter) -> None:
    """Poll until the run settles (as `run wait` means it) and its runner exited, then
    read once more from the start, so that an entry that finished in the same millisecond
    as a printed one is not missed."""
    settled_at: float | None = None
    while True:
        time.sleep(FOLLOW_POLL_S)  # polling a read: the interval is the design's, not a wait
        display = _drain(client, run_id, cursor, emit)
        if settled_at is None and _settled({"display": display}):
            settled_at = time.monotonic()
        if settled_at is not None and (
            not cursor.live or time.monotonic() - settled_at > FOLLOW_EXIT_GRACE_S
        ):
            break
    cursor.since, cursor.after_key = 0, ""
    _drain(client, run_id, cursor, emit)


def _drain(
    client: WorkflowClient, run_id: str, cursor: _LogCursor, emit: _Emitter
) -> dict[str, Any]:
    """Request until the server has nothing more now; print each new part once.

    Returns the run's display (as in the run list) from the last response.
    """
    while True:
        payload: dict[str, Any] = {"since": cursor.since, "afterKey": cursor.after_key}
        if cursor.offsets:
            payload["offsets"] = dict(cursor.offsets)
        receipt = client.call("run.logs", payload, run_id=run_id)["receipt"]
        cursor.live = False
        for entry in receipt["entries"]:
            _take(entry, cursor, emit)
        if not receipt["more"]:
            return dict(receipt.get("display") or {"status": "queued"})


def _take(entry: Mapping[str, Any], cursor: _LogCursor, emit: _Emitter) -> None:
    key = entry["key"]
    partial = entry.get("nextOffset") is not None
    if entry["kind"] == "runner":
        cursor.live = cursor.live or bool(entry["live"])
    if key not in cursor.printed:
        emit.entry(entry, header=key not in cursor.headed)
        cursor.headed.add(key)
    if entry["kind"] == "runner":
        epoch = entry["runnerEpoch"]
        if partial or entry["live"]:
            next_offset = entry.get("nextOffset")
            cursor.offsets[epoch] = entry["size"] if next_offset is None else next_offset
            return  # not whole yet: the cursor stays before it
        cursor.offsets.pop(epoch, None)
    cursor.printed.add(key)
    if entry["at"] is not None:
        cursor.since, cursor.after_key = entry["at"], key


class _Emitter:
    def entry(self, entry: Mapping[str, Any], *, header: bool) -> None:
        raise NotImplementedError


class _Collect(_Emitter):
    """--json: one document at the end; a log printed in parts is joined."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []
        self._by_key: dict[str, dict[str, Any]] = {}

    def entry(self, entry: Mapping[str, Any], *, header: bool) -> None:
        known = self._by_key.get(entry["key"])
        if known is not None:
            known["text"] = known.get("text", "") + entry.get("text", "")
            known.update({k: v for k, v in entry.items() if k not in ("text", "offset")})
            return
        copied = dict(entry)
        self._by_key[entry["key"]] = copied
        self.entries.append(copied)


class _JsonLines(_Emitter):
    def entry(self, entry: Mapping[str, Any], *, header: bool) -> None:
        _print_json(dict(entry))


class _Text(_Emitter):
    def entry(self, entry: Mapping[str, Any], *, header: bool) -> None:
        if entry["kind"] == "shell":
            self._shell(entry)
        else:
            if header:
                click.echo(click.style(_runner_header(entry), bold=True))
            _echo_text(entry.get("text", ""))

    def _shell(self, entry: Mapping[str, Any]) -> None:
        click.echo(click.style(_shell_header(entry), bold=True))
        for stream in ("stdout", "stderr"):
            text = entry.get(stream)
            if not text and not entry.get(f"{stream}OmittedBytes"):
                continue
            click.echo(click.style(f"[{stream}]", dim=True))
            _echo_text(text or "")
            omitted = entry.get(f"{stream}OmittedBytes")
            if omitted:
                click.echo(click.style(f"[{stream}: {omitted} more bytes not shown]", dim=True))


def _attempt_label(node: str, visit: int, attempt: int) -> str:
    return f"{node} (visit {visit}, attempt {attempt})"


def _shell_header(entry: Mapping[str, Any]) -> str:
    label = _attempt_label(entry["node"], entry["visit"], entry["attempt"])
    if entry.get("timedOut"):
        how = "timed out"
    elif entry.get("signal") is not None:
        how = f"signal {entry['signal']}"
    elif entry.get("exitCode") is not None:
        how = f"exit {entry['exitCode']}"
    else:
        how = entry["status"]
    return f"== shell {label}: {how} =="


def _runner_header(entry: Mapping[str, Any]) -> str:
    nodes = ", ".join(
        f"{n['node']}#{n['attempt']}" + (f" (visit {n['visit']})" if n["visit"] > 1 else "")
        for n in entry["nodes"]
    )
    state = "running" if entry["live"] else entry["status"]
    if entry.get("exitCode") is not None:
        state += f", exit {entry['exitCode']}"
    return f"== runner stderr, generation {entry['generation']} [{nodes or 'no node'}]: {state} =="


def _echo_text(text: str) -> None:
    if text:
        click.echo(text, nl=not text.endswith("\n"))
