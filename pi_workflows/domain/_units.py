"""Units of work as named data: one record per kind, resolved by the actor that runs it.

Implements the house rule that messages carry data, never code: an actor asks the
database or reader actor for a unit (`Transact(RecordSpawn(...))`), and that actor
resolves the record's kind to its function here (`perform`). Each record's fields are
the keyword arguments of its function, so a unit reads as the call it stands for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from pi_workflows.domain._admission import admit
from pi_workflows.domain._channel_ops import recover_channel
from pi_workflows.domain._channel_work import (
    ProfileScope,
    WorkItem,
    answer_from_channel,
    counts_by_channel,
    find_work,
    interrupt_adapter,
    record_result,
    reserve_work,
)
from pi_workflows.domain._deadlines import expire_due, next_deadline, suspend_session
from pi_workflows.domain._decisions import answer_decision_command, list_decisions
from pi_workflows.domain._epochs import ActiveEpochs
from pi_workflows.domain._handover import adopt_run, resume_headless
from pi_workflows.domain._interactions import (
    SessionAuthority,
    add_follow_up_command,
    answer_from_session,
    settle_validation,
    submit_interaction,
    update_interaction,
    validations_to_resume,
)
from pi_workflows.domain._operations import (
    OperationContext,
    StartRequest,
    handle_operation,
    prior_answer,
    restart_lookup,
    restart_run,
    start_run,
)
from pi_workflows.domain._origin_reports import clear_terminal_view, report_branch, report_turn
from pi_workflows.domain._resource_ops import (
    apply_resource_manager,
    resource_manager_command,
    resource_manager_read,
)
from pi_workflows.domain._resource_work import (
    RECENT_PASSES,
    apply_resource_spec,
    claim_reconcile,
    commit_reconcile_pass,
    delete_resource,
    enqueue_resource_key,
    ensure_resource_child_run,
    recover_reconcile_claims,
    release_reconcile_claim,
    reserve_pass_effect,
    reserve_resource_child_run,
    resource_list_view,
    resource_view,
    retry_pass_effect,
    settle_pass_effect,
)
from pi_workflows.domain._retention import (
    checkpoint_sweep_wal,
    collect_sweep_blobs,
    compact_after_sweep,
    select_expired,
    sweep_tree,
)
from pi_workflows.domain._run_view_cache import RunViewCache
from pi_workflows.domain._runner_exits import ExitFacts, hand_back, record_exit
from pi_workflows.domain._runner_handlers import RunnerView, apply_message
from pi_workflows.domain._runner_launch import record_spawn
from pi_workflows.domain._server_claims import (
    release_server_claim,
    renew_server_claims,
    retake_server_claims,
)
from pi_workflows.domain._session_record import record_session_events
from pi_workflows.domain._state_backup import BackupOutcome, record_backup
from pi_workflows.domain._state_prune import (
    PruneProgress,
    PruneQuery,
    TreeFiles,
    delete_prune_tree,
    orphan_files,
    prune_dry_run,
    record_prune,
    select_and_back_up,
)
from pi_workflows.domain._view_subscriptions import read_view
from pi_workflows.domain._view_types import ViewSpec
from pi_workflows.storage import (
    DEFAULT_CLAIM_TTL_MS,
    RETRY_BOUND_MS,
    ChannelResult,
    Claim,
    Database,
    PassResult,
    PruneTree,
    QueueKind,
    ResourceClaim,
    ServerClaim,
    run_view_revision,
    server_has_work,
)
from pi_workflows.supervision import ProcessIdentity
from pi_workflows.wire.protocol import RequestMessage
from pi_workflows.wire.runner import RunnerMessage

__all__ = [
    "AddFollowUp",
    "AdmitRuns",
    "AdoptRun",
    "AnswerDecision",
    "AnswerFromChannel",
    "AnswerFromSession",
    "ApplyResource",
    "ApplyResourceManager",
    "ApplyRunnerMessage",
    "Barrier",
    "CheckpointSweepWal",
    "ClaimReconcile",
    "ClearTerminalView",
    "ClientOperation",
    "CollectSweepBlobs",
    "CommitReconcile",
    "CompactAfterSweep",
    "CountChannelWork",
    "DeletePruneTree",
    "DeleteResource",
    "EnqueueResource",
    "EnsureChildRun",
    "ExpireDue",
    "FindChannelWork",
    "FindOrphanFiles",
    "HandBackRun",
    "InterruptAdapter",
    "ListDecisions",
    "ListResources",
    "LookUpRestart",
    "NextDeadline",
    "Perform",
    "PriorAnswer",
    "PruneDryRun",
    "ReadView",
    "RecordChannelResult",
    "RecordPrune",
    "RecordRunnerExit",
    "RecordSessionEvents",
    "RecordSpawn",
    "RecoverChannel",
    "RecoverResourceClaims",
    "ReleaseReconcileClaim",
    "ReleaseServerClaim",
    "RenewServerClaims",
    "ReportBranch",
    "ReportTurn",
    "ReserveChannelWork",
    "ReserveChildRun",
    "ReserveResourceEffect",
    "ResourceManagerCommand",
    "ResourceManagerRead",
    "ResourceView",
    "RestartRun",
    "ResumeHeadless",
    "RetakeServerClaims",
    "RetryResourceEffect",
    "RunViewRevision",
    "SelectAndBackUp",
    "SelectExpired",
    "ServerHasWork",
    "SettleResourceEffect",
    "SettleValidation",
    "StartRun",
    "SubmitInteraction",
    "SuspendSession",
    "SweepTree",
    "UpdateInteraction",
    "ValidationsToResume",
    "perform",
    "unit_label",
    "with_run_views",
]

Perform = Callable[[Database, object], Any]
"""How an actor runs a unit: `perform` here, or a test's extension of it."""

