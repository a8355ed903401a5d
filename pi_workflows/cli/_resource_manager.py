"""`pi-workflows resource-manager list|get|apply|reconcile|delete`: resources by the client
protocol's `resourceManager.*` operations.

The server owns resources; `apply` resolves the manager in a resolver child there (the
CLI never imports a manager file). `get` prints the resource with its conditions, child
runs, effects and recent passes: rich tables on a terminal, plain lines otherwise,
`--json` the server's view whole.
"""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import click
from click.shell_completion import CompletionItem
from click.types import StringParamType
from rich.console import Console
from rich.table import Table
from rich.text import Text

from pi_workflows.cli._completion import _state_dir as _completion_state_dir
from pi_workflows.cli._main import (
    EXIT_USAGE,
    _client,
    _client_errors,
    _fail,
    _print_json,
    json_option,
    main,
)
from pi_workflows.wire.canonical import CanonicalJSONError, dumps
from pi_workflows.wire.client import RequestFailedError
from pi_workflows.wire.framing import MAX_FRAME_BYTES

__all__ = ["SPEC_SEND_LIMIT", "ManagerNameType", "get_lines", "resource_manager", "show_rich"]

MAX_SPEC_BYTES = 1024 * 1024
"""The engine's limit on a spec, copied so the command line does not load the engine
(test_light_imports pins the copy)."""
ENVELOPE_ROOM = 8192
"""Bytes of one request frame kept for the envelope, the manager, key and project."""
SPEC_SEND_LIMIT = min(MAX_SPEC_BYTES, MAX_FRAME_BYTES - ENVELOPE_ROOM)
"""The largest spec `apply` sends: a spec is at most 1 MiB, and it travels in one frame."""


class ManagerNameType(StringParamType):
    """A manager name: any string; completes from discovery (files listed, never
    imported; no server needed)."""

    name = "manager"

    def shell_complete(
        self, ctx: click.Context, param: click.Parameter, incomplete: str
    ) -> list[CompletionItem]:
        try:
            project = ctx.params.get("project")
            root = Path(project) if project else Path.cwd()
            from pi_workflows.engine import (  # noqa: PLC0415 (only when completing names)
                discover_managers,
            )

            found = discover_managers(root.resolve(), _completion_state_dir(ctx).parent)
        except Exception:  # noqa: BLE001  (completion completes nothing rather than fail)
            return []
        return [
            CompletionItem(name, help=source.origin)
            for name, source in found.items()
            if name.startswith(incomplete)
        ]


_project_option = click.option(
    "--project",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=None,
    help="Project folder the resource belongs to, whose .pi/resource-managers/ is searched "
    "first (default: the current one).",
)


@main.group("resource-manager")
def resource_manager() -> None:
    """Resources kept in their requested state by resource managers.

    A manager is a `NAME.resource_manager.py` file in <project>/.pi/resource-managers/
    or <agent dir>/resource-managers/; a resource is one (manager, key) in a project.

    Example: pi-workflows resource-manager list
    """


def _payload(manager: str, key: str, project: Path | None) -> dict[str, Any]:
    return {
        "manager": manager,
        "key": key,
        "projectPath": str((project or Path.cwd()).resolve()),
    }


def _call(ctx: click.Context, operation: str, payload: dict[str, Any]) -> dict[str, Any]:
    """One request; a missing manager is reported beside the name the user typed (the
    server never echoes it: its answer is stored as the receipt)."""
    with _client(ctx) as client:
        try:
            receipt: dict[str, Any] = client.call(operation, payload)["receipt"]
        except RequestFailedError as exc:
            if exc.code != "resourceManagerNotFound":
                raise
            _fail(f"{exc.outcome}: resource manager {payload['manager']!r}: {exc}")
    return receipt


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S") + "Z"


def _ready(conditions: list[dict[str, Any]]) -> str:
    """`Ready=True`-style words of the conditions (`-` without any)."""
    return ", ".join(f"{c.get('type')}={c.get('status')}" for c in conditions) or "-"


def _queue_words(queue: dict[str, Any] | None, reconciling: bool = False) -> str:
    if reconciling:
        return "reconciling"
    if queue is None:
        return "settled"
    retries = f", retry {queue['retries']}" if queue.get("retries") else ""
    return f"queued ({queue.get('reason') or 'due'}) due {_when(queue['availableAt'])}{retries}"


# --- list ------------------------------------------------------------------------------


