"""`run.adopt` and `run.resumeHeadless`: the ways out for an interactive run whose origin
Pi session cannot come back. Each is one command transaction with its receipt.

Implements workflow-server.md § Interactive Pi execution (one origin session, one
active coordinator epoch) and § Detached execution for a run handed over mid-way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, TypeAlias

from pi_workflows.domain._epochs import ActiveEpochs
from pi_workflows.domain._operations import (
    OperationContext,
    OperationError,
    origin_session_steps,
    rejected,
    run_command,
)
from pi_workflows.storage import (
    ClaimLostError,
    CommandRequest,
    Database,
    InvalidTransitionError,
    RunNotFoundError,
    RunRow,
    Tx,
    get_run,
    interactive_origin_session,
    make_run_headless,
    move_origin_session,
    phase_of,
    read_head,
    read_json_blob,
    record_interaction_event,
    requeue_run,
    resume_run,
    run_paused,
    session_reservation,
    waits_at_agent_step,
)
from pi_workflows.wire.protocol import RequestMessage

__all__ = ["EVENT_RUN_ADOPTED", "EVENT_RUN_HEADLESS", "adopt_run", "resume_headless"]

EVENT_RUN_ADOPTED: Final = "run_adopted"
EVENT_RUN_HEADLESS: Final = "run_headless"
MAX_ID_CHARS: Final = 256
Change: TypeAlias = Callable[[Tx, CommandRequest], tuple[str, int, dict[str, Any]]]


def _opaque_id(value: object) -> bool:
    return (
        isinstance(value, str)
        and 0 < len(value) <= MAX_ID_CHARS
        and not any(ord(char) < 0x20 or ord(char) == 0x7F for char in value)
    )


def _run_id(request: RequestMessage) -> str:
    run_id = request.get("runId")
    if not _opaque_id(run_id):
        raise OperationError("rejected", "runIdRequired", "this operation needs a runId")
    return str(run_id)


def _unfinished_interactive(tx: Tx, run_id: str) -> tuple[RunRow, str]:
    """The run and its origin session, or a definite refusal (stored as the receipt)."""
    run = get_run(tx, run_id)
    if run is None:
        raise OperationError("notFound", "runNotFound", f"no run {run_id}")
    if run.finished_at is not None:
        raise OperationError(
            "rejected",
            "runFinished",
            f"run {run_id} is {run.status}: there is nothing to hand over",
        )
    origin = interactive_origin_session(tx, run_id)
    if origin is None:
        raise OperationError(
            "rejected",
            "notInteractive",
            f"run {run_id} is headless: it has no origin Pi session to hand over",
        )
    return run, origin


def _refuse_open_origin(run_id: str, origin: str, epochs: ActiveEpochs) -> None:
    """One coordinator per origin session: a Pi that has the session open keeps it."""
    if epochs.coordinated(origin):
        raise OperationError(
            "rejected",
            "originSessionOpen",
            f"run {run_id}'s origin Pi session is open in a Pi right now; continue the run "
            "there, or close that Pi first",
        )


def _command(db: Database, request: RequestMessage, change: Change) -> dict[str, Any]:
    """The command transaction; a refusal that is not definite (no receipt) answers too."""
    try:
        return run_command(db, request, change)
    except OperationError as exc:
        return rejected(request, exc.outcome, exc.code, str(exc))
    except RunNotFoundError as exc:
        return rejected(request, "notFound", "runNotFound", str(exc))
    except ClaimLostError as exc:
        return rejected(request, "claimLost", "claimLost", str(exc))
    except InvalidTransitionError as exc:
        return rejected(request, "rejected", "invalidTransition", str(exc))


# --- run.adopt -------------------------------------------------------------------------


def _adopting_session(request: RequestMessage) -> str:
    session = request["payload"].get("sessionId")
    if not _opaque_id(session):
        raise OperationError(
            "rejected", "sessionIdInvalid", "payload.sessionId names the adopting Pi session"
        )
    return str(session)


def adopt_run(
    db: Database, request: RequestMessage, ctx: OperationContext, epochs: ActiveEpochs
) -> dict[str, Any]:
    """`run.adopt`: make the requesting Pi session the run's origin session.

    Refused when the run is finished or headless, when its origin session is open in a
    Pi (its coordinator epoch is active), or when the adopting session already has an
    unfinished run. Otherwise, in one transaction: the binding, the pending requests,
    messages and follow-ups move to the new session; a step presented before is
    presented there once more (`resumed`); an event and the receipt are recorded.
    """
    try:
        run_id = _run_id(request)
        session = _adopting_session(request)
    except OperationError as exc:
        return rejected(request, exc.outcome, exc.code, str(exc))

    def change(tx: Tx, _command: CommandRequest) -> tuple[str, int, dict[str, Any]]:
        _run, origin = _unfinished_interactive(tx, run_id)
        if origin == session:
            raise OperationError(
                "rejected", "alreadyOrigin", f"run {run_id} already belongs to this Pi session"
            )
        _refuse_open_origin(run_id, origin, epochs)
        holder = session_reservation(tx, session)
        if holder is not None:
            raise OperationError(
                "rejected",
                "sessionReserved",
                f"this Pi session already has an unfinished run ({holder}); wait for it or "
                "cancel it first",
            )
        move_origin_session(tx, run_id, session, paused=run_paused(tx, run_id))
        revision = record_interaction_event(tx, run_id, EVENT_RUN_ADOPTED, {"operation": "adopt"})
        return run_id, revision, {"runId": run_id, "operation": "adopt"}

    return _command(db, request, change)


# --- run.resumeHeadless ------------------------------------------------------------------


def _refuse_session_only_steps(tx: Tx, run: RunRow) -> None:
    """A headless run has no Pi session: a step only an origin session can run forbids it."""
    definition = read_json_blob(tx, run.definition_digest)
    steps = origin_session_steps(definition) if isinstance(definition, Mapping) else []
    if steps:
        raise OperationError(
            "rejected",
            "headlessForbidden",
            f"run {run.run_id} cannot run headless: step {', '.join(steps[:3])} needs an "
            f"origin Pi session; adopt the run in another Pi session (/workflow adopt "
            f"{run.run_id}) instead",
        )


def _refuse_live_runner(tx: Tx, run_id: str) -> None:
    """A runner executing the run keeps the mode it was launched with: pause it first."""
    head = read_head(tx, run_id)
    phase = phase_of(head.status, head.queue_state)
    if (phase is not None and phase.holds_claim) or head.lease_is_live(tx.now):
        raise OperationError(
            "rejected",
            "runnerActive",
            f"run {run_id} is executing in a runner now; pause it first (pi-workflows run "
            f"pause {run_id}), then run resume {run_id} --headless",
        )


def resume_headless(
    db: Database, request: RequestMessage, ctx: OperationContext, epochs: ActiveEpochs
) -> dict[str, Any]:
    """`run.resumeHeadless`: the interactive run goes on without a Pi session.

    Refused when the run is finished or already headless, when a step of its workflow
    needs an origin session, when its origin session is open in a Pi, or while a runner
    executes it. Otherwise, in one transaction: the binding becomes headless (the
    session's reservation is released), the run's pending step and decision messages are
    cancelled, a pause is cleared, and a run waiting at an agent step goes back in the
    admission line, where its next runner drives a headless pi child for that step.
    """
    try:
        run_id = _run_id(request)
    except OperationError as exc:
        return rejected(request, exc.outcome, exc.code, str(exc))

    def change(tx: Tx, _command: CommandRequest) -> tuple[str, int, dict[str, Any]]:
        run, origin = _unfinished_interactive(tx, run_id)
        _refuse_session_only_steps(tx, run)
        _refuse_open_origin(run_id, origin, epochs)
        _refuse_live_runner(tx, run_id)
        make_run_headless(tx, run_id)
        record_interaction_event(tx, run_id, EVENT_RUN_HEADLESS, {"operation": "resumeHeadless"})
        if run_paused(tx, run_id):
            resume_run(tx, run_id)
        if waits_at_agent_step(tx, run_id):
            requeue_run(tx, run_id, reason="headless")
        head = read_head(tx, run_id)
        phase = phase_of(head.status, head.queue_state)
        state = phase.value if phase is not None else head.status
        return run_id, head.revision, {"runId": run_id, "state": state, "operation": "resume"}

    return _command(db, request, change)