_U = TypeVar("_U")

_WORK: dict[type[Any], tuple[Callable[..., Any], tuple[str, ...]]] = {}
"""Each unit kind's function and the record fields passed to it by name (filled once,
at import, by `_runs`; never changed afterwards)."""


def _runs(work: Callable[..., Any]) -> Callable[[type[_U]], type[_U]]:
    """Register a unit record as standing for `work(db, **fields)`."""

    def register(kind: type[_U]) -> type[_U]:
        names = tuple(field.name for field in dataclasses.fields(kind))  # type: ignore[arg-type]
        _WORK[kind] = (work, names)
        return kind

    return register


def perform(db: Database, unit: object) -> Any:
    """Run `unit` on `db` (the writer in a group commit, or the reader's snapshot).

    Raises:
        TypeError: `unit` is not a unit of work.
    """
    try:
        work, names = _WORK[type(unit)]
    except KeyError:
        raise TypeError(f"not a unit of work: {type(unit).__name__}") from None
    return work(db, **{name: getattr(unit, name) for name in names})


def with_run_views(unit: object, views: RunViewCache) -> object:
    """`unit` as the reader actor performs it: a run's view (`run.get`, or a run
    subscription's read) is served from `views`, built once per revision. Any other
    unit is returned as it is."""
    match unit:
        case ClientOperation(request=request) if request["operation"] == "run.get":
            return dataclasses.replace(unit, views=views)
        case ReadView(spec=spec) if spec.kind == "run":
            return dataclasses.replace(unit, views=views)
    return unit


def unit_label(unit: object) -> str:
    """A safe name of the unit for logs (an operation or unit name, never a payload)."""
    label = getattr(unit, "label", None)
    return label if isinstance(label, str) else type(unit).__name__


def _count(db: Database, value: int) -> int:
    del db
    return value


# --- runners -----------------------------------------------------------------------------


@_runs(record_spawn)
@dataclass(frozen=True, slots=True)
class RecordSpawn:
    """Record a spawned runner's exact identity."""

    label: ClassVar[str] = "runner.spawned"
    runner_epoch: str
    identity: ProcessIdentity


@_runs(apply_message)
@dataclass(frozen=True, slots=True)
class ApplyRunnerMessage:
    """Apply one runner message the runner host checked (epoch, generation)."""

    label: ClassVar[str] = "runner.message"
    view: RunnerView
    message: RunnerMessage


@_runs(record_exit)
@dataclass(frozen=True, slots=True)
class RecordRunnerExit:
    """A runner's one terminal outcome, and what its run does next."""

    label: ClassVar[str] = "runner.exit"
    facts: ExitFacts
    returncode: int


@_runs(hand_back)
@dataclass(frozen=True, slots=True)
class HandBackRun:
    """A graceful stop: requeue a run a live runner still holds."""

    label: ClassVar[str] = "runner.hand_back"
    facts: ExitFacts


