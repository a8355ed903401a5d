"""Shell completion for `pi-workflows`: commands, workflow names and run IDs.

Click completes commands and options by itself once the shell script is installed
(`pi-workflows completion bash|zsh|fish` prints it). This module adds the values:

- workflow names (`run start NAME`, `--workflow`) from the discovery the CLI already
  does (`.pi/workflows/` of the project, then the agent folder): files are listed, never
  imported, and no server is needed;
- run IDs (every `RUN_ID` argument) through `run.list` over the server socket, the
  newest `RUN_ID_PAGES` pages, and only runs that allow the command by their display
  status (`ALLOWED_STATUSES`: no completed run for `run cancel`). The CLI never opens
  SQLite.

Completion must never hang or start a server: the client does not autostart, every
request has a short timeout, and any failure (no server, a stale socket, an error)
completes nothing.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Final

import click
from click.shell_completion import CompletionItem, get_completion_class
from click.types import StringParamType

from pi_workflows._paths import workflows_dir
from pi_workflows.wire.client import WorkflowClient

__all__ = [
    "ALLOWED_STATUSES",
    "COMPLETE_VAR",
    "RUN_ID_PAGES",
    "SHELLS",
    "RunIdType",
    "WorkflowNameType",
    "allows",
    "complete_run_ids",
    "complete_workflow_names",
    "completion_script",
    "install_completion",
]

COMPLETE_VAR: Final = "_PI_WORKFLOWS_COMPLETE"
"""The variable click's completion protocol uses for the `pi-workflows` program."""
SHELLS: Final = ("bash", "zsh", "fish")
RUN_ID_PAGES: Final = 4
"""How many run-list pages (256 runs each, newest first) run-ID completion reads."""
_PAGE_ITEMS: Final = 256
_REQUEST_TIMEOUT_S: Final = 1.0
_TOTAL_BUDGET_S: Final = 2.0
"""Completion gives up after this long in all: a shell waits for it on every Tab."""

_TERMINAL: Final = frozenset({"completed", "failed", "timed_out", "cancelled"})
_UNFINISHED: Final = frozenset({"queued", "running", "waiting", "paused", "ambiguous"})
ALLOWED_STATUSES: Final[dict[str, frozenset[str]]] = {
    "run cancel": _UNFINISHED,
    "run pause": frozenset({"queued", "running", "waiting"}),
    "run resume": frozenset({"paused", "queued"}),  # a queued run only when parked
    "run restart": _TERMINAL,
    "run answer": frozenset({"waiting"}),
    "decision answer": frozenset({"waiting"}),
    "run recover": frozenset({"ambiguous"}),
}
"""The display statuses of the runs a command accepts, by command path (the controls of
the run view allow the same); any other command completes every run."""


def _state_dir(ctx: click.Context) -> Path:
    """The `--state-dir` of the command line being completed, else the default.

    During completion click parses without calling the group callback, so `ctx.obj`
    is unset; the root context's parsed parameters still hold the option.
    """
    value = ctx.find_root().params.get("state_dir")
    return (Path(value) if value else workflows_dir()).absolute()


def complete_run_ids(ctx: click.Context, incomplete: str) -> list[CompletionItem]:
    """Run IDs starting with `incomplete` of runs that allow the command being completed,
    newest first, from a running server only."""
    try:
        return _run_ids(_state_dir(ctx), incomplete, _command_path(ctx))
    except Exception:  # noqa: BLE001  (completion completes nothing rather than fail)
        return []


def _command_path(ctx: click.Context) -> str:
    """`run cancel` for the context of `pi-workflows run cancel` (the root left out)."""
    names: list[str] = []
    current: click.Context | None = ctx
    while current is not None and current.parent is not None:
        names.append(current.info_name or "")
        current = current.parent
    return " ".join(reversed(names))


def allows(command: str, item: dict[str, Any]) -> bool:
    """Whether the run of run-list `item` allows `command` (a command path) now."""
    allowed = ALLOWED_STATUSES.get(command)
    if allowed is None:
        return True
    display = item.get("display", {})
    status = display.get("status", "")
    if command == "run resume" and status == "queued":
        return bool(display.get("reason"))  # parked for a reason, not merely queued
    return status in allowed