@resource_manager.command("list")
@click.option("--manager", default=None, help="Only this manager's resources.")
@click.option(
    "--project",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=None,
    help="Only this project's resources (default: every project's).",
)
@json_option
@click.pass_context
@_client_errors
def rm_list(ctx: click.Context, manager: str | None, project: Path | None, as_json: bool) -> None:
    """List resources: manager, key, generation, conditions and delivery state.

    Example: pi-workflows resource-manager list --json
    """
    payload: dict[str, Any] = {} if manager is None else {"manager": manager}
    if project is not None:
        payload["projectPath"] = str(project.resolve())
    with _client(ctx) as client:
        receipt = client.call("resourceManager.list", payload)["receipt"]
    if as_json:
        _print_json(receipt)
        return
    resources = receipt["resources"]
    if not resources:
        click.echo("no resources (`pi-workflows resource-manager apply MANAGER KEY` adds one)")
        return
    for item in resources:
        deleting = " deleting" if item.get("deletionRequestedAt") is not None else ""
        click.echo(
            f"{item['manager']}/{item['key']}  gen {item['generation']} "
            f"(observed {item['observedGeneration']})  v{item['resourceVersion']}  "
            f"{_ready(item['conditions'])}  "
            f"{_queue_words(item['queue'], item['reconciling'])}{deleting}"
        )


# --- get -------------------------------------------------------------------------------


def _summary(view: dict[str, Any]) -> list[tuple[str, str]]:
    resource = view["resource"]
    rows = [
        ("uid", resource["uid"]),
        ("project", resource["project"]),
        (
            "generation",
            f"{resource['generation']} (observed {resource['observedGeneration']})",
        ),
        ("resource version", str(resource["resourceVersion"])),
        ("queue", _queue_words(view["queue"])),
        ("finalizers", ", ".join(resource["finalizers"]) or "-"),
        ("spec", json.dumps(resource["spec"], sort_keys=True, ensure_ascii=False)),
        ("status", json.dumps(resource["status"], sort_keys=True, ensure_ascii=False)),
        ("created", _when(resource["createdAt"])),
        ("updated", _when(resource["updatedAt"])),
    ]
    if resource.get("deletionRequestedAt") is not None:
        rows.append(("deletion requested", _when(resource["deletionRequestedAt"])))
    return rows


def _sections(view: dict[str, Any]) -> Iterator[tuple[str, list[str], list[list[str]]]]:
    """(title, columns, rows) of the conditions, child runs, effects and recent passes."""
    yield (
        "conditions",
        ["type", "status", "reason", "message", "observed gen"],
        [
            [
                str(c.get("type")),
                str(c.get("status")),
                str(c.get("reason") or "-"),
                str(c.get("message") or "-"),
                str(c.get("observedGeneration", "-")),
            ]
            for c in view["resource"]["conditions"]
        ],
    )
    yield (
        "child runs",
        ["request key", "workflow", "run", "status"],
        [[c["requestKey"], c["workflow"], c["runId"], c["status"]] for c in view["childRuns"]],
    )
    yield (
        "effects",
        ["key", "kind", "state", "updated"],
        [[e["key"], e["kind"], e["state"], _when(e["updatedAt"])] for e in view["effects"]],
    )
    yield (
        "recent passes",
        ["started", "generation", "outcome", "took", "reason"],
        [
            [
                _when(p["startedAt"]),
                str(p["generation"]),
                p["outcome"],
                "-" if p["durationMs"] is None else f"{p['durationMs']} ms",
                p.get("requeueReason") or p.get("errorClass") or "-",
            ]
            for p in view["recentPasses"]
        ],
    )


def get_lines(view: dict[str, Any]) -> list[str]:
    """The plain form of `get` (pipes, scripts, tests)."""
    resource = view["resource"]
    lines = [f"resource {resource['manager']}/{resource['key']}"]
    lines += [f"  {label}: {text}" for label, text in _summary(view)]
    for title, columns, rows in _sections(view):
        if not rows:
            lines.append(f"{title}: none")
            continue
        lines.append(f"{title}:")
        lines += [
            "  " + "  ".join(f"{c}={v}" for c, v in zip(columns, row, strict=True)) for row in rows
        ]
    return lines


def show_rich(view: dict[str, Any], console: Console | None = None) -> None:
    """The terminal form of `get`: a summary and one table per non-empty section."""
    console = console or Console()
    resource = view["resource"]
    console.print(Text(f"resource {resource['manager']}/{resource['key']}", style="bold"))
    summary = Table(show_header=False, box=None, pad_edge=False)
    summary.add_column(style="bold")
    summary.add_column(overflow="fold")
    for label, text in _summary(view):
        summary.add_row(label, Text(text))
    console.print(summary)
    for title, columns, rows in _sections(view):
        if not rows:
            console.print(Text(f"{title}: none", style="dim"))
            continue
        table = Table(title=title, title_justify="left")
        for column in columns:
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(*(Text(cell) for cell in row))
        console.print(table)


