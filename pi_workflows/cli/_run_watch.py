"""`pi-workflows run watch` and `pi-workflows run wait`, on the run subscription.

Implements issue 13 item 8 (`run watch`; `run wait` survives a server restart). Both
follow one `run` subscription through `LiveViews`: every change arrives as a
`pi-workflows.run-view.v1` (a snapshot, or a patch of the held revision), and a lost
connection is reconnected and subscribed again with the held revision, so a server
restart is a pause in the display, not an error. Both end when the run settles: it is
terminal, or it needs someone (waiting, paused, ambiguous, or parked for a reason only
an operator can clear); the server is needed no more then.
"""

from __future__ import annotations

import datetime
import inspect
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import Any, TypeVar

import click
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from pi_workflows.cli._advice import advice, status_words
from pi_workflows.cli._chain import chain_path, next_run, value_text
from pi_workflows.cli._main import (
    EXIT_FAILED,
    EXIT_TIMEOUT,
    _client_errors,
    _fail,
    _print_json,
    _settled,
    _state_dir,
    command_prefix,
    json_option,
    run,
)
from pi_workflows.cli._palette import styled
from pi_workflows.wire.live import (
    DEFAULT_RECONNECT_TIMEOUT_S,
    LiveViews,
    RunNotFoundError,
    ViewUnavailableError,
    WatchTimeoutError,
)
from pi_workflows.wire.views import RunView

__all__ = [
    "change_line",
    "follow_chain_live",
    "follow_run",
    "run_wait",
    "run_watch",
    "wait_and_report",
    "watch_renderable",
]

F = TypeVar("F", bound=Callable[..., Any])

SETTLED_WORDS = (
    "It ends when the run settles: it is completed, failed, timed_out or cancelled, or "
    "it needs someone (waiting at a checkpoint or request, paused, ambiguous, or parked "
    "for a reason only an operator clears, such as workflowSourceChanged). A run that "
    "completed because its checkpoint was answered is followed into its continuation, "
    "down to the chain's last run, whose status and exit code count."
)
RESTART_WORDS = (
    "A server restart does not end it: it reconnects (backing off up to 1 s between "
    "attempts) and subscribes again, for at most --reconnect-timeout seconds of outage; "
    "it never starts a server after losing one."
)
WATCH_ATTEMPTS_SHOWN = 10
"""The newest attempts the live display lists."""


def _live_errors(function: F) -> F:
    """Map the subscription's errors to one sentence and the exit codes of `run wait`."""

    @wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except RunNotFoundError as exc:
            _fail(f"notFound: {exc}", EXIT_FAILED)
        except ViewUnavailableError as exc:
            _fail(f"unavailable ({exc.code}): {exc}", EXIT_FAILED)
        except WatchTimeoutError:
            timeout = click.get_current_context().params.get("timeout") or 0.0
            _fail(f"the run did not settle within {timeout:g} s", EXIT_TIMEOUT)

    return wrapper  # type: ignore[return-value]


def _wrapped(function: F) -> F:
    """Client errors (exit 1, 2, 3) around the subscription's own (exit 1, 6)."""
    return _client_errors(_live_errors(function))


def follow_run(
    live: LiveViews,
    run_id: str,
    timeout: float | None,
    on_view: Callable[[RunView], None] | None = None,
) -> RunView:
    """Follow the run until it settles; `on_view` sees every view; return the last."""
    for view in live.watch_run(run_id, timeout=timeout):
        if on_view is not None:
            on_view(view)
        if _settled(dict(view)):
            return view
    raise AssertionError("a watch ends only by a settled view or an error")


