"""`channel.recover`: the operator's reviewed recovery of an ambiguous Telegram attempt.

Implements workflow-server.md § Supervised channel adapters ("The operator checks
Telegram before resolving an ambiguous attempt") as `run.recover` does: the one recover
command path (`recover_effect`: receipt lookup, change, receipt, one transaction), the
same effect states and `effect_recovered` event (`storage/_channels.recover_channel_effect`).
The waiting run keeps waiting; the channel-adapter actor sends a retried attempt once
the commit is durable.
"""

from __future__ import annotations

from typing import Any

from pi_workflows.domain._operations import (
    OperationContext,
    OperationError,
    Recovered,
    RecoverRequest,
    RecoverTarget,
    recover_effect,
    rejected,
)
from pi_workflows.storage import Claim, Database, Tx, recover_channel_effect
from pi_workflows.wire.protocol import RequestMessage

__all__ = ["CHANNEL_RETRY_WARNING", "recover_channel"]

CHANNEL_RETRY_WARNING = (
    "the Telegram message is sent once more; if the first attempt did reach Telegram, "
    "the chat may now show it twice"
)


def _recover_channel_effect(tx: Tx, asked: RecoverRequest) -> Recovered:
    recovered = recover_channel_effect(
        tx,
        asked.run_id,
        action=asked.action,
        actor=asked.actor,
        effect_id=asked.effect_id,
        message_ids=tuple(asked.payload.get("messageIds", ())),
    )
    effect = {
        "effectId": recovered.effect_id,
        "effectType": recovered.kind,
        "channel": recovered.channel,
        "attemptNumber": recovered.attempt_number,
    }
    return Recovered(recovered.revision, {"effect": effect}, recovered.next_attempt_number)


CHANNEL_EFFECT = RecoverTarget(
    confirm_only="messageIds",
    confirm_only_code="messageIdsNotAllowed",
    confirm_only_words="a retry takes no message IDs",
    retry_warning=CHANNEL_RETRY_WARNING,
    recover=_recover_channel_effect,
)
"""`channel.recover`: a run's ambiguous Telegram delivery or settlement."""


def recover_channel(
    db: Database, request: RequestMessage, ctx: OperationContext, claim: Claim | None = None
) -> dict[str, Any]:
    """`channel.recover` (`confirm` or `retry`); never raises for bad input."""
    try:
        return recover_effect(db, request, CHANNEL_EFFECT)
    except OperationError as exc:
        return rejected(request, exc.outcome, exc.code, str(exc))
