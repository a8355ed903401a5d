"""`pi-workflows state prune`: list, or delete after a verified backup, expired run trees.

The server does the work (`state.prune`, domain/_state_prune.py); the CLI never opens
SQLite. Each invocation sends one fresh idempotency key; if its connection is lost, it
reconnects once and sends the same key again, so the server adopts the result of the
prune in flight instead of running a second one. An applied prune shows its progress:
a rich bar on a terminal (pages backed up, then trees deleted, of how many), one line
per stage otherwise, JSON lines with `--json` (the last one is the receipt).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pi_workflows.cli._main import (
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    _client,
    _client_errors,
    _fail,
    _print_json,
    json_option,
    state,
)
from pi_workflows.cli._progress import StageLines, json_line
from pi_workflows.wire.client import HostUnavailableError, RequestFailedError

DEFAULT_OLDER_THAN_DAYS = 30
"""The domain's default age, copied so the command line does not load the domain
(test_light_imports pins the copy)."""

__all__ = ["state_prune"]


@state.command("prune")
@click.option(
    "--older-than",
    "older_than",
    type=click.IntRange(min=0, max=36_500),
    default=DEFAULT_OLDER_THAN_DAYS,
    metavar="DAYS",
    help="Only root-run trees whose every run finished more than DAYS days ago.",
)
@click.option("--apply", is_flag=True, help="Delete them (without it: only list them).")
@click.option(
    "--backup",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="With --apply: the absolute path of a new file the server backs the database up "
    "to, and verifies, before it deletes anything.",
)
@json_option
@click.pass_context
@_client_errors
def state_prune(
    ctx: click.Context, older_than: int, apply: bool, backup: Path | None, as_json: bool
) -> None:
    """List (default) or delete expired terminal run trees and their content.

    A root run with its restarts and continuations goes only when every run of it is
    terminal, finished before the cutoff, and holds no protected state (a live queue
    row, a pending interaction, decision or message, an unsettled effect, a lease or a
    runner). Pruned runs disappear from `run list` and `run show`. Without --apply
    nothing is deleted.

    Example: pi-workflows state prune --older-than 30 --apply --backup /backups/state.sqlite
    """
    payload: dict[str, Any] = {"olderThanDays": older_than}
    if apply:
        if backup is None:
            _fail(
                "--apply needs --backup ABS_PATH (a new file for the verified backup)", EXIT_USAGE
            )
        if not backup.is_absolute():
            _fail("--backup must be an absolute path", EXIT_USAGE)
        payload.update(apply=True, backupPath=os.fspath(backup), progress=True)
    elif backup is not None:
        _fail("--backup is only used with --apply", EXIT_USAGE)
    key = f"cli-prune-{uuid.uuid4().hex}"  # one key per invocation, kept across one retry
    # A backup this invocation did not find but the server does was written by its own
    # first attempt: the server went away after it, during the deletions.
    ours = backup is not None and not os.path.lexists(backup)
    with _display(apply, as_json, key) as show:
        try:
            receipt = _call(ctx, payload, key, show)
        except HostUnavailableError:
            if not apply:
                raise
            receipt = _retry_lost(ctx, payload, key, show)
        except RequestFailedError as exc:
            if apply and ours and exc.code == "backupExists":
                _fail(INTERRUPTED, EXIT_UNAVAILABLE)
            raise
    if as_json:
        _print_json({"stage": "done", **receipt} if apply else receipt)
        return
    _echo(receipt)


INTERRUPTED = (
    "the server went away during the deletions: some trees may already be gone (each "
    "tree is deleted whole or not at all). Run `state prune` again to list what is left; "
    "an applied prune also collects the blobs the deleted trees left behind."
)
LOST = (
    "the server went away during the prune: if it had begun the deletions, some trees "
    "may already be gone. Run `state prune` again to list what is left."
)


def _retry_lost(
    ctx: click.Context, payload: dict[str, Any], key: str, show: Sink | None
) -> dict[str, Any]:
    """The connection was lost mid-apply: send the same key once more, so a live server
    adopts the prune in flight or its stored receipt. A server that died meanwhile
    cannot: its successor finds the verified backup there already (the deletions had
    begun) or is not reachable at all; either way the user is told what may be gone."""
    try:
        return _call(ctx, payload, key, show)
    except RequestFailedError as exc:
        if exc.code != "backupExists":
            raise
        _fail(INTERRUPTED, EXIT_UNAVAILABLE)
    except HostUnavailableError:
        _fail(LOST, EXIT_UNAVAILABLE)


def _call(
    ctx: click.Context, payload: dict[str, Any], key: str, show: Sink | None
) -> dict[str, Any]:
    client = _client(ctx)
    if show is not None:
        client.timeout = PRUNE_READ_TIMEOUT_S
        client.event_sink = show
    with client:
        answer = client.call("state.prune", payload, idempotency_key=key)
    return dict(answer["receipt"])


Sink = Callable[[dict[str, Any]], None]
PRUNE_READ_TIMEOUT_S = 600.0
"""How long an applied prune waits for its next message (its backup's verification of a
large database, and the last blob pass, send none while they run)."""
_UNITS = {"copy": "pages", "verify": "pages", "delete": "trees", "collect": ""}
_STAGE_WORDS = {
    "copy": "backing up: copying {total} pages",
    "verify": "verifying the backup",
    "delete": "deleting {total} run trees",
    "collect": "collecting unreferenced blobs",
}


@contextmanager
def _display(apply: bool, as_json: bool, key: str) -> Iterator[Sink | None]:
    """A sink for an applied prune's `maintenanceProgress` events: JSON lines, a bar,
    or a line a stage (None for a dry run, which sends none)."""
    if not apply:
        yield None
        return
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
        TextColumn("{task.fields[unit]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("backup", total=None, unit="pages")

        def show(event: dict[str, Any]) -> None:
            if event.get("kind") != "maintenanceProgress":
                return
            body = event["payload"]
            stage = body["stage"]
            bar.update(
                task,
                description={"copy": "backup"}.get(stage, stage),
                completed=body["done"],
                total=body["total"] or None,
                unit=_UNITS.get(stage, ""),
            )

        yield show


def _echo(receipt: dict[str, Any]) -> None:
    verb = "pruned" if receipt["applied"] else "would prune"
    click.echo(
        f"{verb} {receipt['treeCount']} run trees ({receipt['runCount']} runs) finished more "
        f"than {receipt['olderThanDays']} days ago"
    )
    for run_id in receipt["runIds"]:
        click.echo(f"  {run_id}")
    if receipt["truncated"]:
        click.echo(f"  ... and {receipt['runCount'] - len(receipt['runIds'])} more")
    if receipt["keptProtected"]:
        click.echo(f"kept {receipt['keptProtected']} expired trees that hold protected state")
    if receipt.get("skipped"):
        click.echo(f"kept {receipt['skipped']} trees that changed since they were selected")
    if receipt["applied"]:
        backup = receipt["backup"]
        click.echo(
            f"backup verified ({backup['byteCount']} bytes); "
            f"{receipt['blobsDeleted']} unreferenced blobs deleted"
        )
    else:
        unnamed = receipt.get("unnamedBlobs", 0)
        if unnamed:
            click.echo(f"{unnamed} blobs that no row names would be collected")
        if receipt["treeCount"] or unnamed:
            click.echo("nothing deleted; add --apply --backup ABS_PATH to delete them")