def follow_chain_live(
    live: LiveViews,
    run_id: str,
    timeout: float | None,
    on_view: Callable[[RunView], None] | None = None,
) -> tuple[RunView, list[str]]:
    """Follow the run, then each continuation of an answered checkpoint, until the
    chain's last run settles; return its view and the run IDs followed, in order.

    `timeout` bounds the whole wait, every run of the chain together.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    run_ids = [run_id]
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        view = follow_run(live, run_ids[-1], left, on_view)
        following = next_run(view)
        if view["display"]["status"] != "completed" or following is None:
            return view, run_ids
        run_ids.append(following)


@_live_errors
def wait_and_report(
    ctx: click.Context, run_id: str, timeout: float | None, reconnect_timeout: float, as_json: bool
) -> None:
    """`run wait`'s work: wait for the chain's last run, print it, exit 1 unless completed.

    Prints the settled view (--json), or one line: the last run's ID, status and reason
    (and the chain, when the run was continued), then its output when it completed.
    """
    with _live(ctx, reconnect_timeout) as live:
        view, run_ids = follow_chain_live(live, run_id, timeout)
    display = view["display"]
    if as_json:
        _print_json(view)
    else:
        reason = display.get("reason") or view.get("failureReason")
        line = f"{view['runId']}  {display['status']}" + (f"  ({reason})" if reason else "")
        if len(run_ids) > 1:
            line += f"  (chain: {chain_path(run_ids)})"
        click.echo(line)
        result = view.get("result")
        if result is not None and "output" in result:
            click.echo(f"output: {value_text(result['output'], view['runId'])}")
    if display["status"] != "completed":
        sys.exit(EXIT_FAILED)


@contextmanager
def _live(ctx: click.Context, reconnect_timeout: float) -> Iterator[LiveViews]:
    with LiveViews(
        _state_dir(ctx),
        client_id=f"cli-{os.getuid()}-{os.getpid()}-live",
        autostart=True,
        reconnect_timeout=reconnect_timeout,
    ) as live:
        yield live


timeout_option = click.option(
    "--timeout", type=float, default=None, help="Give up after this many seconds (default: never)."
)
reconnect_option = click.option(
    "--reconnect-timeout",
    type=float,
    default=DEFAULT_RECONNECT_TIMEOUT_S,
    help="Seconds the server may stay unreachable (a restart) before exit 3.",
)


@run.command("wait")
@click.argument("run_id")
@timeout_option
@reconnect_option
@json_option
@click.pass_context
@_wrapped
def run_wait(
    ctx: click.Context,
    run_id: str,
    timeout: float | None,
    reconnect_timeout: float,
    as_json: bool,
) -> None:
    """Wait until a run settles; exit 0 only if it completed.

    Prints the settled run's ID, status and reason, and its output once it completed
    (--json: the settled run view). Follows the run's subscription, so it returns as
    soon as the run settles.

    Example: pi-workflows run wait run-0123abcd --timeout 600
    """
    wait_and_report(ctx, run_id, timeout, reconnect_timeout, as_json)


run_wait.help = f"{inspect.cleandoc(run_wait.help or '')}\n\n{SETTLED_WORDS} {RESTART_WORDS}"


@run.command("watch")
@click.argument("run_id")
@timeout_option
@reconnect_option
@json_option
@click.pass_context
@_wrapped
def run_watch(
    ctx: click.Context,
    run_id: str,
    timeout: float | None,
    reconnect_timeout: float,
    as_json: bool,
) -> None:
    """Show a run live until it settles; exit codes as `run wait` (0 only if completed).

    Like `run wait`, it follows an answered checkpoint's continuation to the chain's
    last run.

    A terminal gets a live display (status, reason, current node, newest attempts);
    otherwise one line per change of status, node or attempt; --json prints every view
    (pi-workflows.run-view.v1) as one JSON line.

    Example: pi-workflows run watch run-0123abcd
    """
    with _live(ctx, reconnect_timeout) as live:
        if as_json:
            view = follow_chain_live(live, run_id, timeout, _print_json)[0]
        elif sys.stdout.isatty():
            view = _watch_rich(live, run_id, timeout, command_prefix(ctx))
        else:
            view = _watch_plain(live, run_id, timeout)
    if view["display"]["status"] != "completed":
        sys.exit(EXIT_FAILED)


run_watch.help = f"{inspect.cleandoc(run_watch.help or '')}\n\n{SETTLED_WORDS} {RESTART_WORDS}"


# --- plain lines ----------------------------------------------------------------------


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.strftime("%H:%M:%S.%f")[:-3] + "Z"


def _change_key(view: RunView) -> tuple[Any, ...]:
    display = view["display"]
    items = view["trace"]["items"]
    last = items[-1] if items else None
    attempt = None if last is None else (last["attemptId"], last["outcome"])
    return display["status"], display.get("currentNode"), display.get("waitingOn"), attempt


def change_line(view: RunView) -> str:
    """One plain line: time, status, node and the newest attempt."""
    display = view["display"]
    parts = [_when(view.get("updatedAt")), f"{status_words(dict(display)):<9}"]
    if "currentNode" in display:
        parts.append(f"at {display['currentNode']}")
    elif "waitingOn" in display:
        parts.append(f"waiting on {display['waitingOn']}")
    items = view["trace"]["items"]
    if items:
        last = items[-1]
        parts.append(
            f"attempt {last['node']} visit {last['visit']}/{last['attempt']} {last['outcome']}"
        )
    if display.get("reasonText") and _settled(dict(view)):
        parts.append(f"({display['reasonText']})")
    return "  ".join(parts)


def _watch_plain(live: LiveViews, run_id: str, timeout: float | None) -> RunView:
    seen: list[tuple[Any, ...]] = []
    following = [run_id]

    def on_view(view: RunView) -> None:
        if view["runId"] != following[-1]:  # the chain went on in its continuation
            click.echo(f"continued as {view['runId']}")
            following.append(view["runId"])
        key = _change_key(view)
        if not seen or seen[-1] != key:
            seen.append(key)
            click.echo(change_line(view))

    return follow_chain_live(live, run_id, timeout, on_view)[0]


# --- rich live display ----------------------------------------------------------------


def watch_renderable(view: RunView, reconnects: int = 0, prefix: str = "pi-workflows") -> Group:
    """The live display of one view: heading, facts and the newest attempts."""
    display = view["display"]
    heading = Text(f"run {view['runId']}  ")
    heading.append_text(styled(display["status"]))
    if display.get("parked"):
        heading.append(" (parked)")
    heading.append(f"  {view['workflow']}  revision {view['revision']}")
    facts = Table(show_header=False, box=None, pad_edge=False)
    facts.add_column(style="bold")
    facts.add_column(overflow="fold")
    for label, key in (("at node", "currentNode"), ("waiting on", "waitingOn")):
        if key in display:
            facts.add_row(label, display[key])  # type: ignore[literal-required]
    if display.get("question"):
        facts.add_row("question", display["question"])
    if display.get("reasonText"):
        facts.add_row("reason", display["reasonText"])
    shown = advice(dict(view), prefix)
    if shown.action or shown.commands:
        words = [shown.action] if shown.action else []
        notes = [f"({note})" for note in shown.notes]
        facts.add_row("what to do", "\n".join([*words, *shown.commands, *notes]))
    activity = display["activity"]
    if activity is not None:
        facts.add_row("activity", f"{activity['kind']} {activity.get('state', '')}".strip())
    if shown.also:
        facts.add_row("allowed now", "\n".join(shown.also))
    if reconnects:
        facts.add_row("reconnected", f"{reconnects} time(s) after losing the server")
    trace = view["trace"]
    table = Table(title=f"attempts: {trace['count']}", title_justify="left")
    for column in ("node", "visit/attempt", "outcome", "started", "finished"):
        table.add_column(column, overflow="fold")
    for item in trace["items"][-WATCH_ATTEMPTS_SHOWN:]:
        table.add_row(
            item["node"],
            f"{item['visit']}/{item['attempt']}",
            styled(item["outcome"]),
            _when(item["startedAt"]),
            _when(item.get("finishedAt")),
        )
    return Group(heading, facts, table)


def _watch_rich(live: LiveViews, run_id: str, timeout: float | None, prefix: str) -> RunView:
    console = Console()
    with Live(console=console, auto_refresh=False, transient=False) as screen:

        def on_view(view: RunView) -> None:
            screen.update(watch_renderable(view, live.reconnects, prefix), refresh=True)

        return follow_chain_live(live, run_id, timeout, on_view)[0]
