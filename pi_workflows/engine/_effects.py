"""Managed effects, runner side: reserve with the server, apply, settle (`RunnerEffects`).

Implements workflow-server.md § Managed effects for the runner: the server decides
(proceed, adopt, uncertain, ambiguous); an uncertain apply is proven by read-back or
settled ambiguous, never applied twice on a guess.
"""

from __future__ import annotations

from typing import Any

from pi_workflows.engine._channel import Channel
from pi_workflows.engine._context import NOT_APPLIED, EffectCall
from pi_workflows.engine._failures import exception_text
from pi_workflows.supervision import crash_point
from pi_workflows.wire.runner import (
    UNSET,
    EffectReservation,
    EffectReserve,
    EffectSettle,
    RunnerError,
)

__all__ = ["EffectAmbiguous", "EffectFailed", "RunnerEffects"]


class EffectFailed(Exception):  # noqa: N818
    """A managed effect was rejected or cancelled."""


class EffectAmbiguous(EffectFailed):
    """An effect may have applied and nothing proves it: it waits for an operator."""


class RunnerEffects:
    """The effect host: reserve with the server, apply, settle (see `EffectHost`)."""

    def __init__(self, channel: Channel, attempt_id: str) -> None:
        self._channel = channel
        self._attempt_id = attempt_id

    def run_effect(self, call: EffectCall) -> Any:
        reserve = EffectReserve(
            effect_type=call.effect_type,
            idempotency_key=call.key,
            request=call.request,
            # An interrupted apply is then applied again (the server opens a new attempt).
            idempotent=True if call.idempotent else UNSET,
        )
        reservation = self._channel.ask(reserve, EffectReservation, self._attempt_id)
        effect = reservation.effect
        if reservation.decision == "adopt":
            if effect.state == "applied":
                return effect.result
            raise EffectFailed(f"effect {call.effect_type} is {effect.state}")
        if reservation.decision == "ambiguous":
            raise EffectAmbiguous(f"effect {call.effect_type} is ambiguous and needs review")
        if reservation.decision == "uncertain":
            return self._prove(call)
        return self._apply(call)

    def _prove(self, call: EffectCall) -> Any:
        if call.read_back is None:
            self._settle(call, "ambiguous")
            raise EffectAmbiguous(
                f"effect {call.effect_type} may have applied before a crash and has no read-back"
            )
        try:
            observed = call.read_back(call.key, call.request)
        except Exception:  # noqa: BLE001 - an unanswerable read-back is ambiguity
            self._settle(call, "ambiguous")
            raise EffectAmbiguous(f"read-back of {call.effect_type} could not tell") from None
        crash_point("runner.effect.after_read_back")
        if observed is NOT_APPLIED:
            error = RunnerError(code="notApplied", message="read-back: not applied")
            self._settle(call, "failed", error=error, read_back="notApplied")
            return self._apply(call)
        self._settle(call, "succeeded", result=observed, read_back="applied")
        return observed

    def _apply(self, call: EffectCall) -> Any:
        crash_point("runner.effect.after_reserve")
        try:
            result = call.apply(call.key, call.request)
        except Exception as exc:
            error = RunnerError(code="effectFailed", message=exception_text(exc))
            self._settle(call, "failed", error=error)
            raise
        crash_point("runner.effect.after_apply")
        self._settle(call, "succeeded", result=result)
        crash_point("runner.effect.after_settle")
        return result

    def _settle(
        self,
        call: EffectCall,
        outcome: Any,
        *,
        result: Any = None,
        error: RunnerError | None = None,
        read_back: Any = UNSET,
    ) -> None:
        settle = EffectSettle(
            idempotency_key=call.key,
            outcome=outcome,
            result=result if outcome == "succeeded" else UNSET,
            error=UNSET if error is None else error,
            read_back=read_back,
        )
        self._channel.send(settle, self._attempt_id)