@_runs(_count)
@dataclass(frozen=True, slots=True)
class Barrier:
    """Answers `value` after every unit queued before it (the database keeps order)."""

    label: ClassVar[str] = "barrier"
    value: int


@_runs(admit)
@dataclass(frozen=True, slots=True)
class AdmitRuns:
    """Choose the runs and due reconciles to admit now, alternating kinds, and claim each
    (`reconcile_ttl_ms` None: no reconcile is admitted)."""

    label: ClassVar[str] = "plan"
    capacity: int
    last_kind: QueueKind | None
    owner_id: str
    reconcile_ttl_ms: int | None = None


# --- the server lease --------------------------------------------------------------------


@_runs(renew_server_claims)
@dataclass(frozen=True, slots=True)
class RenewServerClaims:
    label: ClassVar[str] = "claims.renew"
    claim: ServerClaim


@_runs(retake_server_claims)
@dataclass(frozen=True, slots=True)
class RetakeServerClaims:
    label: ClassVar[str] = "claims.retake"
    claim: ServerClaim
    pid: int | None


@_runs(release_server_claim)
@dataclass(frozen=True, slots=True)
class ReleaseServerClaim:
    label: ClassVar[str] = "server.release"
    claim: ServerClaim
    children_gone: bool


@_runs(server_has_work)
@dataclass(frozen=True, slots=True)
class ServerHasWork:
    """Whether durable state needs the server to stay up (the idle check)."""

    label: ClassVar[str] = "server.idle_check"


# --- client requests ---------------------------------------------------------------------


@_runs(handle_operation)
@dataclass(frozen=True, slots=True)
class ClientOperation:
    """One client read or command by its operation name (`domain/_operations.py`)."""

    request: RequestMessage
    ctx: OperationContext
    claim: Claim | None = None
    """The live runner's claim a run command presents (the runner host knows it)."""
    views: RunViewCache | None = dataclasses.field(default=None, compare=False, repr=False)
    """The reader actor's built run views (`with_run_views`); never set by an asker."""

    @property
    def label(self) -> str:
        return str(self.request["operation"])


@_runs(adopt_run)
@dataclass(frozen=True, slots=True)
class AdoptRun:
    """`run.adopt`: the requesting Pi session becomes the run's origin session (the
    epochs say whether its old origin session is open in a Pi)."""

    label: ClassVar[str] = "run.adopt"
    request: RequestMessage
    ctx: OperationContext
    epochs: ActiveEpochs


@_runs(resume_headless)
@dataclass(frozen=True, slots=True)
class ResumeHeadless:
    """`run.resumeHeadless`: the interactive run goes on without a Pi session."""

    label: ClassVar[str] = "run.resumeHeadless"
    request: RequestMessage
    ctx: OperationContext
    epochs: ActiveEpochs


@_runs(prior_answer)
@dataclass(frozen=True, slots=True)
class PriorAnswer:
    """The stored answer of a command already handled under this request's identity."""

    label: ClassVar[str] = "run.start.receipt"
    request: RequestMessage


@_runs(start_run)
@dataclass(frozen=True, slots=True)
class StartRun:
    label: ClassVar[str] = "run.start"
    request: RequestMessage
    ctx: OperationContext
    start: StartRequest
    resolved: Mapping[str, Any]


@_runs(restart_lookup)
@dataclass(frozen=True, slots=True)
class LookUpRestart:
    """`run.restart`'s stored answer, or the finished run's source to resolve again."""

    label: ClassVar[str] = "run.restart.lookup"
    request: RequestMessage


@_runs(restart_run)
@dataclass(frozen=True, slots=True)
class RestartRun:
    label: ClassVar[str] = "run.restart"
    request: RequestMessage
    ctx: OperationContext
    resolved: Mapping[str, Any] | None


@_runs(run_view_revision)
@dataclass(frozen=True, slots=True)
class RunViewRevision:
    label: ClassVar[str] = "view.subscribe"
    run_id: str


@_runs(update_interaction)
@dataclass(frozen=True, slots=True)
class UpdateInteraction:
    label: ClassVar[str] = "interaction.update"
    request: RequestMessage
    authority: SessionAuthority | None = None


@_runs(add_follow_up_command)
@dataclass(frozen=True, slots=True)
class AddFollowUp:
    label: ClassVar[str] = "followUp.add"
    request: RequestMessage