def _run_ids(state_dir: Path, incomplete: str, command: str) -> list[CompletionItem]:
    client = WorkflowClient(
        state_dir,
        client_id=f"cli-complete-{os.getuid()}-{os.getpid()}",
        autostart=False,
        timeout=_REQUEST_TIMEOUT_S,
        connect_on_enter=False,
    )
    deadline = time.monotonic() + _TOTAL_BUDGET_S
    items: list[CompletionItem] = []
    try:
        cursor: str | None = None
        for _ in range(RUN_ID_PAGES):
            payload: dict[str, Any] = {"limit": _PAGE_ITEMS}
            if cursor is not None:
                payload["cursor"] = cursor
            page = client.call("run.list", payload)["receipt"]
            for item in page["items"]:
                run_id = str(item["runId"])
                if run_id.startswith(incomplete) and allows(command, item):
                    status = item.get("display", {}).get("status", "")
                    items.append(CompletionItem(run_id, help=f"{item['workflow']} {status}"))
            cursor = page.get("nextCursor")
            if cursor is None or time.monotonic() > deadline:
                break
    finally:
        client.close()
    return items


def complete_workflow_names(ctx: click.Context, incomplete: str) -> list[CompletionItem]:
    """Discovered workflow names starting with `incomplete` (files listed, not imported)."""
    try:
        project = ctx.params.get("project")
        root = Path(project) if project else Path.cwd()
        from pi_workflows.engine import discover  # noqa: PLC0415 (only when completing names)

        found = discover(root.resolve(), _state_dir(ctx).parent)
    except Exception:  # noqa: BLE001  (completion completes nothing rather than fail)
        return []
    return [
        CompletionItem(name, help=str(source.origin))
        for name, source in sorted(found.items())
        if name.startswith(incomplete)
    ]


class RunIdType(StringParamType):
    """A run ID: any string; completes from the running server's run list."""

    name = "run_id"

    def shell_complete(
        self, ctx: click.Context, param: click.Parameter, incomplete: str
    ) -> list[CompletionItem]:
        return complete_run_ids(ctx, incomplete)


class WorkflowNameType(StringParamType):
    """A workflow command name: any string; completes from discovery."""

    name = "workflow"

    def shell_complete(
        self, ctx: click.Context, param: click.Parameter, incomplete: str
    ) -> list[CompletionItem]:
        return complete_workflow_names(ctx, incomplete)


def install_completion(group: click.Group) -> None:
    """Give every `run_id` argument and every workflow-name parameter its completion.

    Walks the command tree once at import, after every module registered its commands,
    so commands added later in their own modules complete too. Only plain string
    parameters are retyped: both types are string types.
    """
    for command in _commands(group):
        for param in command.params:
            if param.type is not click.STRING:
                continue
            if param.name == "run_id":
                param.type = RunIdType()
            elif param.name == "workflow" or (command.name == "start" and param.name == "name"):
                param.type = WorkflowNameType()


def _commands(group: click.Group) -> list[click.Command]:
    """The commands registered so far (a lazy group's other modules stay unloaded)."""
    found: list[click.Command] = [group]
    loaded = getattr(group, "loaded_commands", None)
    commands = loaded() if loaded is not None else group.commands
    for command in commands.values():
        if isinstance(command, click.Group):
            found += _commands(command)
        else:
            found.append(command)
    return found


def completion_script(group: click.Command, shell: str, prog_name: str = "pi-workflows") -> str:
    """The completion script of `shell` for `prog_name` (click's own)."""
    cls = get_completion_class(shell)
    if cls is None:
        raise click.BadParameter(f"no completion for {shell}")
    return cls(group, {}, prog_name, COMPLETE_VAR).source()


# The `completion` command registers on the root group when this module is imported
# (the end of cli/_main.py), like the commands of cli/_run_list.py.
from pi_workflows.cli._main import main  # noqa: E402


@main.command("completion")
@click.argument("shell", type=click.Choice(SHELLS))
def completion(shell: str) -> None:
    """Print the shell completion script of SHELL (commands, workflow names, run IDs).

    Run IDs complete only while a server runs (none is started for it); workflow names
    come from the workflow files discovered for the current folder.

    \b
    Install (then open a new shell):
      bash: pi-workflows completion bash > ~/.local/share/bash-completion/completions/pi-workflows
      zsh:  pi-workflows completion zsh > "${fpath[1]}/_pi-workflows"
      fish: pi-workflows completion fish > ~/.config/fish/completions/pi-workflows.fish
    Or, for the current shell only: eval "$(pi-workflows completion bash)"

    Example: pi-workflows completion bash
    """
    click.echo(completion_script(main, shell))
