"""`pi-workflows state backup DEST`: a verified copy of the live database, made by the
server (`state.backup`), shown as it goes.

Each invocation sends one fresh idempotency key (`--idempotency-key` sends an earlier
one again); if its connection is lost, it reconnects once and sends the same key, so
the server adopts the backup in flight or its stored receipt instead of copying twice.
Progress: a rich bar on a terminal (pages copied of how many), one line per stage
otherwise, JSON lines with `--json` (the last one is the receipt).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pi_workflows.cli._main import (
    EXIT_USAGE,
    _client,
    _client_errors,
    _fail,
    _print_json,
    state,
)
from pi_workflows.cli._progress import StageLines, json_line
from pi_workflows.wire.client import HostUnavailableError

__all__ = ["state_backup"]

BACKUP_READ_TIMEOUT_S = 600.0
"""How long the CLI waits for the next message of a backup (a verification of a large
database sends none while it runs)."""


def _check_destination(dest: Path, *, retry: bool) -> None:
    """The refusals the server would give, before a server is asked (or started). A
    retry's DEST may exist: the earlier attempt made it, and the server adopts that."""
    if not dest.is_absolute():
        _fail("DEST must be an absolute path (the new backup file)", EXIT_USAGE)
    if not retry and os.path.lexists(dest):
        _fail("DEST exists; name a new file (a backup never replaces one)", EXIT_USAGE)
    if not dest.parent.is_dir():
        _fail("the folder of DEST does not exist; create it first", EXIT_USAGE)


@state.command("backup")
@click.argument("dest", metavar="DEST", type=click.Path(dir_okay=True, path_type=Path))
@click.option(
    "--idempotency-key",
    "key",
    default=None,
    metavar="KEY",
    help="Send an earlier invocation's key (printed at its start with --json): its "
    "backup in flight, or its stored result, is the answer; no second copy is made.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON lines: progress, then the receipt."
)
@click.pass_context
@_client_errors
def state_backup(ctx: click.Context, dest: Path, key: str | None, as_json: bool) -> None:
    """Copy the live database to the new file DEST, verified, while the server serves.

    The server copies with SQLite's online backup API on its own connection, in steps,
    checks the copy read-only (integrity check, schema digest, every invariant), gives
    it mode 0600 and only then names it DEST. Restore: stop the server, keep the old
    state.sqlite aside, copy DEST to state.sqlite, start the server.

    Example: pi-workflows state backup /backups/state-2026-12-03.sqlite
    """
    _check_destination(dest, retry=key is not None)
    key = key or f"cli-backup-{uuid.uuid4().hex}"  # one key per invocation, kept on retry
    payload = {"path": os.fspath(dest), "progress": True}
    with _display(as_json, key) as show:
        try:
            receipt = _call(ctx, payload, key, show)
        except HostUnavailableError:
            receipt = _call(ctx, payload, key, show)  # the same invocation: adopted
    if as_json:
        _print_json({"stage": "done", **receipt})
        return
    earlier = receipt["outcome"] == "adopted"
    click.echo(
        f"backup verified: {receipt['pageCount']} pages, {receipt['byteCount']} bytes, "
        "mode 0600" + (" (made by an earlier attempt of this invocation)" if earlier else "")
    )


def _call(ctx: click.Context, payload: dict[str, Any], key: str, show: Any) -> dict[str, Any]:
    """The receipt, with `outcome`: `accepted`, or `adopted` (an earlier attempt's)."""
    client = _client(ctx)
    # One stable identity for the user's maintenance commands (client-protocol.md §
    # Maintenance): a retry by another process, with the key, is the same invocation.
    client.client_id = f"cli-{os.getuid()}-maintenance"
    client.timeout = BACKUP_READ_TIMEOUT_S
    client.event_sink = show
    with client:
        answer = client.call("state.backup", payload, idempotency_key=key)
    return {**answer["receipt"], "outcome": answer["outcome"]}


_STAGE_WORDS = {"copy": "copying {total} pages", "verify": "verifying the copy"}


@contextmanager
def _display(as_json: bool, key: str) -> Iterator[Any]:
    """A sink for `maintenanceProgress` events: JSON lines, a bar, or a line a stage."""
    if as_json:
        _print_json({"stage": "start", "idempotencyKey": key})
        yield json_line
        return
    console = Console(stderr=True)
    if not console.is_terminal:
        yield StageLines(_STAGE_WORDS)
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("pages"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("copy", total=None)

        def show(event: dict[str, Any]) -> None:
            if event.get("kind") != "maintenanceProgress":
                return
            body = event["payload"]
            if body["stage"] == "copy":
                bar.update(task, completed=body["done"], total=body["total"])
            else:
                bar.update(task, description="verify")

        yield show