@_runs(answer_decision_command)
@dataclass(frozen=True, slots=True)
class AnswerDecision:
    label: ClassVar[str] = "decision.answer"
    request: RequestMessage


@_runs(list_decisions)
@dataclass(frozen=True, slots=True)
class ListDecisions:
    label: ClassVar[str] = "decision.list"
    request: RequestMessage


@_runs(answer_from_session)
@dataclass(frozen=True, slots=True)
class AnswerFromSession:
    label: ClassVar[str] = "run.answer"
    request: RequestMessage
    ctx: OperationContext
    authority: SessionAuthority | None = None


@_runs(recover_channel)
@dataclass(frozen=True, slots=True)
class RecoverChannel:
    label: ClassVar[str] = "channel.recover"
    request: RequestMessage
    ctx: OperationContext


@_runs(report_branch)
@dataclass(frozen=True, slots=True)
class ReportBranch:
    label: ClassVar[str] = "workflowMessage.reportBranch"
    request: RequestMessage
    connection_id: str
    epochs: ActiveEpochs


@_runs(report_turn)
@dataclass(frozen=True, slots=True)
class ReportTurn:
    label: ClassVar[str] = "workflowTurn.report"
    request: RequestMessage
    connection_id: str
    epochs: ActiveEpochs


@_runs(record_session_events)
@dataclass(frozen=True, slots=True)
class RecordSessionEvents:
    label: ClassVar[str] = "sessionEvents.record"
    request: RequestMessage
    connection_id: str
    epochs: ActiveEpochs


@_runs(clear_terminal_view)
@dataclass(frozen=True, slots=True)
class ClearTerminalView:
    label: ClassVar[str] = "sessionView.clearTerminal"
    request: RequestMessage
    connection_id: str
    epochs: ActiveEpochs


# --- submissions and validation ----------------------------------------------------------


@_runs(submit_interaction)
@dataclass(frozen=True, slots=True)
class SubmitInteraction:
    label: ClassVar[str] = "interaction.submit"
    request: RequestMessage
    agent_dir: Path
    authority: SessionAuthority | None = None


@_runs(settle_validation)
@dataclass(frozen=True, slots=True)
class SettleValidation:
    label: ClassVar[str] = "interaction.settle"
    submission_id: str
    report: Mapping[str, Any] | None
    reason: str


@_runs(validations_to_resume)
@dataclass(frozen=True, slots=True)
class ValidationsToResume:
    label: ClassVar[str] = "interaction.resume"
    agent_dir: Path


# --- timers without a runner -------------------------------------------------------------


@_runs(suspend_session)
@dataclass(frozen=True, slots=True)
class SuspendSession:
    """A session's coordinator epoch ended: its running step spans stop."""

    label: ClassVar[str] = "coordinator.epoch_ended"
    session_id: str


@_runs(next_deadline)
@dataclass(frozen=True, slots=True)
class NextDeadline:
    label: ClassVar[str] = "deadlines"


@_runs(expire_due)
@dataclass(frozen=True, slots=True)
class ExpireDue:
    label: ClassVar[str] = "deadlines.expire"
    owner_id: str


# --- live views --------------------------------------------------------------------------


@_runs(read_view)
@dataclass(frozen=True, slots=True)
class ReadView:
    """The view `spec` names if its revision differs from `since` (None: unchanged)."""

    label: ClassVar[str] = "view"
    spec: ViewSpec
    since: int
    epochs: ActiveEpochs | None = None
    views: RunViewCache | None = dataclasses.field(default=None, compare=False, repr=False)
    """The reader actor's built run views (`with_run_views`); never set by an asker."""


# --- state prune -------------------------------------------------------------------------


@_runs(prune_dry_run)
@dataclass(frozen=True, slots=True)
class PruneDryRun:
    label: ClassVar[str] = "state.prune"
    request: RequestMessage
    query: PruneQuery
    blob_grace_ms: int


@_runs(select_and_back_up)
@dataclass(frozen=True, slots=True)
class SelectAndBackUp:
    label: ClassVar[str] = "state.prune"
    request: RequestMessage
    query: PruneQuery


@_runs(delete_prune_tree)
@dataclass(frozen=True, slots=True)
class DeletePruneTree:
    label: ClassVar[str] = "state.prune"
    tree: PruneTree
    cutoff: int


