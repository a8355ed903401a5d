"""`pi-workflows decision list|answer`: people see and answer protected human decisions.

Both go through `WorkflowClient` only: `decision list` reads `decision.list` (pending
decisions: run, decision, workflow, summary, choices, expiry); `decision answer` sends
`decision.answer` (source channel `cli`). The first valid answer wins; a repeat of the
same answer says so, another answer is refused as a conflict.
"""

from __future__ import annotations

import json
import time
from typing import Any

import click

from pi_workflows.cli._main import (
    EXIT_USAGE,
    _client,
    _client_errors,
    _fail,
    _print_json,
    json_option,
    main,
)

__all__ = ["decision", "decision_answer", "decision_list"]


@main.group()
def decision() -> None:
    """Protected human decisions: list the pending ones, answer one.

    Example: pi-workflows decision list
    """


@decision.command("list")
@click.option("--run", "run_id", default=None, help="Only this run's decision.")
@json_option
@click.pass_context
@_client_errors
def decision_list(ctx: click.Context, run_id: str | None, as_json: bool) -> None:
    """List pending protected decisions, oldest first.

    Example: pi-workflows decision list --json
    """
    payload: dict[str, Any] = {} if run_id is None else {"runId": run_id}
    with _client(ctx) as client:
        items = client.call("decision.list", payload)["receipt"]["items"]
    if as_json:
        _print_json(items)
        return
    if not items:
        click.echo("No pending decisions.")
        return
    now_ms = time.time_ns() // 1_000_000
    for index, item in enumerate(items):
        if index:
            click.echo()
        click.echo(_headline(item, now_ms))
        for line in str(item.get("summary") or "").splitlines() or [""]:
            click.echo(f"  {line}")
        click.echo(f"  {_choices_line(item)}")
        click.echo(
            f"  answer: pi-workflows decision answer {item['runId']} --input-json {_example(item)}"
        )


def _headline(item: dict[str, Any], now_ms: int) -> str:
    parts = [str(item["runId"]), str(item["workflow"]), f"decision {item['decisionId']}"]
    expires = item.get("expiresAt")
    if isinstance(expires, int):
        left = max(0, expires - now_ms) // 1000
        default = "; then the default answer" if item.get("hasDefault") else ""
        parts.append(f"expires in {_duration(left)}{default}")
    if item.get("paused"):
        parts.append("paused (resume the run to answer)")
    return "  ".join(parts)


def _duration(seconds: int) -> str:
    if seconds >= 3600:
        return f"{seconds // 3600}h {seconds % 3600 // 60}m"
    if seconds >= 60:
        return f"{seconds // 60}m {seconds % 60}s"
    return f"{seconds}s"


def _choices_line(item: dict[str, Any]) -> str:
    choices = item.get("choices") or []
    if not choices:
        return "answer: JSON matching the decision's answer schema (decision list --json shows it)"
    shown = []
    for choice in choices:
        asked = choice.get("input")
        extra = f"; with {asked['name']}: text" if isinstance(asked, dict) else ""
        shown.append(f"{choice['id']} ({choice.get('label', choice['id'])}{extra})")
    return "choices: " + ", ".join(shown)


def _example(item: dict[str, Any]) -> str:
    choices = item.get("choices") or []
    if not choices:
        return "JSON"
    first = choices[0]
    value: dict[str, Any] = {"choice": first["id"]}
    if isinstance(first.get("input"), dict):
        value["input"] = {first["input"]["name"]: "..."}
    return "'" + json.dumps(value) + "'"


@decision.command("answer")
@click.argument("run_id")
@click.option(
    "--input-json",
    required=True,
    help='The answer as JSON, e.g. \'{"choice": "approve"}\'.',
)
@click.option(
    "--decision",
    "decision_id",
    default=None,
    help="The decision ID (default: the run's pending one).",
)
@json_option
@click.pass_context
@_client_errors
def decision_answer(
    ctx: click.Context, run_id: str, input_json: str, decision_id: str | None, as_json: bool
) -> None:
    """Answer the protected decision a run waits at; exactly one answer wins.

    Prints the continuation's run ID (--json: the receipt and outcome); `run wait` of
    either run waits for the workflow's end.

    Example: pi-workflows decision answer run-0123abcd --input-json '{"choice": "approve"}'
    """
    try:
        answer = json.loads(input_json)
    except json.JSONDecodeError:
        _fail(
            '--input-json is not valid JSON; pass a value such as \'{"choice": "approve"}\'',
            EXIT_USAGE,
        )
    payload: dict[str, Any] = {"answer": answer, "sourceChannel": "cli"}
    if decision_id is not None:
        payload["decisionId"] = decision_id
    with _client(ctx) as client:
        reply = client.call("decision.answer", payload, run_id=run_id)
    receipt = reply["receipt"]
    if as_json:
        _print_json({**receipt, "outcome": reply["outcome"]})
        return
    continuation = receipt.get("continuationRunId")
    # The continuation's bare ID on stdout (R=$(...) holds it); the words on stderr.
    if reply["outcome"] == "adopted":
        click.echo(f"Already answered this way; the workflow continues as {continuation}", err=True)
    else:
        click.echo(f"Answered {run_id}; the workflow continues as {continuation}", err=True)
    if continuation:
        click.echo(continuation)
