"""`pi-workflows run show RUN_ID`: what one run did, from its run view only.

Implements issue 13 item 8 (`run show`) on `pi-workflows.run-view.v1` (`run.get`),
`view.page` and `view.content`: the client collects every trace page of one view
revision and loads every referenced value (input, outputs, errors, tracebacks, the
reason), verified against its digest, before anything is printed; content that fails
verification is reported and never shown. Then: status and reason in words, timings,
execution mode, lineage, input, output, and every attempt with its outcome and its
output or error, including the traceback of a failed node, and the recorded conversation
of each interactive step (wire/conversation.py). Rich tables and colour on
a terminal; plain lines otherwise (pipes, scripts, tests); `--json` prints the
hydrated view. A value longer than `HEAD_CHARS` prints its head and its size unless
`--full` is given (a 5 MiB output would otherwise flood the terminal).
"""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from pi_workflows.cli._advice import advice, kind_words, node_kinds, status_words
from pi_workflows.cli._chain import Chain, chain_rows, follow_chain
from pi_workflows.cli._main import (
    EXIT_FAILED,
    _client,
    _client_errors,
    _fail,
    _print_json,
    ambiguous_effect_lines,
    command_prefix,
    json_option,
    run,
)
from pi_workflows.cli._palette import STATUS_STYLES, styled
from pi_workflows.wire.client import WorkflowClient
from pi_workflows.wire.conversation import conversation_lines, load_conversation
from pi_workflows.wire.hydrate import ContentVerificationError, RunChangingError

__all__ = ["HEAD_CHARS", "plain_lines", "run_show", "show_rich"]

HEAD_CHARS = 4000
"""How much of one long value (output, error, traceback, reason) is printed without
--full; the rest is counted in a note."""


@run.command("show")
@click.argument("run_id")
@click.option(
    "--full",
    is_flag=True,
    help=f"Print long values whole (default: the first {HEAD_CHARS} characters and a size).",
)
@json_option
@click.pass_context
@_client_errors
def run_show(ctx: click.Context, run_id: str, full: bool, as_json: bool) -> None:
    """Show what a run did: status and reason, timings, lineage, input, output, attempts.

    Every attempt is listed (all pages of one view revision) with its outcome and its
    output or error; a failed node shows its traceback. Large values are loaded in
    chunks and verified against their SHA-256 digest first: damaged content is
    reported, never shown. A value longer than 4000 characters prints its head and
    its size unless --full is given. With --json, prints the hydrated run view
    (pi-workflows.run-view.v1 with every attempt and every value loaded) whole.

    A run continued after its checkpoint was answered also shows its chain: the runs
    that continued it, where the last one is now and, once it completed, its output
    (the workflow's). --json prints this run's view only.

    Example: pi-workflows run show run-0123abcd --full
    """
    try:
        with _client(ctx) as client:
            view = client.hydrated_run_view(run_id)
            chain = None if as_json else _chain_of(client, view)
            messages = [] if as_json else load_conversation(client, view)
    except ContentVerificationError as exc:
        _fail(f"content failed verification: {exc}", EXIT_FAILED)
    except RunChangingError as exc:
        _fail(str(exc), EXIT_FAILED)
    prefix = command_prefix(ctx)
    if as_json:
        _print_json(view)
    elif sys.stdout.isatty():
        show_rich(view, full=full, chain=chain, prefix=prefix, conversation=messages)
    else:
        lines = plain_lines(view, full=full, chain=chain, prefix=prefix, conversation=messages)
        for line in lines:
            click.echo(line)


def _chain_of(client: WorkflowClient, view: dict[str, Any]) -> Chain | None:
    """The run's continuations down to the last run, whose view is loaded whole (its
    output is the workflow's); the runs between need only their links."""
    chain = follow_chain(view, lambda hop: client.call("run.get", run_id=hop)["receipt"])
    if chain is None or chain.missing:
        return chain
    return replace(chain, leaf=client.hydrated_run_view(str(chain.leaf["runId"])))


# --- facts shared by both renderers --------------------------------------------------


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _took(start: int | None, end: int | None) -> str:
    if start is None or end is None:
        return ""
    ms = end - start
    return f"{ms} ms" if ms < 10_000 else f"{ms / 1000:.1f} s"