@_runs(record_prune)
@dataclass(frozen=True, slots=True)
class RecordPrune:
    label: ClassVar[str] = "state.prune"
    request: RequestMessage
    query: PruneQuery
    progress: PruneProgress
    blob_grace_ms: int


# --- automatic retention -----------------------------------------------------------------


@_runs(select_expired)
@dataclass(frozen=True, slots=True)
class SelectExpired:
    label: ClassVar[str] = "retention"
    days: int
    cutoff: int | None = None
    after: str = ""


@_runs(sweep_tree)
@dataclass(frozen=True, slots=True)
class SweepTree:
    label: ClassVar[str] = "retention"
    tree: PruneTree
    cutoff: int


@_runs(collect_sweep_blobs)
@dataclass(frozen=True, slots=True)
class CollectSweepBlobs:
    label: ClassVar[str] = "retention"
    digests: frozenset[str]
    blob_grace_ms: int


@_runs(orphan_files)
@dataclass(frozen=True, slots=True)
class FindOrphanFiles:
    label: ClassVar[str] = "retention"
    files: TreeFiles


@_runs(checkpoint_sweep_wal)
@dataclass(frozen=True, slots=True)
class CheckpointSweepWal:
    label: ClassVar[str] = "retention"


@_runs(compact_after_sweep)
@dataclass(frozen=True, slots=True)
class CompactAfterSweep:
    label: ClassVar[str] = "retention"
    vacuum_min_bytes: int
    vacuum_min_free_ratio: float


# --- state backup ------------------------------------------------------------------------


@_runs(record_backup)
@dataclass(frozen=True, slots=True)
class RecordBackup:
    label: ClassVar[str] = "state.backup"
    request: RequestMessage
    outcome: BackupOutcome


# --- channel adapters --------------------------------------------------------------------


@_runs(find_work)
@dataclass(frozen=True, slots=True)
class FindChannelWork:
    label: ClassVar[str] = "channel.scan"
    scopes: Sequence[ProfileScope]


@_runs(reserve_work)
@dataclass(frozen=True, slots=True)
class ReserveChannelWork:
    label: ClassVar[str] = "channel.reserve"
    item: WorkItem
    adapter_epoch: str


@_runs(record_result)
@dataclass(frozen=True, slots=True)
class RecordChannelResult:
    label: ClassVar[str] = "channel.result"
    channel: str
    adapter_epoch: str
    attempt_id: str
    channel_revision: int
    result: ChannelResult
    retry_bound_ms: int = RETRY_BOUND_MS


@_runs(answer_from_channel)
@dataclass(frozen=True, slots=True)
class AnswerFromChannel:
    label: ClassVar[str] = "channel.answer"
    channel: str
    profile: str
    event_id: str
    answer: Mapping[str, Any]


@_runs(interrupt_adapter)
@dataclass(frozen=True, slots=True)
class InterruptAdapter:
    label: ClassVar[str] = "channel.interrupt"
    channel: str
    adapter_epoch: str


@_runs(counts_by_channel)
@dataclass(frozen=True, slots=True)
class CountChannelWork:
    label: ClassVar[str] = "channel.status"
    channels: Sequence[str]


# --- resource managers -------------------------------------------------------------------


@_runs(resource_manager_read)
@dataclass(frozen=True, slots=True)
class ResourceManagerRead:
    """`resourceManager.list` or `resourceManager.get` (the reader actor)."""

    request: RequestMessage
    ctx: OperationContext

    @property
    def label(self) -> str:
        return str(self.request["operation"])


@_runs(resource_manager_command)
@dataclass(frozen=True, slots=True)
class ResourceManagerCommand:
    """`resourceManager.reconcile` or `resourceManager.delete`, with its receipt."""

    request: RequestMessage
    ctx: OperationContext

    @property
    def label(self) -> str:
        return str(self.request["operation"])


@_runs(apply_resource_manager)
@dataclass(frozen=True, slots=True)
class ApplyResourceManager:
    """`resourceManager.apply` once the resolver child answered: the source check, the
    resource's new spec and the receipt, in one transaction."""

    label: ClassVar[str] = "resourceManager.apply"
    request: RequestMessage
    ctx: OperationContext
    resolved: Mapping[str, Any]


@_runs(apply_resource_spec)
@dataclass(frozen=True, slots=True)
class ApplyResource:
    """`resource-manager apply`, after the resolver child and the source check: create
    the resource or give it a new spec, and enqueue it."""

    label: ClassVar[str] = "resource.apply"
    manager: str
    project_path: str
    key: str
    spec: Any
    initial_status: Any
    source_identity: Mapping[str, Any]
    source_digest: str
    finalizers: tuple[str, ...] = ()


