"""The exit policy: a runner's one terminal outcome, and what its run does next.

Implements workflow-server.md § Runner lifecycle ("A runner exit is not automatically a
run failure") and § Failure classification. Units of database work over `ExitFacts`,
the data the runner-host actor knows about a runner when it is reaped or handed back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pi_workflows.storage import (
    Claim,
    ClaimLostError,
    Database,
    InvalidTransitionError,
    ParkReason,
    RunnerOutcome,
    count_runner_outcomes,
    fail_node_attempt,
    forget_recorded_processes,
    park_run,
    record_runner_exit,
    requeue_run,
    runner_made_progress,
)

__all__ = ["MAX_RUNNER_CRASHES", "ExitFacts", "hand_back", "record_exit"]

MAX_RUNNER_CRASHES = 3
"""Crashed runner epochs after which a run parks with `workerCrashed` instead of requeuing."""

STOPPING_REASON = "serverStopping"
"""Why a graceful stop requeued a run: at a durable boundary or when the drain ended."""


@dataclass(frozen=True, slots=True)
class ExitFacts:
    """What the runner host knew about a runner when it ended."""

    run_id: str
    runner_epoch: str
    claim: Claim = field(repr=False)
    settled: bool
    """The run left `running` through this runner, or a command or claim loss fenced it."""
    stop_requested: bool
    """The server asked the group to stop (a command, a deadline, a drain)."""
    claim_lost: bool = False
    timed_out_attempt: str | None = None
    """The attempt whose node deadline passed, if that is why the runner was stopped."""


def record_exit(db: Database, facts: ExitFacts, returncode: int) -> str:
    """Record the runner's one terminal outcome and decide what the run does next.

    Returns a short reason for logs. A runner exit alone is never a run failure; if the
    claim is already gone, nothing more is written (claim loss is a handoff).
    """
    exit_code = returncode if returncode >= 0 else None
    signal_number = -returncode if returncode < 0 else None
    if facts.settled:
        if facts.claim_lost:
            outcome = RunnerOutcome.CLAIM_LOST
        elif facts.stop_requested:
            outcome = RunnerOutcome.CANCELLED
        else:
            outcome = RunnerOutcome.EXITED
        with db.write() as tx:
            forget_recorded_processes(tx, facts.runner_epoch)
            record_runner_exit(
                tx, facts.runner_epoch, outcome=outcome, exit_code=exit_code, signal=signal_number
            )
        return outcome.value
    outcome = RunnerOutcome.TIMED_OUT if facts.stop_requested else RunnerOutcome.CRASHED
    with db.write() as tx:
        forget_recorded_processes(tx, facts.runner_epoch)
        record_runner_exit(
            tx, facts.runner_epoch, outcome=outcome, exit_code=exit_code, signal=signal_number
        )
        no_progress = not runner_made_progress(tx, facts.runner_epoch)
        try:
            if facts.timed_out_attempt is not None:
                # The node ran out of time: end its attempt as timed_out (a durable
                # boundary) and let the next runner route `$result.outcome`.
                fail_node_attempt(
                    tx,
                    facts.claim,
                    attempt_id=facts.timed_out_attempt,
                    error="nodeTimedOut: the node exceeded its deadline",
                    timed_out=True,
                )
                requeue_run(tx, facts.run_id, reason="nodeTimedOut", claim=facts.claim)
                return "nodeTimedOut"
            if no_progress:
                park_run(tx, facts.claim, reason=ParkReason.RUNNER_NO_PROGRESS)
                return "runnerNoProgress"
            if count_runner_outcomes(tx, facts.run_id, "crashed") >= MAX_RUNNER_CRASHES:
                # Progress, then a crash, again and again: stop the loop for review.
                park_run(tx, facts.claim, reason="workerCrashed")
                return "workerCrashed"
            requeue_run(tx, facts.run_id, reason="workerCrashed", claim=facts.claim)
        except (ClaimLostError, InvalidTransitionError):
            return "claim already gone"
    return "workerCrashed"


def hand_back(db: Database, facts: ExitFacts) -> bool:
    """At the end of a graceful stop: requeue a run a live runner still holds.

    The runner's one terminal outcome (`cancelled`) is recorded here, because the
    process supervisor kills the group next. The recorded identities stay, so if this
    server dies before the kill, the next one stops them. Returns True if the run was
    handed back (False: it had already left `running`).
    """
    handed = False
    with db.write() as tx:
        if not facts.settled:
            try:
                requeue_run(tx, facts.run_id, reason=STOPPING_REASON, claim=facts.claim)
                handed = True
            except (ClaimLostError, InvalidTransitionError):
                pass  # already handed off or finished: nothing to give back
        record_runner_exit(tx, facts.runner_epoch, outcome=RunnerOutcome.CANCELLED)
    return handed
