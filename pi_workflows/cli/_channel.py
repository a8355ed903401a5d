"""`pi-workflows channel status|reload`: Telegram channel profiles (`channel recover`
shares `run recover`'s path, in _recover).

The server owns the profiles file and the adapter children (`channel.status`,
`channel.reload`, `channel.recover`); the CLI never reads `channels.json` and never
prints a token, a chat or a user ID (the server's answer holds none).
"""

from __future__ import annotations

from typing import Any

import click

from pi_workflows.cli._main import (
    _client,
    _client_errors,
    _fail,
    _print_json,
    json_option,
    lazy_commands,
    main,
)

__all__ = ["channel"]


@main.group()
def channel() -> None:
    """Telegram channel profiles: status, reload, and recovery of an ambiguous delivery."""


lazy_commands(channel, {"recover": "pi_workflows.cli._recover"})


def _echo_status(receipt: dict[str, Any]) -> None:
    config = receipt["config"]
    if config == "missing":
        click.echo("no channel profiles (<agent dir>/workflows/channels.json does not exist)")
    elif config == "refused":
        click.echo(f"channel profiles refused: {receipt.get('error', 'unusable file')}")
    for item in receipt["profiles"]:
        reason = f" ({item['reason']})" if item.get("reason") else ""
        retrying = item.get("retrying", 0)
        failed = item.get("failed", 0)
        click.echo(
            f"{item['profile']:<16} {item['state']}{reason}  "
            f"pending {item['pending']} (not sent yet, tried again: {retrying}), "
            f"ambiguous {item['ambiguous']}, failed {failed}"
        )
        if item["ambiguous"]:
            click.echo(
                "  an ambiguous delivery may have reached Telegram: check the chat, then "
                "`pi-workflows channel recover RUN_ID confirm` or `... retry`"
            )
        if failed:
            click.echo(
                "  a failed delivery was not sent (refused, or not sent within the retry "
                "bound): `pi-workflows channel recover RUN_ID retry` sends it again"
            )


@channel.command("status")
@json_option
@click.pass_context
@_client_errors
def channel_status(ctx: click.Context, as_json: bool) -> None:
    """Each profile: its adapter's state (starting, ready, exited and why) and how many
    deliveries are pending (and of those, not sent yet and waiting to be tried again),
    ambiguous or failed. Never shows a token or a chat.

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
    ones. A file readable by others, or not valid, is refused: every profile stops, the
    refusal is printed on stderr and the exit code is 1 (run `chmod 600` on the file, or
    fix what the refusal names, then reload again).

    Example: pi-workflows channel reload
    """
    with _client(ctx) as client:
        receipt = client.call("channel.reload")["receipt"]
    refused = receipt["config"] == "refused"
    if as_json:
        _print_json(receipt)
    elif not refused:
        _echo_status(receipt)
    if refused:
        _fail(f"channel profiles refused: {receipt.get('error', 'unusable file')}")