@resource_manager.command("get")
@click.argument("manager", type=ManagerNameType())
@click.argument("key")
@_project_option
@json_option
@click.pass_context
@_client_errors
def rm_get(ctx: click.Context, manager: str, key: str, project: Path | None, as_json: bool) -> None:
    """Show one resource: spec, status, conditions, child runs, effects, recent passes.

    Example: pi-workflows resource-manager get review-pr pr-42
    """
    view = _call(ctx, "resourceManager.get", _payload(manager, key, project))
    if as_json:
        _print_json(view)
    elif sys.stdout.isatty():
        show_rich(view)
    else:
        for line in get_lines(view):
            click.echo(line)


# --- commands --------------------------------------------------------------------------


def _read_spec(spec_json: str | None, spec_file: BinaryIO | None) -> Any:
    """The spec from --spec-json or --spec-file, checked for size before it is sent."""
    if (spec_json is None) == (spec_file is None):
        _fail("give the spec with exactly one of --spec-json and --spec-file", EXIT_USAGE)
    text = spec_json if spec_file is None else spec_file.read(SPEC_SEND_LIMIT * 2 + 1)
    try:
        spec = json.loads(text or "")
    except (json.JSONDecodeError, UnicodeDecodeError):
        _fail("the spec is not valid JSON; pass a value such as '{\"pr\": 42}'", EXIT_USAGE)
    try:
        size = len(dumps(spec))
    except CanonicalJSONError as exc:
        _fail(f"the spec is not plain JSON: {exc}", EXIT_USAGE)
    if size > SPEC_SEND_LIMIT:
        _fail(
            f"the spec is {size} bytes of JSON; apply sends at most {SPEC_SEND_LIMIT} bytes "
            f"(a spec is at most {MAX_SPEC_BYTES})",
            EXIT_USAGE,
        )
    return spec


@resource_manager.command("apply")
@click.argument("manager", type=ManagerNameType())
@click.argument("key")
@click.option("--spec-json", default=None, help="The resource's spec as JSON.")
@click.option(
    "--spec-file",
    type=click.File("rb"),
    default=None,
    help="Read the spec's JSON from this file instead ('-': standard input); for a spec "
    "too long for one command-line argument.",
)
@_project_option
@json_option
@click.pass_context
@_client_errors
def rm_apply(
    ctx: click.Context,
    *,
    manager: str,
    key: str,
    spec_json: str | None,
    spec_file: BinaryIO | None,
    project: Path | None,
    as_json: bool,
) -> None:
    """Create resource KEY of MANAGER, or give it a new spec.

    The server loads the manager in a resolver child (its spec_schema and
    initial_status), then checks the file is still the one discovery finds. The same
    spec again changes nothing; another spec raises the generation. Prints
    `MANAGER/KEY generation N` (--json: the receipt). Give the spec with --spec-json
    or --spec-file.

    Example: pi-workflows resource-manager apply review-pr pr-42 --spec-json '{"pr": 42}'
    """
    spec = _read_spec(spec_json, spec_file)
    payload = {**_payload(manager, key, project), "spec": spec}
    receipt = _call(ctx, "resourceManager.apply", payload)
    if as_json:
        _print_json(receipt)
        return
    change = (
        "created"
        if receipt["created"]
        else "new spec"
        if receipt["specChanged"]
        else "updated"
        if receipt["changed"]
        else "unchanged"
    )
    click.echo(
        f"{manager}/{key} generation {receipt['generation']} "
        f"version {receipt['resourceVersion']} ({change})"
    )


@resource_manager.command("reconcile")
@click.argument("manager", type=ManagerNameType())
@click.argument("key")
@_project_option
@json_option
@click.pass_context
@_client_errors
def rm_reconcile(
    ctx: click.Context, manager: str, key: str, project: Path | None, as_json: bool
) -> None:
    """Ask for a reconcile pass of KEY now (a wake-up hint: the pass re-reads everything).

    Example: pi-workflows resource-manager reconcile review-pr pr-42
    """
    receipt = _call(ctx, "resourceManager.reconcile", _payload(manager, key, project))
    if as_json:
        _print_json(receipt)
    else:
        click.echo(f"{manager}/{key} queued, due {_when(receipt['availableAt'])}")


@resource_manager.command("delete")
@click.argument("manager", type=ManagerNameType())
@click.argument("key")
@_project_option
@json_option
@click.pass_context
@_client_errors
def rm_delete(
    ctx: click.Context, manager: str, key: str, project: Path | None, as_json: bool
) -> None:
    """Delete KEY: at once without finalizers, else after the manager's cleanup pass.

    Example: pi-workflows resource-manager delete review-pr pr-42
    """
    receipt = _call(ctx, "resourceManager.delete", _payload(manager, key, project))
    if as_json:
        _print_json(receipt)
    elif receipt["removed"]:
        click.echo(f"{manager}/{key} deleted")
    else:
        held = ", ".join(receipt["finalizers"])
        click.echo(f"{manager}/{key} is being deleted; waiting for its finalizers: {held}")