@_runs(enqueue_resource_key)
@dataclass(frozen=True, slots=True)
class EnqueueResource:
    """A wake-up hint for one key (`reconcile`, a child run's completion, a timer)."""

    label: ClassVar[str] = "resource.enqueue"
    manager: str
    project_path: str
    key: str
    reason: str
    delay_ms: int = 0


@_runs(claim_reconcile)
@dataclass(frozen=True, slots=True)
class ClaimReconcile:
    """Claim the next due key for a resource runner (None: nothing is due)."""

    label: ClassVar[str] = "resource.claim"
    owner_id: str
    ttl_ms: int = DEFAULT_CLAIM_TTL_MS


@_runs(commit_reconcile_pass)
@dataclass(frozen=True, slots=True)
class CommitReconcile:
    """Commit a pass's proposed result under its claim and the version it read."""

    label: ClassVar[str] = "resource.commit"
    claim: ResourceClaim
    result: PassResult
    jitter: float | None = None


@_runs(release_reconcile_claim)
@dataclass(frozen=True, slots=True)
class ReleaseReconcileClaim:
    """Give a pass's claim up without a result; the key stays queued."""

    label: ClassVar[str] = "resource.release"
    claim: ResourceClaim


@_runs(delete_resource)
@dataclass(frozen=True, slots=True)
class DeleteResource:
    """`resource-manager delete`: remove now, or mark and enqueue the cleanup pass."""

    label: ClassVar[str] = "resource.delete"
    manager: str
    project_path: str
    key: str


@_runs(reserve_resource_child_run)
@dataclass(frozen=True, slots=True)
class ReserveChildRun:
    """`ctx.workflows.ensure`: find or reserve the child run of a request key."""

    label: ClassVar[str] = "resource.ensure_run"
    claim: ResourceClaim
    request_key: str
    input_fingerprint: str
    workflow_name: str


@_runs(ensure_resource_child_run)
@dataclass(frozen=True, slots=True)
class EnsureChildRun:
    """`ctx.workflows.ensure` over the resource runner's channel: find the child run
    of a request key, or reserve its ID and queue it in the same transaction."""

    label: ClassVar[str] = "resource.ensure_child"
    claim: ResourceClaim
    request_key: str
    input_fingerprint: str
    workflow_name: str
    resolved: Mapping[str, Any]


@_runs(reserve_pass_effect)
@dataclass(frozen=True, slots=True)
class ReserveResourceEffect:
    """`ctx.effects.ensure`: record the effect before `apply`, or find it."""

    label: ClassVar[str] = "resource.effect_reserve"
    claim: ResourceClaim
    key: str
    kind: str
    request: Any


@_runs(settle_pass_effect)
@dataclass(frozen=True, slots=True)
class SettleResourceEffect:
    """Record an effect's outcome, from `apply` or (`observed`) from `observe`."""

    label: ClassVar[str] = "resource.effect_settle"
    claim: ResourceClaim
    key: str
    outcome: Literal["applied", "rejected"]
    result: Any = None
    error: str | None = None
    observed: bool = False


@_runs(retry_pass_effect)
@dataclass(frozen=True, slots=True)
class RetryResourceEffect:
    """`observe` proved nothing applied: this pass opens the next attempt."""

    label: ClassVar[str] = "resource.effect_retry"
    claim: ResourceClaim
    key: str


@_runs(recover_reconcile_claims)
@dataclass(frozen=True, slots=True)
class RecoverResourceClaims:
    """Expired resource claims (with `every`, at startup: all) return their keys to the
    queue."""

    label: ClassVar[str] = "resource.recover"
    every: bool = False


@_runs(resource_view)
@dataclass(frozen=True, slots=True)
class ResourceView:
    """`resource-manager get`: one resource with its child runs, effects and passes."""

    label: ClassVar[str] = "resource.get"
    manager: str
    project_path: str
    key: str
    history: int = RECENT_PASSES


@_runs(resource_list_view)
@dataclass(frozen=True, slots=True)
class ListResources:
    """`resource-manager list`, optionally of one manager or project."""

    label: ClassVar[str] = "resource.list"
    now: int
    manager: str | None = None
    project_path: str | None = None
