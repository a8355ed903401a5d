"""`pi-workflows channel status|reload|recover`: Telegram channel profiles and recovery.

The server owns the profiles file and the adapter children (`channel.status`,
`channel.reload`, `channel.recover`); the CLI never reads `channels.json` and never
prints a token, a chat or a user ID (the server's answer holds none).
"""

from __future__ import annotations

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

__all__ = ["channel"]

RETRY_WARNING_TEXT = "the Telegram message is sent once more; a duplicate is possible"


@main.group()
def channel() -> None:
    """Telegram channel profiles: status, reload, and recovery of an ambiguous delivery."""


def _echo_status(receipt: dict[str, Any]) -> None:
    config = receipt["config"]
    if config == "missing":
        click.echo("no channel profiles (<agent dir>/workflows/channels.json does not exist)")
    elif config == "refused":
        click.echo(f"channel profiles refused: {receipt.get('error', 'unusable file')}")
    for item in receipt["profiles"]:
        reason = f" ({item['reason']})" if item.get("reason") else ""
        click.echo(
            f"{item['profile']:<16} {item['state']}{reason}  "
            f"pending {item['pending']}, ambiguous {item['ambiguous']}"
        )
        if item["ambiguous"]:
            click.echo(
                "  an ambiguous delivery may have reached Telegram: check the chat, then "
                "`pi-workflows channel recover RUN_ID confirm` or `... retry`"
            )


@channel.command("status")
@json_option
@click.pass_context
@_client_errors
def channel_status(ctx: click.Context, as_json: bool) -> None:
    """Each profile: its adapter's state (starting, ready, exited and why) and how many
    deliveries are pending or ambiguous. Never shows a token or a chat.

    Example: pi-workflows channel status --json
    """
    with _client(ctx) as client:
        receipt = client.call("channel.status")["receipt"]
    if as_json:
        _print_json(receipt)
        return
    _echo_status(receipt)


@channel.command("reload")
@json_option
@click.pass_context
@_client_errors
def channel_reload(ctx: click.Context, as_json: bool) -> None:
    """Read channels.json again: start new profiles, restart changed ones, stop removed
    ones. A file readable by others is refused (run `chmod 600` on it).

    Example: pi-workflows channel reload
    """
    with _client(ctx) as client:
        receipt = client.call("channel.reload")["receipt"]
    if as_json:
        _print_json(receipt)
        return
    _echo_status(receipt)


@channel.command("recover")
@click.argument("run_id")
@click.argument("action", type=click.Choice(["confirm", "retry"]))
@click.option(
    "--message-id",
    "message_ids",
    type=click.IntRange(min=1),
    multiple=True,
    help="confirm only: the Telegram message ID you found (repeatable), so the server can "
    "edit it to show the outcome.",
)
@click.option(
    "--effect", "effect_id", default=None, help="The effect ID, when several are ambiguous."
)
@json_option
@click.pass_context
@_client_errors
def channel_recover(
    ctx: click.Context,
    *,
    run_id: str,
    action: str,
    message_ids: tuple[int, ...],
    effect_id: str | None,
    as_json: bool,
) -> None:
    """Recover an ambiguous Telegram delivery or edit, after checking the chat.

    `confirm` records that the message was sent (or edited). `retry` sends it once more
    as a new numbered attempt; a duplicate is possible. The same mechanism as `run
    recover`: recorded in the run's history with this client's identity.

    Example: pi-workflows channel recover run-0123abcd confirm --message-id 77
    """
    payload: dict[str, Any] = {"action": action}
    if message_ids:
        if action == "retry":
            _fail("--message-id is for confirm; a retry sends a new message", EXIT_USAGE)
        payload["messageIds"] = list(message_ids)
    if effect_id is not None:
        payload["effectId"] = effect_id
    with _client(ctx) as client:
        answer = client.call("channel.recover", payload, run_id=run_id)
    receipt = answer["receipt"]
    if action == "retry":
        click.echo(f"warning: {receipt.get('warning', RETRY_WARNING_TEXT)}", err=True)
    if as_json:
        _print_json(receipt)
        return
    effect = receipt["effect"]
    suffix = " (already done)" if answer["outcome"] == "adopted" else ""
    what = "delivery" if effect["effectType"] == "channel.deliver" else "message edit"
    if action == "confirm":
        click.echo(f"confirmed: the Telegram {what} of run {run_id} is recorded as done{suffix}")
    else:
        click.echo(
            f"retry: the Telegram {what} of run {run_id} is sent again as attempt "
            f"{receipt['nextAttemptNumber']}{suffix}"
        )
