"""Client operations: each one a function run by the database actor.

Implements client-protocol.md § Envelope and § Commands and uncertain results, and
workflow-server.md § Live client protocol: a state-changing command looks up its
receipt, applies its change and records its receipt in one transaction, and only
then is answered. Reads create no receipts. Errors become bounded safe errors.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from pi_workflows.domain._display_status import TERMINAL_STATUSES
from pi_workflows.domain._display_status import summary_status as display_status
from pi_workflows.domain._retention_report import RetentionReport
from pi_workflows.domain._run_list import (
    RunListQuery,
    RunListQueryError,
    parse_run_list_query,
    run_list_page,
)
from pi_workflows.domain._run_logs import RunLogsQueryError, parse_run_logs_query, run_logs
from pi_workflows.domain._run_view import build_run_view
from pi_workflows.domain._run_view_cache import RunViewCache
from pi_workflows.domain._view_content import ViewRequestError, view_content
from pi_workflows.domain._view_pages import run_page
from pi_workflows.errors import PiWorkflowsError
from pi_workflows.storage import (
    DAY_MS,
    DISK_FULL_MESSAGE,
    AnswerInvalidError,
    Claim,
    ClaimHeldError,
    ClaimLostError,
    CommandRequest,
    Database,
    EffectRecoveryError,
    ExecutionMode,
    InvalidTransitionError,
    LookupOutcome,
    NewRun,
    ReceiptLookup,
    ReceiptOutcome,
    RevisionConflictError,
    RunNotFoundError,
    RunSummary,
    Tx,
    answer_checkpoint,
    cancel_run,
    enqueue_run,
    get_lease,
    get_queue_row,
    get_run,
    get_run_summary,
    get_server_lease,
    interactive_origin_session,
    is_disk_full,
    lookup_receipt,
    pause_run,
    pending_decision,
    present_resumed_steps,
    put_json_blob,
    record_receipt,
    recover_ambiguous_effect,
    resume_run,
    retained_trees,
    run_list_revision,
    runs_by_state,
    session_reservation,
    state_counts,
    state_size,
    status_counts,
    take_over_claim,
    verify,
)
from pi_workflows.supervision import crash_point
from pi_workflows.wire.protocol import (
    CLIENT_SCHEMA,
    DISK_FULL_CODE,
    RequestMessage,
)

log = logging.getLogger(__name__)

CONTROL_CLAIM_TTL_MS = 30_000
"""Lifetime of the control claim a cancel of an expired running row takes (released at once)."""

__all__ = [
    "COMMANDS",
    "FENCING_COMMANDS",
    "LAUNCH_IN_FLIGHT",
    "READS",
    "RUNNER_COMMANDS",
    "SNAPSHOT_READS",
    "OperationContext",
    "OperationError",
    "RestartLookup",
    "StartRequest",
    "build_run_list",
    "check_resolved_start",
    "display_status",
    "failure_response",
    "handle_operation",
    "internal_error",
    "origin_session_steps",
    "prior_answer",
    "rejected",
    "restart_lookup",
    "restart_run",
    "run_command",
    "start_request_fields",
    "start_run",
    "stored_answer",
]

RUN_LIST_PAGE_ITEMS = 256


@dataclass(frozen=True, slots=True)
class OperationContext:
    """Server facts an operation may need; fixed for one server epoch (plain data)."""

    epoch: int
    owner_id: str
    """This server epoch's claim owner ID (control claims of stale rows)."""
    agent_dir: Path = field(default_factory=Path.home)
    """Pi's agent directory: the project path of a run started without one."""
    pid: int = field(default_factory=os.getpid)
    """The server's process ID (`server status` shows it; the context is built there)."""
    retention: RetentionReport | None = None
    """Automatic retention's setting and last sweep (`state status` shows it)."""


FENCING_COMMANDS = frozenset({"run.pause", "run.cancel"})
"""Commands whose commit takes a live run from its runner, which must then be stopped."""
RUNNER_COMMANDS = frozenset({"run.pause", "run.resume", "run.cancel"})
"""Commands that present the live runner's claim: the runner host routes them."""


def internal_error(request: RequestMessage) -> dict[str, Any]:
    """The answer to a request whose unit of work failed unexpectedly (logged apart)."""
    return rejected(
        request, "unavailable", "internalError", "the server failed this request; retry it"
    )


def failure_response(request: RequestMessage, error: BaseException) -> dict[str, Any]:
    """Log a request's failed unit of work and answer it: `diskFull` for a full disk
    (the database actor logs that once per episode, without a traceback), else
    `internalError` with the traceback in the log."""
    if is_disk_full(error):
        return rejected(request, "unavailable", DISK_FULL_CODE, DISK_FULL_MESSAGE)
    log.error(
        "operation failed",
        extra={"action": "operation.error", "operation": request["operation"]},
        exc_info=error,
    )
    return internal_error(request)