def _head(text: str, full: bool) -> str:
    """`text`, or its first `HEAD_CHARS` characters and a note of its size."""
    if full or len(text) <= HEAD_CHARS:
        return text
    size = len(text.encode("utf-8"))
    return f"{text[:HEAD_CHARS]} … ({size} bytes in all; --full prints everything)"


def _value(shown: dict[str, Any] | None, full: bool = False) -> str:
    """One value of the hydrated view as text."""
    if shown is None:
        return "-"
    if "value" in shown:
        return _head(json.dumps(shown["value"], sort_keys=True, ensure_ascii=False), full)
    if "unavailable" in shown:
        return f"<unavailable: {shown['unavailable']}>"
    ref = shown.get("ref", {})
    return f"<{ref.get('byteCount', '?')} bytes not loaded; it begins: {shown.get('preview', '')}>"


def _lineage(view: dict[str, Any]) -> list[str]:
    lineage = view.get("lineage", {})
    parts = []
    for key, words in (
        ("parentRunId", "child of"),
        ("restartOf", "restart of"),
        ("continuationOf", "continuation of"),
    ):
        if key in lineage:
            parts.append(f"{words} {lineage[key]}")
    for key, words in (("restartedBy", "restarted as"), ("continuedBy", "continued as")):
        if lineage.get(key):
            parts.append(f"{words} {', '.join(lineage[key])}")
    return parts


def _summary(
    view: dict[str, Any],
    full: bool = False,
    chain: Chain | None = None,
    prefix: str = "pi-workflows",
) -> list[tuple[str, str]]:
    """(label, text) rows of the run itself, then where its chain is now; a text may
    hold several lines (one advised command a line)."""
    display = view["display"]
    rows = [("status", status_words(display))]
    if display.get("reasonText"):
        rows.append(("reason", _head(display["reasonText"], full)))
    shown = advice(view, prefix)
    if shown.action or shown.commands:
        words = [shown.action] if shown.action else []
        notes = [f"({note})" for note in shown.notes]
        rows.append(("what to do", "\n".join([*words, *shown.commands, *notes])))
    where = display.get("currentNode") or display.get("waitingOn")
    if where:
        kind = node_kinds(view).get(where)
        label = "at node" if display.get("currentNode") else "waiting on"
        rows.append((label, where + (f" ({kind_words(kind)})" if kind else "")))
    if display.get("question"):
        rows.append(("question", _head(display["question"], full)))
    if shown.also:
        rows.append(("allowed now", "\n".join(shown.also)))
    rows.append(("mode", view.get("executionMode", "-")))
    rows.append(("created", _when(view.get("createdAt"))))
    if view.get("finishedAt") is not None:
        took = _took(view.get("createdAt"), view["finishedAt"])
        rows.append(("finished", f"{_when(view['finishedAt'])} (after {took})"))
    lineage = _lineage(view)
    if lineage:
        rows.append(("lineage", "; ".join(lineage)))
    rows += chain_rows(chain, None if full else HEAD_CHARS, prefix)
    rows.append(("input", _value(view.get("state", {}).get("input"), full)))
    if "result" in view:
        rows.append(("output", _value(view["result"].get("output"), full)))
    rows.append(("revision", f"{view['revision']} (generation {view.get('generation', '-')})"))
    return rows


def _attempt_head(item: dict[str, Any], kinds: dict[str, str]) -> str:
    took = _took(item.get("startedAt"), item.get("finishedAt"))
    kind = kind_words(kinds.get(item["node"], item["kind"]))
    return (
        f"{item['node']}  {kind}  visit {item['visit']} attempt {item['attempt']}"
        f"  generation {item['generation']}  {item['outcome']}"
        f"  started {_when(item['startedAt'])}" + (f"  took {took}" if took else "")
    )


