"""Launching a runner: the claim and launch envelope, the spawn record, the start state.

Implements workflow-server.md § Runner lifecycle (the launch envelope, the explicit
command) and § Recovery ("resumes from the last committed boundary"). These are units of
database work: they take data and return data, and the runner-host actor applies the
result to its own state.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from pi_workflows.storage import (
    Claim,
    Database,
    Tx,
    claim_for_launch,
    get_run,
    interactive_origin_session,
    read_continuation,
    read_resume_state,
    record_process,
)
from pi_workflows.supervision import ProcessIdentity
from pi_workflows.wire.canonical import sha256_digest
from pi_workflows.wire.protocol import LAUNCH_SCHEMA
from pi_workflows.wire.runner import FinishedStep, RunState, UnfinishedStep

__all__ = ["PROTOCOL_VERSION", "LaunchPlan", "launch_state", "prepare_launch", "record_spawn"]

PROTOCOL_VERSION = 1


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """One claimed run generation, ready to spawn: everything the runner host needs."""

    run_id: str
    runner_epoch: str
    claim: Claim
    envelope: dict[str, Any]
    command: str
    """`start`, `resume` or `continue`: the explicit command sent after `runner.ready`."""
    project_path: str
    launched_at: int
    """When the claim committed (the startup deadline counts from here)."""


def prepare_launch(db: Database, run_id: str, owner_id: str) -> LaunchPlan | None:
    """Claim a queued run for a new runner generation and build its launch envelope.

    **Durability:** the claim, the new generation and the `starting` runner epoch
    commit before anything is spawned, so a crash leaves a record to reap.
    """
    run = get_run(db, run_id)
    if run is None:
        return None
    runner_epoch = f"runner-{uuid.uuid4().hex}"
    envelope: dict[str, Any] = {
        "schema": LAUNCH_SCHEMA,
        "runId": run_id,
        "generation": run.generation + 1,
        "runnerEpoch": runner_epoch,
        "projectPath": run.project_path,
        "workflowSource": json.loads(run.source_identity),
        "definitionDigest": run.definition_digest,
        "inputHash": run.input_hash,
        "protocolVersion": PROTOCOL_VERSION,
    }
    if run.continuation_of is not None:
        command = "continue"
    else:
        command = "resume" if read_resume_state(db, run_id).completed else "start"
    with db.write() as tx:
        launched = claim_for_launch(
            tx,
            run_id,
            owner_id=owner_id,
            runner_epoch=runner_epoch,
            launch_envelope_hash=sha256_digest(envelope),
        )
    envelope["generation"] = launched.claim.generation  # the claim decides
    return LaunchPlan(
        run_id, runner_epoch, launched.claim, envelope, command, run.project_path, db.clock.now_ms()
    )


def record_spawn(db: Database, runner_epoch: str, identity: ProcessIdentity) -> None:
    """Record a spawned runner's exact identity durably.

    A server that dies after this commit leaves a record its successor stops by
    identity; before it, the runner is bound to this server's channel and the zygote
    and ends with them.
    """
    with db.write() as tx:
        record_process(
            tx,
            runner_epoch,
            pid=identity.pid,
            start_ticks=identity.start_ticks,
            boot_id=identity.boot_id,
            role="runner",
        )


def launch_state(reader: Tx, run_id: str) -> tuple[RunState, str | None]:
    """The durable state a runner starts from, and the checkpoint attempt it continues.

    A continuation run continues its whole chain: the finished attempts of every
    ancestor come first, the answered checkpoint's output is its answer, and the run's
    own attempts (if an earlier runner of it crashed) come last.
    """
    chain: list[str] = []
    answers: dict[str, Any] = {}
    parent_attempt: str | None = None
    current: str | None = run_id
    while current is not None:
        chain.append(current)
        row = get_run(reader, current)
        continued = read_continuation(reader, current) if row and row.continuation_of else None
        if continued is not None:
            decision, answer = continued
            answers.setdefault(decision.node_path, answer)
            if current == run_id:
                parent_attempt = decision.attempt_id
        current = row.continuation_of if row is not None else None
    states = [read_resume_state(reader, ancestor) for ancestor in reversed(chain)]
    outputs: dict[str, Any] = {}
    visits: dict[str, int] = {}
    finished: list[FinishedStep] = []
    for state in states:
        outputs.update(state.outputs)
        for path, count in state.visits.items():
            visits[path] = visits.get(path, 0) + count
        finished.extend(
            FinishedStep(
                attempt_id=a.attempt_id,
                node_path=a.node_path,
                visit=a.visit,
                status=a.status,
                next_node_path=a.next_node_path,
                error=a.error,
            )
            for a in state.finished
        )
    outputs.update(answers)
    unfinished = states[-1].unfinished
    # An interactive run's agent steps run in its origin Pi session, not in a pi child.
    origin = interactive_origin_session(reader, run_id)
    return RunState(
        run_id=run_id,
        revision=states[0].revision,
        input=states[0].input,
        outputs=outputs,
        visits=visits,
        finished=finished,
        unfinished=None
        if unfinished is None
        else UnfinishedStep(
            attempt_id=unfinished.attempt_id,
            node_path=unfinished.node_path,
            node_type=unfinished.node_type,
            visit=unfinished.visit,
            status=unfinished.status,
        ),
        origin_session_id=None if origin is None else str(origin),
    ), parent_attempt
