"""`pi-workflows run recover` and `channel recover`: one path for both recover commands.

Both take `RUN_ID confirm|retry`, `--effect` and `--json`, send one command
(`run.recover` or `channel.recover`), warn on stderr that a retry may duplicate, and
print one sentence; they differ only in their confirm-only option and their words.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from pi_workflows.cli._channel import channel
from pi_workflows.cli._main import (
    EXIT_USAGE,
    _client,
    _client_errors,
    _fail,
    _print_json,
    json_option,
    run,
)

__all__ = ["channel_recover", "run_recover"]


@dataclass(frozen=True, slots=True)
class RecoverWords:
    """What differs between the two recover commands: the operation and its sentences."""

    operation: str
    confirm_flag: str
    """The confirm-only option, named when a retry is given it."""
    retry_refusal: str
    retry_warning: str
    """Shown when the server's receipt carries no warning of its own."""
    what: Callable[[dict[str, Any]], str]
    """The recovered effect, as the sentences name it."""
    confirmed: str
    """Template with {what}, {run_id}, {suffix}."""
    retried: str
    """Template with {what}, {run_id}, {attempt}, {suffix}."""


RUN_WORDS = RecoverWords(
    operation="run.recover",
    confirm_flag="--result-json",
    retry_refusal="a retry produces its own result",
    retry_warning="the effect is applied once more; a duplicate is possible",
    what=lambda effect: f"effect {effect['effectType']} at node {effect['nodePath']}",
    confirmed="confirmed: {what} recorded as applied; run {run_id} continues{suffix}",
    retried="retry: {what} runs again as effect attempt {attempt}; run {run_id} continues{suffix}",
)
CHANNEL_WORDS = RecoverWords(
    operation="channel.recover",
    confirm_flag="--message-id",
    retry_refusal="a retry sends a new message",
    retry_warning="the Telegram message is sent once more; a duplicate is possible",
    what=lambda effect: "delivery" if effect["effectType"] == "channel.deliver" else "message edit",
    confirmed="confirmed: the Telegram {what} of run {run_id} is recorded as done{suffix}",
    retried="retry: the Telegram {what} of run {run_id} is sent again as attempt {attempt}{suffix}",
)

F = Callable[..., None]


def recover_command(group: click.Group, confirm_option: Callable[[F], F]) -> Callable[[F], Any]:
    """`group recover RUN_ID confirm|retry [confirm option] [--effect ID] [--json]`."""

    def decorate(function: F) -> Any:
        for decorator in (
            _client_errors,
            click.pass_context,
            json_option,
            click.option(
                "--effect",
                "effect_id",
                default=None,
                help="The effect ID, when several are ambiguous.",
            ),
            confirm_option,
            click.argument("action", type=click.Choice(["confirm", "retry"])),
            click.argument("run_id"),
        ):
            function = decorator(function)
        return group.command("recover")(function)

    return decorate


def recover(
    ctx: click.Context,
    words: RecoverWords,
    *,
    run_id: str,
    action: str,
    effect_id: str | None,
    confirm_fields: Callable[[], dict[str, Any]] | None,
    as_json: bool,
) -> None:
    """Send the recover command and print its answer.

    `confirm_fields` reads the confirm-only option into payload fields (None when the
    option was not given); a retry given it is refused before anything is sent.
    """
    payload: dict[str, Any] = {"action": action}
    if confirm_fields is not None:
        if action == "retry":
            _fail(f"{words.confirm_flag} is for confirm; {words.retry_refusal}", EXIT_USAGE)
        payload.update(confirm_fields())
    if effect_id is not None:
        payload["effectId"] = effect_id
    with _client(ctx) as client:
        answer = client.call(words.operation, payload, run_id=run_id)
    receipt = answer["receipt"]
    if action == "retry":
        click.echo(f"warning: {receipt.get('warning', words.retry_warning)}", err=True)
    if as_json:
        _print_json(receipt)
        return
    facts = {
        "what": words.what(receipt["effect"]),
        "run_id": run_id,
        "suffix": " (already done)" if answer["outcome"] == "adopted" else "",
    }
    if action == "confirm":
        click.echo(words.confirmed.format(**facts))
    else:
        click.echo(words.retried.format(attempt=receipt["nextAttemptNumber"], **facts))


@recover_command(
    run,
    click.option(
        "--result-json",
        default=None,
        help="confirm only: the effect's result as JSON (default null); the run continues with it.",
    ),
)
def run_recover(
    ctx: click.Context,
    *,
    run_id: str,
    action: str,
    result_json: str | None,
    effect_id: str | None,
    as_json: bool,
) -> None:
    """Recover a run parked on an ambiguous effect, after inspecting the external system.

    `confirm` records that the external work happened: the effect becomes applied
    (with --result-json, default null) and the run continues without running it again.
    `retry` applies the effect once more in a new effect attempt (an effect's attempts
    are numbered apart from its node's attempts); a duplicate is possible.
    Both are recorded in the run's history with this client's identity.

    Example: pi-workflows run recover run-0123abcd confirm --result-json '{"id": 7}'
    """
    recover(
        ctx,
        RUN_WORDS,
        run_id=run_id,
        action=action,
        effect_id=effect_id,
        confirm_fields=None if result_json is None else functools.partial(_result, result_json),
        as_json=as_json,
    )


def _result(result_json: str) -> dict[str, Any]:
    try:
        return {"result": json.loads(result_json)}
    except json.JSONDecodeError:
        _fail(
            "--result-json is not valid JSON; pass a value such as '{\"id\": 7}' or null",
            EXIT_USAGE,
        )


@recover_command(
    channel,
    click.option(
        "--message-id",
        "message_ids",
        type=click.IntRange(min=1),
        multiple=True,
        help="confirm only: the Telegram message ID you found (repeatable), so the server "
        "can edit it to show the outcome.",
    ),
)
def channel_recover(
    ctx: click.Context,
    *,
    run_id: str,
    action: str,
    message_ids: tuple[int, ...],
    effect_id: str | None,
    as_json: bool,
) -> None:
    """Recover an ambiguous or failed Telegram delivery or edit, after checking the chat.

    `confirm` records that the message was sent (or edited). `retry` sends it once more
    as a new numbered attempt under the same effect key; a duplicate is possible. A
    failed delivery (refused, or not sent within the retry bound) was not sent: only
    `retry` applies to it. The same mechanism as `run recover`: recorded in the run's
    history with this client's identity.

    Example: pi-workflows channel recover run-0123abcd confirm --message-id 77
    """
    recover(
        ctx,
        CHANNEL_WORDS,
        run_id=run_id,
        action=action,
        effect_id=effect_id,
        confirm_fields=(lambda: {"messageIds": list(message_ids)}) if message_ids else None,
        as_json=as_json,
    )