def _attempt_details(item: dict[str, Any], full: bool = False) -> Iterator[tuple[str, str]]:
    if "output" in item:
        yield "output", _value(item["output"], full)
    if "error" in item:
        yield "error", _head(item["error"], full)
    traceback = item.get("traceback")
    if traceback is not None:
        if "text" in traceback:
            yield "traceback", _head(traceback["text"].rstrip("\n"), full)
        else:
            ref = traceback["ref"]
            yield "traceback", f"<{ref['byteCount']} bytes stored as {ref['digest']}>"
    if "next" in item:
        yield "next", item["next"]


def _trace_note(trace: dict[str, Any]) -> str:
    # Node attempts: an effect's attempts are numbered apart ("effect attempt N").
    shown = len(trace["items"])
    if trace["omitted"]:
        return (
            f"node attempts: the newest {shown} of {trace['count']} "
            f"({trace['omitted']} earlier ones are not in this view)"
        )
    return f"node attempts: {trace['count']}"


# --- plain text ---------------------------------------------------------------------------


def plain_lines(
    view: dict[str, Any],
    *,
    full: bool = False,
    chain: Chain | None = None,
    prefix: str = "pi-workflows",
    conversation: list[dict[str, Any]] | None = None,
) -> Iterator[str]:
    """The plain-text form: stable lines for pipes and scripts."""
    title = f" ({view['title']})" if view.get("title") else ""
    yield f"run {view['runId']}  {status_words(view['display'])}  {view['workflow']}{title}"
    for label, text in _summary(view, full, chain, prefix):
        first, *more = text.split("\n")
        yield f"{label + ':':<12} {first}"
        yield from (f"{'':<12} {line}" for line in more)
    yield from ambiguous_effect_lines(view)
    trace = view["trace"]
    kinds = node_kinds(view)
    yield _trace_note(trace)
    for number, item in enumerate(trace["items"], start=trace["omitted"] + 1):
        yield f"  {number}. {_attempt_head(item, kinds)}"
        for label, text in _attempt_details(item, full):
            lines = text.splitlines() or [""]
            if len(lines) == 1:
                yield f"     {label}: {lines[0]}"
            else:
                yield f"     {label}:"
                yield from (f"       {line}" for line in lines)
    yield from conversation_lines(view, conversation or [], lambda text: _head(text, full))


# --- rich ------------------------------------------------------------------------------


def show_rich(
    view: dict[str, Any],
    console: Console | None = None,
    *,
    full: bool = False,
    chain: Chain | None = None,
    prefix: str = "pi-workflows",
    conversation: list[dict[str, Any]] | None = None,
) -> None:
    """The terminal form: colour and tables (rich)."""
    console = console or Console()
    title = f" ({view['title']})" if view.get("title") else ""
    heading = Text(f"run {view['runId']}  ")
    heading.append_text(styled(view["display"]["status"]))
    if view["display"].get("parked"):
        heading.append(" (parked)")
    heading.append(f"  {view['workflow']}{title}")
    console.print(heading)
    summary = Table(show_header=False, box=None, pad_edge=False)
    summary.add_column(style="bold")
    summary.add_column(overflow="fold")
    for label, text in _summary(view, full, chain, prefix):
        summary.add_row(label, styled(text) if label == "status" else Text(text))
    console.print(summary)
    for line in ambiguous_effect_lines(view):
        console.print(Text(line, style=STATUS_STYLES["ambiguous"]))
    trace = view["trace"]
    kinds = node_kinds(view)
    table = Table(title=_trace_note(trace), title_justify="left", show_lines=True)
    for column in ("#", "node", "kind", "visit/attempt", "outcome", "started", "took", "detail"):
        table.add_column(column, overflow="fold")
    for number, item in enumerate(trace["items"], start=trace["omitted"] + 1):
        details = "\n".join(f"{label}: {text}" for label, text in _attempt_details(item, full))
        table.add_row(
            str(number),
            item["node"],
            kind_words(kinds.get(item["node"], item["kind"])),
            f"{item['visit']}/{item['attempt']}",
            styled(item["outcome"]),
            _when(item["startedAt"]),
            _took(item.get("startedAt"), item.get("finishedAt")),
            Text(details),
        )
    console.print(table)
    for line in conversation_lines(view, conversation or [], lambda text: _head(text, full)):
        console.print(Text(line))