class OperationError(PiWorkflowsError):
    """An operation refused its input; `outcome` and `code` go into the response."""

    def __init__(self, outcome: str, code: str, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.code = code


def response(request: RequestMessage, outcome: str, **fields: Any) -> dict[str, Any]:
    """Build a response envelope for `request`."""
    return {
        "schema": CLIENT_SCHEMA,
        "type": "response",
        "requestId": request["requestId"],
        "outcome": outcome,
        **fields,
    }


def rejected(request: RequestMessage, outcome: str, code: str, message: str) -> dict[str, Any]:
    """A response carrying one bounded safe error."""
    return response(request, outcome, error={"code": code, "message": message[:1000]})


# --- Reads: no receipts ------------------------------------------------------------


Operation = Callable[[Database, RequestMessage, OperationContext, Claim | None], dict[str, Any]]
"""One client operation: a unit of database work. `claim` is the live runner's host
claim, which only the runner host can present (None for every other operation)."""


def _server_status(
    db: Database, request: RequestMessage, ctx: OperationContext, claim: Claim | None = None
) -> dict[str, Any]:
    counts = status_counts(db, db.clock.now_ms())
    queue = counts.queue_by_state
    runs = counts.runs_by_status
    lease = get_server_lease(db)  # the epoch is the stored one: a stall takes the next
    receipt = {
        "state": "running",
        "epoch": lease.epoch if lease is not None else ctx.epoch,
        "pid": ctx.pid,
        "socket": "available",
        "activeRunners": counts.active_runners,
        "runs": {
            "queued": queue.get("queued", 0),
            "running": queue.get("starting", 0) + queue.get("running", 0),
            "parked": queue.get("parked", 0) - runs.get("waiting", 0),
            "waiting": runs.get("waiting", 0),
        },
        "expiredClaims": counts.expired_claims,
        "pendingInteractions": counts.pending_interactions,
        "ambiguousEffects": counts.ambiguous_effects,
    }
    return response(request, "accepted", receipt=receipt)


def _state_status(
    db: Database, request: RequestMessage, ctx: OperationContext, claim: Claim | None = None
) -> dict[str, Any]:
    """`state.status`: the database's size and safe counts, in one read transaction."""
    size = state_size(db)
    counts = state_counts(db, db.clock.now_ms())
    if ctx.retention is not None and ctx.retention.days > 0:
        cutoff = db.clock.now_ms() - ctx.retention.days * DAY_MS
        counts["retainedTrees"] = retained_trees(db, cutoff)
    receipt = {
        "databaseBytes": size.page_size * size.page_count,
        "freeBytes": size.page_size * size.freelist_count,
        "walBytes": _wal_bytes(db),
        "pageCount": size.page_count,
        "freePages": size.freelist_count,
        "reclaimableBytes": size.page_size * size.freelist_count,
        "counts": counts,
        "runsByState": runs_by_state(db),
        "retention": ctx.retention.snapshot() if ctx.retention is not None else None,
    }
    return response(request, "accepted", receipt=receipt)


def _wal_bytes(db: Database) -> int:
    """The size of the `-wal` file beside the database (0 when there is none)."""
    try:
        return Path(f"{db.path}-wal").stat().st_size
    except OSError:
        return 0


VERIFY_FINDINGS_SHOWN = 500
"""The most findings one `state.verify` receipt lists (`findingCount` has them all)."""
VERIFY_DETAIL_CHARS = 500


def _state_verify(
    db: Database, request: RequestMessage, ctx: OperationContext, claim: Claim | None = None
) -> dict[str, Any]:
    """`state.verify`: the invariant checker on the live database, on the database actor.

    **Blocking:** reads the whole database; other requests wait until it is done.
    """
    findings = verify(db)
    receipt = {
        "consistent": not findings,
        "findingCount": len(findings),
        "truncated": len(findings) > VERIFY_FINDINGS_SHOWN,
        "findings": [
            {
                "code": finding.code.value,
                "runId": finding.run_id,
                "detail": finding.detail[:VERIFY_DETAIL_CHARS],
            }
            for finding in findings[:VERIFY_FINDINGS_SHOWN]
        ],
    }
    return response(request, "accepted", receipt=receipt)


def _summary_item(summary: RunSummary) -> dict[str, Any]:
    item: dict[str, Any] = {
        "runId": summary.run_id,
        "workflow": summary.workflow_name,
        "revision": summary.revision,
        "createdAt": summary.created_at,
        "updatedAt": summary.updated_at,
        "display": {"status": display_status(summary)},  # the view's rule too
    }
    if summary.title is not None:
        item["title"] = summary.title
    if summary.finished_at is not None:
        item["finishedAt"] = summary.finished_at
    if summary.park_reason is not None and item["display"]["status"] != "running":
        # As the view: no stopped reason beside `running` (a parking runner not yet gone).
        item["display"]["reason"] = summary.park_reason
    if summary.failure_class is not None:
        item["display"]["failureClass"] = summary.failure_class
    if summary.execution_mode is not None:
        item["executionMode"] = summary.execution_mode
    # A run settled by its checkpoint's continuation: its result is the chain's.
    if summary.continuation_of is not None:
        item["continuationOf"] = summary.continuation_of
    if summary.continued_by is not None:
        item["continuedBy"] = summary.continued_by
    item["display"].update(_summary_place(summary, item["display"]["status"]))
    return item


def _summary_place(summary: RunSummary, status: str) -> dict[str, Any]:
    """Where the listed run is, as its view says it: `currentNode` while it runs, else
    `waitingOn` (its unfinished attempt, or its pending checkpoint); `parked` for a
    `queued` run held until an operator resumes it."""
    place: dict[str, Any] = {}
    if status == "queued" and summary.queue_state == "parked":
        place["parked"] = True
    node = summary.current_node or summary.decision_node
    if node is not None and status not in TERMINAL_STATUSES:
        place["currentNode" if status == "running" else "waitingOn"] = node
    return place


def build_run_list(db: Database, since_revision: int) -> tuple[int, dict[str, Any]] | None:
    """The first run-list page, or None when the list did not change since `since_revision`.

    A full page carries `nextCursor`; the client asks `run.list` for the rest.
    """
    revision = run_list_revision(db)
    if revision == since_revision:
        return None
    return run_list_page(db, RunListQuery(limit=RUN_LIST_PAGE_ITEMS), _summary_item)


def _run_list(
    db: Database, request: RequestMessage, ctx: OperationContext, claim: Claim | None = None
) -> dict[str, Any]:
    try:
        query = parse_run_list_query(request["payload"])
    except RunListQueryError as exc:
        raise OperationError("rejected", exc.code, str(exc)) from None
    revision, page = run_list_page(db, query, _summary_item)
    return response(request, "accepted", revision=revision, receipt=page)


def _run_logs(
    db: Database, request: RequestMessage, ctx: OperationContext, claim: Claim | None = None
) -> dict[str, Any]:
    """`run.logs`: shell output and runner stderr of one run (domain/_run_logs.py)."""
    run_id = _run_id(request)
    if get_run(db, run_id) is None:
        raise OperationError("notFound", "runNotFound", f"no run {run_id}")
    try:
        query = parse_run_logs_query(request["payload"])
    except RunLogsQueryError as exc:
        raise OperationError("rejected", exc.code, str(exc)) from None
    # The state folder holds the database: <state dir>/state.sqlite, logs/runners/.
    receipt = run_logs(db, run_id, query, db.path.parent)
    summary = get_run_summary(db, run_id)
    if summary is not None:  # the run list's display: a follower knows when it settled
        receipt["display"] = _summary_item(summary)["display"]
    return response(request, "accepted", receipt=receipt)


def _run_get(
    db: Database,
    request: RequestMessage,
    ctx: OperationContext,
    claim: Claim | None = None,
    views: RunViewCache | None = None,
) -> dict[str, Any]:
    """`run.get`: the run's `pi-workflows.run-view.v1`, from one consistent read (with
    `views`, the reader actor's cache: built once per revision)."""
    run_id = _run_id(request)
    view = build_run_view(db, run_id) if views is None else views.view(db, run_id)
    if view is None:
        raise OperationError("notFound", "runNotFound", f"no run {run_id}")
    return response(request, "accepted", revision=view["revision"], receipt=view)


def _view_page(
    db: Database, request: RequestMessage, ctx: OperationContext, claim: Claim | None = None
) -> dict[str, Any]:
    """`view.page`: one `pi-workflows.run-page.v1` window (domain/_view_pages.py)."""
    try:
        page = run_page(db, _run_id(request), request["payload"])
    except ViewRequestError as exc:
        raise OperationError(exc.outcome, exc.code, str(exc)) from None
    return response(request, "accepted", revision=page["revision"], receipt=page)


def _view_content(
    db: Database, request: RequestMessage, ctx: OperationContext, claim: Claim | None = None
) -> dict[str, Any]:
    """`view.content`: one chunk of a run's stored view content (domain/_view_content.py)."""
    try:
        chunk = view_content(db, _run_id(request), request["payload"])
    except ViewRequestError as exc:
        raise OperationError(exc.outcome, exc.code, str(exc)) from None
    return response(request, "accepted", receipt=chunk)


# --- Commands: receipt, change and event in one transaction ---------------------------


def _command(request: RequestMessage) -> CommandRequest:
    durable_payload = dict(request["payload"])
    if "runId" in request:
        durable_payload["runId"] = request["runId"]
    if "expectedRevision" in request:
        durable_payload["expectedRevision"] = request["expectedRevision"]
    return CommandRequest(
        request_id=request["requestId"],
        client_id=request["clientId"],
        operation=request["operation"],
        idempotency_key=request["idempotencyKey"],
        payload=durable_payload,
    )


def stored_answer(request: RequestMessage, found: ReceiptLookup) -> dict[str, Any] | None:
    """The answer a stored receipt gives this request (adopted or conflict), or None."""
    if found.outcome is LookupOutcome.ADOPTED:
        assert found.receipt is not None
        return _adopted(request, found.receipt)
    if found.outcome is LookupOutcome.CONFLICT:
        return rejected(
            request,
            "conflict",
            "idempotencyConflict",
            "this request ID or idempotency key was already used with another payload",
        )
    return None


def prior_answer(db: Database, request: RequestMessage) -> dict[str, Any] | None:
    """The answer of a command already handled under this request's durable identity.

    For `run.start` before the resolver: the fingerprint covers the request payload as
    sent (name, input, project path), never what resolving it gives, so it is known
    before any workflow code runs. A retry adopts, another payload under the same key
    or request ID conflicts, and None means "not handled yet": resolve, then commit,
    whose own lookup in the write transaction settles a race between two first attempts.
    Read-only; it runs on the reader actor.
    """
    return stored_answer(request, lookup_receipt(db, _command(request)))


def _run_command(
    db: Database, request: RequestMessage, change: Callable[[Tx, CommandRequest], Any]
) -> dict[str, Any]:
    command = _command(request)
    with db.write() as tx:
        stored = stored_answer(request, lookup_receipt(tx, command))
        if stored is not None:
            return stored
        try:
            with tx.undoable():  # a refused change keeps nothing it wrote (a snapshot blob)
                run_id, revision, body = change(tx, command)
        except OperationError as exc:
            if exc.outcome != "rejected":
                raise
            # A definite rejection is stored too, so a retry gets the same answer.
            error = {"code": exc.code, "message": str(exc)[:1000]}
            record_receipt(tx, command, outcome=ReceiptOutcome.REJECTED, receipt=error)
            return response(request, "rejected", error=error)
        record_receipt(
            tx,
            command,
            outcome=ReceiptOutcome.ACCEPTED,
            receipt=body,
            run_id=run_id,
            accepted_revision=revision,
        )
    # In the database actor's group commit, "after commit" is after the batch's COMMIT.
    db.after_commit(lambda: crash_point("server.receipt.after_commit"))
    result = response(request, "accepted", receipt=body)
    if revision is not None:
        result["revision"] = revision
    return result


run_command = _run_command
"""The command transaction (receipt lookup, change, receipt) for the domain's other
command modules (`_handover.py`)."""


def _adopted(request: RequestMessage, stored: Any) -> dict[str, Any]:
    if stored.outcome is ReceiptOutcome.REJECTED:
        return response(request, "rejected", error=stored.receipt)
    result = response(request, "adopted", receipt=stored.receipt)
    if stored.accepted_revision is not None:
        result["revision"] = stored.accepted_revision
    return result


def _run_id(request: RequestMessage) -> str:
    run_id = request.get("runId")
    if not run_id:
        raise OperationError("rejected", "runIdRequired", "this operation needs a runId")
    return run_id


def _transition(name: str, apply: Callable[..., Any]) -> Operation:
    def operation(
        db: Database, request: RequestMessage, ctx: OperationContext, claim: Claim | None
    ) -> dict[str, Any]:
        run_id = _run_id(request)

        def change(tx: Tx, command: CommandRequest) -> tuple[str, int, dict[str, Any]]:
            if get_run(tx, run_id) is None:
                raise OperationError("notFound", "runNotFound", f"no run {run_id}")
            held = claim
            if held is None:
                _refuse_during_launch(tx, run_id, ctx.owner_id)
            if held is None and name == "cancel":
                held = _control_claim_for_stale_row(tx, run_id, ctx.owner_id)
            extra: dict[str, Any] = {}
            if name == "resume":
                # A paused origin-session step is presented again in the same commit.
                extra["change"] = lambda tx: present_resumed_steps(tx, run_id)
            result = apply(
                tx,
                run_id,
                claim=held,
                expected_revision=request.get("expectedRevision"),
                **extra,
            )
            body = {"runId": run_id, "state": result.phase.value, "operation": name}
            return run_id, result.revision, body

        return _run_command(db, request, change)

    return operation


LAUNCH_IN_FLIGHT = "launchInFlight"
"""The error code of a command that found this server's own launch claim on the run."""


def _refuse_during_launch(tx: Tx, run_id: str, owner_id: str) -> None:
    """Refuse (unstored) a command that holds no claim while this server's admission
    holds one: the runner host got the command before the launch's plan, and sends it
    again with that claim once the plan arrives (actors/_runner_host.py)."""
    lease = get_lease(tx, run_id)
    if lease is not None and lease.owner_id == owner_id and lease.expires_at > tx.now:
        raise OperationError(
            "claimLost", LAUNCH_IN_FLIGHT, "the server is starting this run's runner; retry"
        )


def _control_claim_for_stale_row(tx: Tx, run_id: str, owner_id: str) -> Claim | None:
    """Cancelling a running row no runner of this server holds: prove its lease expired.

    The control claim (a new generation) can only be taken when the old lease is absent
    or expired; a live claim is never force-cancelled through this path.
    """
    head = get_queue_row(tx, run_id)
    if head is None or head.state not in ("starting", "running"):
        return None
    try:
        return take_over_claim(
            tx,
            run_id,
            owner_id=owner_id,
            owner_is_gone=lambda _type, _owner: False,
            ttl_ms=CONTROL_CLAIM_TTL_MS,
        )
    except ClaimHeldError:
        # Not a definite rejection (nothing is stored): the claim may expire or, right
        # after admission, be the launch's own, and a retry with the key may succeed.
        raise OperationError(
            "claimLost",
            "claimHeld",
            "a live claim holds this run; it cannot be cancelled until that claim expires",
        ) from None


@dataclass(frozen=True, slots=True)
class StartRequest:
    """The fields of a `run.start` request, parsed once by the router."""

    workflow: str
    project_path: str | None
    input: Any
    origin_session_id: str | None = None
    """`payload.originSessionId`: the Pi session the run is bound to (interactive mode);
    None for a headless run."""


def start_request_fields(request: RequestMessage) -> StartRequest:
    """The workflow name, project path, input and origin session of a `run.start` request.

    `payload.originSessionId` binds the run to that Pi session (`execution_mode =
    interactive`); `payload.mode`, when given, must agree with it.

    Raises:
        OperationError: a missing name, a relative project path, a bad session ID, or a
            mode that contradicts the session.
    """
    payload = request["payload"]
    name = payload.get("workflow")
    if not isinstance(name, str) or not name:
        raise OperationError("rejected", "workflowRequired", "payload.workflow names the workflow")
    project = payload.get("projectPath")
    if project is not None and (not isinstance(project, str) or not Path(project).is_absolute()):
        raise OperationError("rejected", "projectPathInvalid", "projectPath must be absolute")
    return StartRequest(name, project, payload.get("input", {}), _origin_session(payload))


MAX_SESSION_ID_CHARS: Final = 256
"""The schema's bound on an opaque ID (`$defs/id`)."""


def _origin_session(payload: Mapping[str, Any]) -> str | None:
    """The origin session a start names, checked against its optional `mode`."""
    session = payload.get("originSessionId")
    if session is not None and not (
        isinstance(session, str)
        and 0 < len(session) <= MAX_SESSION_ID_CHARS
        and not any(ord(char) < 0x20 or ord(char) == 0x7F for char in session)
    ):
        raise OperationError("rejected", "sessionIdInvalid", "originSessionId must be an opaque ID")
    mode = payload.get("mode")
    expected = "headless" if session is None else "interactive"
    if mode is not None and mode != expected:
        raise OperationError(
            "rejected",
            "executionModeInvalid",
            "an interactive run names its originSessionId; a headless run names none",
        )
    return session


ORIGIN_SESSION_KINDS: Final = frozenset({"assistant"})
"""Snapshot node kinds that run only in an origin Pi session: a visible assistant-message
step (interactive request kind `assistant`) has no tool completion action, so headless
`pi --mode rpc` cannot perform it (workflow-server.md § Interactive Pi execution). The
authoring API's `assistant_message` is an agent node marked `visible: true`."""


def origin_session_steps(definition: Mapping[str, Any]) -> list[str]:
    """The node paths of a definition snapshot that need an origin Pi session: a kind in
    ORIGIN_SESSION_KINDS, or a node marked `visible` (an agent whose reply is shown)."""
    nodes = definition.get("nodes") or {}
    return sorted(
        str(path)
        for path, node in nodes.items()
        if isinstance(node, Mapping)
        and (node.get("kind") in ORIGIN_SESSION_KINDS or node.get("visible") is True)
    )


def _refuse_headless_visible_steps(definition: Mapping[str, Any]) -> None:
    """A run started here is headless (no origin session): refuse a definition that has a
    visible assistant-message step, before any run exists."""
    steps = origin_session_steps(definition)
    if steps:
        shown = ", ".join(steps[:5]) + (f" and {len(steps) - 5} more" if len(steps) > 5 else "")
        raise OperationError(
            "rejected",
            "headlessVisibleStep",
            f"a headless run cannot use a visible assistant-message step ({shown}): "
            "it needs an origin Pi session; start the workflow from a Pi session instead",
        )


def start_run(
    db: Database,
    request: RequestMessage,
    ctx: OperationContext,
    start: StartRequest,
    resolved: Mapping[str, Any],
) -> dict[str, Any]:
    """`run.start` after the resolver child answered: commit the queued run, or refuse.

    A definition that failed to load or an input that failed validation commits no
    run; its rejection is stored as the receipt so a retry gets the same answer.
    """
    name, project = start.workflow, start.project_path

    def change(tx: Tx, command: CommandRequest) -> tuple[str, int, dict[str, Any]]:
        interactive = start.origin_session_id is not None
        _check_resolved(tx, resolved, interactive=interactive)
        # The snapshot stays stored under the run's definition digest: the server checks
        # checkpoint answers against it without loading workflow code.
        run_id = f"run-{uuid.uuid4().hex}"
        if interactive:
            _require_free_session(tx, start.origin_session_id)
        result = enqueue_run(
            tx,
            NewRun(
                run_id=run_id,
                workflow_name=name,
                # A run started without a project runs in the agent directory: the
                # launch envelope always names an absolute project path.
                project_path=project or str(ctx.agent_dir),
                source_identity=resolved["sourceIdentity"],
                definition_digest=resolved["definitionDigest"],
                input_hash=resolved["inputHash"],
                input=resolved["input"],
                title=resolved.get("title"),
                execution_mode=ExecutionMode.INTERACTIVE if interactive else ExecutionMode.HEADLESS,
                origin_session_id=start.origin_session_id,
            ),
        )
        return run_id, result.revision, {"runId": run_id, "state": result.phase.value}

    return _run_command(db, request, change)


def _require_free_session(tx: Tx, session_id: str | None) -> None:
    """An interactive run reserves its origin session: one unfinished run per session."""
    if session_reservation(tx, session_id):
        raise OperationError(
            "rejected",
            "sessionReserved",
            "another run of this Pi session is not finished yet; wait for it or cancel it",
        )


@dataclass(frozen=True, slots=True)
class RestartLookup:
    """What `run.restart` found before resolving: a final answer, or what to resolve."""

    answer: dict[str, Any] | None
    """The stored answer of this request (adopted or conflict), or a refusal of a
    request without a run ID; None: not handled yet."""
    source: StartRequest | None
    """The finished run's workflow name, project and input, resolved again (the current
    source); None when there is nothing to resolve (no such run, or it is not finished:
    the commit refuses it in its own transaction)."""


def restart_lookup(db: Database, request: RequestMessage) -> RestartLookup:
    """`run.restart` before the resolver: the stored answer, or the source to resolve.

    Read-only, on the reader actor, like `prior_answer` for `run.start`: a retry is
    answered from its receipt and runs no workflow code.
    """
    if not request.get("runId"):
        refusal = rejected(request, "rejected", "runIdRequired", "this operation needs a runId")
        return RestartLookup(refusal, None)
    stored = prior_answer(db, request)
    if stored is not None:
        return RestartLookup(stored, None)
    old = get_run(db, request["runId"])
    if old is None or old.finished_at is None:
        return RestartLookup(None, None)
    source = StartRequest(old.workflow_name, old.project_path, json.loads(old.input))
    return RestartLookup(None, source)


def restart_run(
    db: Database,
    request: RequestMessage,
    ctx: OperationContext,
    resolved: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """`run.restart` after the resolver answered: a new run from the start, of the
    workflow's current source (its identity, definition and input hash are what the
    resolver reported now), with the finished run's input, where the run ran.

    The old run keeps its own source identity. A source that no longer loads, or whose
    input schema refuses the old input, commits no run; the refusal is the receipt.
    """
    try:
        return _run_command(db, request, _restart_change(request, resolved))
    except OperationError as exc:  # not stored: no such run, or it changed meanwhile
        return rejected(request, exc.outcome, exc.code, str(exc))


def _restart_change(
    request: RequestMessage, resolved: Mapping[str, Any] | None
) -> Callable[[Tx, CommandRequest], tuple[str, int, dict[str, Any]]]:
    old_id = _run_id(request)

    def change(tx: Tx, command: CommandRequest) -> tuple[str, int, dict[str, Any]]:
        old = get_run(tx, old_id)
        if old is None:
            raise OperationError("notFound", "runNotFound", f"no run {old_id}")
        if old.finished_at is None:
            raise OperationError(
                "rejected", "runNotTerminal", "only a finished run restarts; cancel it first"
            )
        if resolved is None:  # it finished after the lookup: nothing was resolved yet
            raise OperationError(
                "conflict", "runChanged", "the run finished while the restart was checked; retry"
            )
        # A restart runs where the run ran: an interactive run's in its origin session.
        session = interactive_origin_session(tx, old_id)
        _check_resolved(tx, resolved, interactive=session is not None)
        if session is not None:
            _require_free_session(tx, session)
        run_id = f"run-{uuid.uuid4().hex}"
        result = enqueue_run(
            tx,
            NewRun(
                run_id=run_id,
                workflow_name=old.workflow_name,
                project_path=old.project_path,
                source_identity=resolved["sourceIdentity"],
                definition_digest=resolved["definitionDigest"],
                input_hash=resolved["inputHash"],
                input=resolved["input"],
                title=resolved.get("title"),
                restart_of=old_id,
                execution_mode=(
                    ExecutionMode.HEADLESS if session is None else ExecutionMode.INTERACTIVE
                ),
                origin_session_id=None if session is None else str(session),
            ),
        )
        body = {"runId": run_id, "restartOf": old_id, "state": result.phase.value}
        return run_id, result.revision, body

    return change


def check_resolved_start(tx: Tx, resolved: Mapping[str, Any]) -> None:
    """A headless start's checks of the resolver's answer (as `run.start` makes them),
    for a resource manager's child run.

    Raises:
        OperationError: the workflow did not resolve, or cannot run headless.
    """
    _check_resolved(tx, resolved, interactive=False)


def _check_resolved(tx: Tx, resolved: Mapping[str, Any], *, interactive: bool) -> None:
    """Refuse what the resolver could not load, and store its definition snapshot.

    The snapshot stays stored under the run's definition digest: the server checks
    checkpoint answers against it without loading workflow code.
    """
    if not resolved.get("ok"):
        raise OperationError(
            "rejected",
            str(resolved.get("code") or "definitionInvalid"),
            str(resolved.get("message") or "the workflow could not be started"),
        )
    definition = resolved.get("definition")
    if definition is not None and put_json_blob(tx, definition) != resolved["definitionDigest"]:
        raise OperationError(
            "rejected", "definitionInvalid", "the definition snapshot does not match its digest"
        )
    if isinstance(definition, Mapping) and not interactive:
        _refuse_headless_visible_steps(definition)


def _answer(
    db: Database, request: RequestMessage, ctx: OperationContext, claim: Claim | None = None
) -> dict[str, Any]:
    run_id = _run_id(request)
    if "answer" not in request["payload"]:
        raise OperationError("rejected", "answerRequired", "payload.answer holds the answer")

    def change(tx: Tx, command: CommandRequest) -> tuple[str, int, dict[str, Any]]:
        if get_run(tx, run_id) is None:
            raise OperationError("notFound", "runNotFound", f"no run {run_id}")
        if pending_decision(tx, run_id) is None:
            raise OperationError("rejected", "notWaiting", "the run is not waiting at a checkpoint")
        try:
            answered = answer_checkpoint(
                tx,
                run_id,
                answer=request["payload"]["answer"],
                idempotency_key=request["idempotencyKey"],
            )
        except AnswerInvalidError as exc:  # nothing was written: no continuation run
            raise OperationError("rejected", exc.code, str(exc)) from None
        body = {"runId": run_id, "continuationRunId": answered.continuation_run_id}
        return answered.continuation_run_id, answered.revision, body

    return _run_command(db, request, change)


def recover_action(payload: Mapping[str, Any]) -> Literal["confirm", "retry"]:
    """The `action` of a recover command (`run.recover`, `channel.recover`)."""
    match payload.get("action"):
        case "confirm":
            return "confirm"
        case "retry":
            return "retry"
    raise OperationError(
        "rejected", "recoverActionInvalid", "payload.action is 'confirm' or 'retry'"
    )


@dataclass(frozen=True, slots=True)
class RecoverRequest:
    """One checked recover command, as the effect's recovery function receives it."""

    run_id: str
    action: Literal["confirm", "retry"]
    actor: str
    """The client ID the `effect_recovered` event names."""
    effect_id: str | None
    payload: Mapping[str, Any]
    expected_revision: int | None


@dataclass(frozen=True, slots=True)
class Recovered:
    """What a recovery function did, for the receipt."""

    revision: int
    fields: dict[str, Any]
    """The receipt's fields after `runId`, `operation` and `action` (the effect, ...)."""
    next_attempt_number: int | None


@dataclass(frozen=True, slots=True)
class RecoverTarget:
    """What differs between the recover commands: which effect is recovered."""

    confirm_only: str
    """The payload field only a `confirm` takes (`result`, `messageIds`)."""
    confirm_only_code: str
    confirm_only_words: str
    retry_warning: str
    recover: Callable[[Tx, RecoverRequest], Recovered]
    """Recover the effect in the command's transaction; raises `EffectRecoveryError`."""


def recover_effect(db: Database, request: RequestMessage, target: RecoverTarget) -> dict[str, Any]:
    """A recover command (`run.recover`, `channel.recover`): receipt lookup, recovery and
    receipt in one transaction; the event names the client.

    `confirm` records that the external work happened and settles the effect
    `applied`; `retry` opens it for one more numbered attempt (a duplicate is possible).
    """
    run_id = _run_id(request)
    payload = request["payload"]
    action = recover_action(payload)
    if action == "retry" and target.confirm_only in payload:
        raise OperationError("rejected", target.confirm_only_code, target.confirm_only_words)
    effect_id = payload.get("effectId")
    if effect_id is not None and not isinstance(effect_id, str):
        raise OperationError("rejected", "effectIdInvalid", "payload.effectId is a string")

    def change(tx: Tx, command: CommandRequest) -> tuple[str, int, dict[str, Any]]:
        if get_run(tx, run_id) is None:
            raise OperationError("notFound", "runNotFound", f"no run {run_id}")
        asked = RecoverRequest(
            run_id, action, command.client_id, effect_id, payload, request.get("expectedRevision")
        )
        try:
            recovered = target.recover(tx, asked)
        except EffectRecoveryError as exc:
            raise OperationError("rejected", exc.code, str(exc)) from None
        body: dict[str, Any] = {
            "runId": run_id,
            "operation": "recover",
            "action": action,
            **recovered.fields,
        }
        if recovered.next_attempt_number is not None:
            body["nextAttemptNumber"] = recovered.next_attempt_number
            body["warning"] = target.retry_warning
        return run_id, recovered.revision, body

    return _run_command(db, request, change)


def _recover_run_effect(tx: Tx, asked: RecoverRequest) -> Recovered:
    recovered = recover_ambiguous_effect(
        tx,
        asked.run_id,
        action=asked.action,
        actor=asked.actor,
        result=asked.payload.get("result"),
        effect_id=asked.effect_id,
        expected_revision=asked.expected_revision,
    )
    fields = {"state": recovered.transition.phase.value, "effect": recovered.effect.to_wire()}
    return Recovered(recovered.transition.revision, fields, recovered.next_attempt_number)


RUN_EFFECT = RecoverTarget(
    confirm_only="result",
    confirm_only_code="resultNotAllowed",
    confirm_only_words="a retry takes no result",
    retry_warning=(
        "the effect is applied once more; if its first attempt did take effect, "
        "the external system may now see it twice"
    ),
    recover=_recover_run_effect,
)
"""`run.recover`: a run's ambiguous effect; the run is queued again and continues."""


def _recover(
    db: Database, request: RequestMessage, ctx: OperationContext, claim: Claim | None = None
) -> dict[str, Any]:
    return recover_effect(db, request, RUN_EFFECT)


SNAPSHOT_READS = frozenset(
    {
        "server.status",
        "state.status",
        "run.get",
        "run.list",
        "run.logs",
        "view.page",
        "view.content",
    }
)
"""Reads the server answers from the reader actor's read-only connection (one read
transaction each), so they never queue behind writes; they read no actor's state."""

READS: dict[str, Operation] = {
    "server.status": _server_status,
    "state.status": _state_status,
    "state.verify": _state_verify,
    "run.list": _run_list,
    "run.get": _run_get,
    "run.logs": _run_logs,
    "view.page": _view_page,
    "view.content": _view_content,
}

COMMANDS: dict[str, Operation] = {
    "run.pause": _transition("pause", pause_run),
    "run.resume": _transition("resume", resume_run),
    "run.cancel": _transition("cancel", cancel_run),
    "run.answer": _answer,
    "run.recover": _recover,
}


def handle_operation(
    db: Database,
    request: RequestMessage,
    ctx: OperationContext,
    claim: Claim | None = None,
    views: RunViewCache | None = None,
) -> dict[str, Any]:
    """Run one read or command and return its response; never raises for bad input.

    `views`: the reader actor's built run views, which `run.get` is served from.
    """
    operation = READS.get(request["operation"]) or COMMANDS.get(request["operation"])
    if operation is None:
        return rejected(
            request, "rejected", "unknownOperation", f"unknown operation {request['operation']}"
        )
    try:
        if views is not None and operation is _run_get:
            return _run_get(db, request, ctx, claim, views)
        return operation(db, request, ctx, claim)
    except OperationError as exc:
        return rejected(request, exc.outcome, exc.code, str(exc))
    except RunNotFoundError as exc:
        return rejected(request, "notFound", "runNotFound", str(exc))
    except RevisionConflictError as exc:
        return rejected(request, "conflict", "revisionConflict", str(exc))
    except (ClaimLostError, ClaimHeldError) as exc:
        return rejected(request, "claimLost", "claimLost", str(exc))
    except InvalidTransitionError as exc:
        return rejected(request, "rejected", "invalidTransition", str(exc))
