"""`channel.recover`: the operator's reviewed recovery of an ambiguous Telegram attempt.

Implements workflow-server.md § Supervised channel adapters ("The operator checks
Telegram before resolving an ambiguous attempt") with the mechanism of `run.recover`:
the same command path (receipt lookup, change, receipt, one transaction), the same
effect states and `effect_recovered` event (`storage/_channels.recover_channel_effect`),
and the same retry warning. The waiting run keeps waiting; the channel-adapter actor
sends a retried attempt once the commit is durable.
"""

from __future__ import annotations

from typing import Any

from pi_workflows.domain._operations import (
    OperationContext,
    OperationError,
    _run_command,
    _run_id,
    recover_action,
    rejected,
)
from pi_workflows.storage import (
    Claim,
    CommandRequest,
    Database,
    EffectRecoveryError,
    Tx,
    get_run,
    recover_channel_effect,
)
from pi_workflows.wire.protocol import RequestMessage

__all__ = ["CHANNEL_RETRY_WARNING", "recover_channel"]

CHANNEL_RETRY_WARNING = (
    "the Telegram message is sent once more; if the first attempt did reach Telegram, "
    "the chat may now show it twice"
)


def recover_channel(
    db: Database, request: RequestMessage, ctx: OperationContext, claim: Claim | None = None
) -> dict[str, Any]:
    """`channel.recover` (`confirm` or `retry`); never raises for bad input."""
    try:
        return _recover(db, request)
    except OperationError as exc:
        return rejected(request, exc.outcome, exc.code, str(exc))


def _recover(db: Database, request: RequestMessage) -> dict[str, Any]:
    run_id = _run_id(request)
    payload = request["payload"]
    action = recover_action(payload)
    message_ids = tuple(payload.get("messageIds", ()))
    if action == "retry" and message_ids:
        raise OperationError("rejected", "messageIdsNotAllowed", "a retry takes no message IDs")

    def change(tx: Tx, command: CommandRequest) -> tuple[str, int, dict[str, Any]]:
        if get_run(tx, run_id) is None:
            raise OperationError("notFound", "runNotFound", f"no run {run_id}")
        try:
            recovered = recover_channel_effect(
                tx,
                run_id,
                action=action,
                actor=command.client_id,
                effect_id=payload.get("effectId"),
                message_ids=message_ids,
            )
        except EffectRecoveryError as exc:
            raise OperationError("rejected", exc.code, str(exc)) from None
        body: dict[str, Any] = {
            "runId": run_id,
            "operation": "recover",
            "action": action,
            "effect": {
                "effectId": recovered.effect_id,
                "effectType": recovered.kind,
                "channel": recovered.channel,
                "attemptNumber": recovered.attempt_number,
            },
        }
        if recovered.next_attempt_number is not None:
            body["nextAttemptNumber"] = recovered.next_attempt_number
            body["warning"] = CHANNEL_RETRY_WARNING
        return run_id, recovered.revision, body

    return _run_command(db, request, change)
