"""The live run view: `pi-workflows.run-view.v1`, built from one consistent read.

Implements workflow-server.md § Live run view and client-protocol.md § Run and session
views: the `display` object (the six status rules in order, activity apart from status,
the controls allowed now, the reason in words), the current node, the trace of every
attempt, lineage, execution mode and queue display metadata. The caller opens one read
transaction (`Database.read()`), so every fact comes from the same snapshot.

A view stays far below the 1 MiB frame for any run: a value above `INLINE_BYTES` is a
digest-bound content reference with a short preview (domain/_view_content.py; the
bytes were stored in `run_view_content` with the value), a reason above it is a short
notice plus `display.reasonContent`, the trace holds only its newest byte-bounded
window with `trace.count`, `trace.omitted` and `trace.cursors` into `view.page`
(domain/_view_pages.py), and the graph is a bounded node and edge projection plus a
reference to the complete definition snapshot.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pi_workflows.domain._display_status import StatusFacts, display_status
from pi_workflows.domain._session_pages import session_record_view
from pi_workflows.domain._view_content import (
    json_blob_value,
    json_text_value,
    long_text,
    stored_ref,
)
from pi_workflows.domain._view_pages import PAGE_ITEMS, newest_steps, newest_trace
from pi_workflows.storage import (
    CHECKPOINT_AUDIENCE,
    VIEW_INLINE_BYTES,
    VIEW_JSON_MEDIA_TYPE,
    ChannelTrouble,
    ContentUnavailableError,
    Database,
    NodeAttemptRow,
    OpenTurn,
    PendingRequest,
    QueueRow,
    Reader,
    RunnerEpochRow,
    RunRow,
    active_runner,
    channel_trouble,
    count_attempts,
    decision_audience,
    get_queue_row,
    get_run,
    get_run_summary,
    latest_open_turn,
    lineage_links,
    list_ambiguous_effects,
    pending_decision,
    pending_requests,
    read_json_blob,
    run_parent_resource,
    run_result_payload,
    run_view_revision,
    unfinished_attempt,
)
from pi_workflows.wire.canonical import dumps
from pi_workflows.wire.protocol import RUN_VIEW_SCHEMA

__all__ = [
    "ADVICE",
    "CONTROLS",
    "INLINE_BYTES",
    "INSPECTIONS",
    "MODEL_CONTROLS",
    "TRACE_ITEMS",
    "Advice",
    "build_run_view",
    "reason_words",
]

INLINE_BYTES: Final = VIEW_INLINE_BYTES
"""The shared inline-content threshold: a larger value is a content reference."""
TRACE_ITEMS: Final = PAGE_ITEMS
"""The most attempts one view lists (the design's page size); older ones are paged."""
STEPS_SHOWN: Final = 50
"""The newest attempts of the earlier receipt's `steps` list, kept for its clients."""
GRAPH_ITEMS: Final = 256
"""The most nodes and edges the graph projection lists; the definition has them all."""
GRAPH_EDGE_BYTES: Final = 64 * 1024
"""The most encoded edge bytes the graph projection holds (switch edges can be long)."""

TERMINAL: Final = frozenset({"completed", "failed", "timed_out", "cancelled"})
CHANNEL_EFFECT: Final = "channel."
"""The effect types of an external channel's delivery and edit (`channel.recover`)."""

CONTROLS: Final = (
    "pause",
    "resume",
    "cancel",
    "restart",
    "answer",
    "human-answer",
    "submit",
    "update",
    "recoverConfirm",
    "recoverRetry",
    "channelRecoverConfirm",
    "channelRecoverRetry",
    "review",
)
"""Every name `display.controls` can hold: the commands allowed now. Renderers turn each
into their own command (or leave it out); none of these names is shown to a person."""
INSPECTIONS: Final = ("show", "logs", "verify")
"""Advice that reads and changes nothing: the run's details (its attempts' errors and
tracebacks, its effects), its log, the state database's check. Always allowed."""
MODEL_CONTROLS: Final = frozenset({"submit", "update"})
"""The model's tool actions on an agent step: allowed, but never advice to a person."""
QUESTION_CHARS: Final = 2000
"""The most characters of a checkpoint's or decision's question the display holds."""


@dataclass(frozen=True, slots=True)
class Advice:
    """One reason in words: what happened, what to do, and the advised steps in order.

    `action` names no command and no option: each renderer turns every name of `next`
    (a control of `CONTROLS` or an inspection of `INSPECTIONS`) into a command of its own
    (the CLI's `pi-workflows ...`, Pi's `/workflow ...`), or leaves out one it cannot do.
    """

    words: str
    action: str
    next: tuple[str, ...]


ADVICE: Final[Mapping[str, Advice]] = {
    # Nonterminal: a run that waits for someone.
    "paused": Advice(
        "Paused by an operator.",
        "Resume it, or cancel it.",
        ("resume", "cancel"),
    ),
    "checkpoint": Advice(
        "Waiting for an answer at a checkpoint.",
        "Answer the checkpoint, or cancel the run.",
        ("answer", "cancel"),
    ),
    "humanDecision": Advice(
        "Waiting for a person's decision.",
        "A person answers the decision (the model cannot), or cancel the run.",
        ("human-answer", "cancel"),
    ),
    "interaction": Advice(
        "Waiting for the model to do an agent step in the run's Pi session.",
        "Open the run's Pi session: the step is presented there. Or cancel the run.",
        ("cancel",),
    ),
    "runnerNoProgress": Advice(
        "The runner exited before the run made any progress.",
        "Read the run's log, fix the cause, then resume or cancel the run.",
        ("logs", "resume", "cancel"),
    ),
    "workflowSourceChanged": Advice(
        "The workflow source changed since the run started.",
        "Restore the source the run started with and resume it, or cancel it and "
        "restart it: a restart runs the current source.",
        ("resume", "cancel"),
    ),
    "effectAmbiguous": Advice(
        "An external effect may have been applied without a receipt.",
        "Check the external system, then confirm that the effect happened or retry it "
        "(a duplicate is possible), or cancel the run.",
        (
            "recoverConfirm",
            "recoverRetry",
            "channelRecoverConfirm",
            "channelRecoverRetry",
            "cancel",
        ),
    ),
    "serverCrashLoop": Advice(
        "The server died again and again while this run was in flight; "
        "the run may be what kills it.",
        "Inspect the run and its workflow, then resume or cancel it.",
        ("show", "resume", "cancel"),
    ),
    "workerCrashed": Advice(
        "The runner process crashed again and again.",
        "Read the run's log; resume to try again, or cancel the run.",
        ("logs", "resume", "cancel"),
    ),
    "contentUnavailable": Advice(
        "Content the run needs is missing or damaged.",
        "Check the state database, then resume or cancel the run.",
        ("verify", "resume", "cancel"),
    ),
    # Terminal: what failed, and how to run it again.
    "nodeFailed": Advice(
        "A node failed.",
        "Read the failed attempt's error and traceback, fix the workflow, then restart "
        "the run: a restart runs the current source.",
        ("show", "restart"),
    ),
    "resourceLimit": Advice(
        "A node went over its memory or process limit.",
        "Raise the node's limits or make it do less, then restart the run.",
        ("show", "restart"),
    ),
    "piUnavailable": Advice(
        "The pi binary could not be started.",
        "Install pi or set PI_WORKFLOWS_PI for the server, then restart the run.",
        ("restart",),
    ),
    "agentUnproductive": Advice(
        "The agent step's model ended its turns without submitting an output.",
        "Check the step's prompt and model, then restart the run.",
        ("show", "restart"),
    ),
    "nodeTimedOut": Advice(
        "A node ran past its timeout.",
        "Raise the node's timeout or make it faster, then restart the run.",
        ("show", "restart"),
    ),
}
"""Every reason code a run view can show, in words and advice (tests/pi/test_advice.py
drives a real server into each one and runs every command its renderers advise)."""


def reason_words(code: str) -> tuple[str, str | None]:
    """A stored reason code in words, and what to do about it (None: unknown code)."""
    advice = ADVICE.get(code)
    if advice is None:
        return f"Stopped ({code}).", None
    return advice.words, advice.action


@dataclass(frozen=True, slots=True)
class _Facts:
    """Everything one view reads, from one snapshot."""

    run: RunRow
    queue: QueueRow | None
    execution_mode: str | None
    current: NodeAttemptRow | None
    """The unfinished attempt: the one durable source of the current node."""
    pending: list[PendingRequest]
    checkpoint_node: str | None
    ambiguous: list[dict[str, Any]]
    protected: bool
    deliveries: list[dict[str, Any]]
    """Telegram deliveries or edits of this run not sent yet (retrying) or failed."""
    """The pending decision is a protected human decision (`human_decision`)."""
    runner: RunnerEpochRow | None
    turn: OpenTurn | None = None
    """The run's open origin-session model turn, if any."""
    asked: Any = None
    """What the pending checkpoint or decision asks: its stored request (a checkpoint's
    `{"summary"}`, a decision's presentation with its choices); None when none waits."""


def build_run_view(db: Database, run_id: str) -> dict[str, Any] | None:
    """The run's `pi-workflows.run-view.v1` document, or None if there is no such run."""
    with db.read():
        facts = _read_facts(db, run_id)
        if facts is None:
            return None
        return _view(db, facts)


def _read_facts(db: Database, run_id: str) -> _Facts | None:
    run = get_run(db, run_id)
    if run is None:
        return None
    summary = get_run_summary(db, run_id)
    decision = pending_decision(db, run_id)
    asked = None
    if decision is not None and decision.request_hash is not None:
        with contextlib.suppress(ContentUnavailableError):
            asked = read_json_blob(db, decision.request_hash)
    return _Facts(
        run=run,
        queue=get_queue_row(db, run_id),
        execution_mode=summary.execution_mode if summary is not None else None,
        current=unfinished_attempt(db, run_id),
        pending=pending_requests(db, run_id),
        checkpoint_node=decision.node_path if decision is not None else None,
        ambiguous=[effect.to_wire() for effect in list_ambiguous_effects(db, run_id)],
        deliveries=[_delivery(item) for item in channel_trouble(db, run_id)],
        protected=decision is not None
        and decision_audience(db, run_id) not in (None, CHECKPOINT_AUDIENCE),
        runner=active_runner(db, run_id),
        turn=latest_open_turn(db, run_id),
        asked=asked,
    )


def _view(db: Database, facts: _Facts) -> dict[str, Any]:
    run = facts.run
    view: dict[str, Any] = {
        "schema": RUN_VIEW_SCHEMA,
        "revision": run_view_revision(db, run.run_id),
        "runId": run.run_id,
        "workflow": run.workflow_name,
        "status": run.status,
        "paused": bool(run.paused),
        "generation": run.generation,
        "createdAt": run.created_at,
        "updatedAt": run.updated_at,
        "display": _display(db, facts),
        "lineage": _lineage(db, run),
        "state": {"input": json_text_value(db, run.run_id, run.input)},
        "graph": _graph(db, run),
        "trace": _trace(db, run.run_id),
        # Kept for clients of the earlier `run.get` receipt: the newest attempts.
        "steps": [
            {"node": s["node"], "kind": s["kind"], "visit": s["visit"], "status": s["outcome"]}
            for s in newest_steps(db, run.run_id, STEPS_SHOWN)
        ],
    }
    parent = run_parent_resource(db, run.run_id)
    if parent is not None:  # a resource manager's child run (`ctx.workflows.ensure`)
        view["parentResource"] = {
            "manager": parent.manager,
            "key": parent.resource_key,
            "requestKey": parent.request_key,
        }
    if facts.queue is not None:
        view["queue"] = _queue(facts.queue)
    if facts.execution_mode is not None:
        # How its agent steps run: `headless` (pi --mode rpc) or `interactive` (the
        # origin session). Viewers show it; it names no session, model or credential.
        view["executionMode"] = facts.execution_mode
    for key, value in (
        ("title", run.title),
        ("finishedAt", run.finished_at),
        ("failureClass", run.failure_class),
        ("restartOf", run.restart_of),
    ):
        if value is not None:
            view[key] = value
    if run.failure_reason is not None:
        view["failureReason"] = run.failure_reason[:INLINE_BYTES]
    result = _result(db, run)
    if result is not None:
        view["result"] = result
    if facts.ambiguous:
        view["ambiguousEffects"] = facts.ambiguous
    if facts.deliveries:
        view["channelDeliveries"] = facts.deliveries
    record = session_record_view(db, run.run_id)
    if record is not None:  # capture status and integrity of each recorded turn
        view["sessionRecord"] = record
    return view


def _delivery(item: ChannelTrouble) -> dict[str, Any]:
    found: dict[str, Any] = {
        "channel": item.channel,
        "decisionId": item.decision_id,
        "operation": item.operation,
        "state": item.state,
    }
    if item.retry_reason is not None:
        found["reason"] = item.retry_reason
    if item.state == "retrying" and item.retry_at is not None:
        found["retryAt"] = item.retry_at
    return found


# --- display -----------------------------------------------------------------------


def _display(db: Reader, facts: _Facts) -> dict[str, Any]:
    """The six rules of § Live run view, in order."""
    run = facts.run
    status = _status(facts)
    controls = _controls(facts, status)
    display: dict[str, Any] = {
        "status": status,
        "activity": _activity(facts.runner, facts.turn),
        "controls": controls,
    }
    if _parked(facts, status):
        # Rule 6's parked work: held at a durable boundary until an operator acts, not
        # admitted work about to start. Still `queued` (the closed set); this says which.
        display["parked"] = True
    current = facts.current
    if current is not None:
        # The unfinished attempt is the one durable source of the current node.
        key = "currentNode" if status == "running" else "waitingOn"
        display[key] = current.node_path
    elif facts.checkpoint_node is not None:
        display["waitingOn"] = facts.checkpoint_node  # the completed checkpoint node
    if facts.pending:
        display["request"] = {"kind": facts.pending[0].kind, "node": facts.pending[0].node_path}
    if status in ("waiting", "paused"):
        display.update(_question(facts.asked))
    code = _reason_code(facts, status)
    if code is not None:
        words, action = reason_words(code)
        if status in TERMINAL and run.failure_reason:
            # The stored reason, not only its code; a long one by reference.
            words, ref = long_text(db, run.run_id, run.failure_reason)
            if ref is not None:
                size = ref["byteCount"]
                words = f"The reason is {size} bytes, too long to show here; it begins: {words}"
                display["reasonContent"] = ref
        if status not in TERMINAL:
            display["reason"] = code  # the code stays for scripts (`run wait`)
        display["reasonCode"] = code
        display["reasonText"] = words
        if action is not None:
            display["action"] = action
            display["next"] = _advised(code, controls)
    return display


def _advised(code: str, controls: list[str]) -> list[str]:
    """The reason's advised steps that can be taken now, in order: an inspection, or a
    control the handlers allow now (a recovery waits until its run is parked)."""
    return [step for step in ADVICE[code].next if step in INSPECTIONS or step in controls]


def _parked(facts: _Facts, status: str) -> bool:
    return status == "queued" and facts.queue is not None and facts.queue.state == "parked"


def _question(asked: Any) -> dict[str, Any]:
    """What the waiting checkpoint or decision asks (`question`, bounded), and a
    decision's `choices` (their IDs, labels and text inputs), for the renderers to show
    with the command that answers it."""
    if not isinstance(asked, Mapping):
        return {}
    shown: dict[str, Any] = {}
    summary = asked.get("summary")
    if isinstance(summary, str) and summary.strip():
        text = summary.strip()
        shown["question"] = (
            text if len(text) <= QUESTION_CHARS else text[: QUESTION_CHARS - 1] + "…"
        )
    choices = asked.get("choices")
    if isinstance(choices, list) and choices:
        shown["choices"] = [_choice(choice) for choice in choices if isinstance(choice, Mapping)]
    return shown


def _choice(choice: Mapping[str, Any]) -> dict[str, Any]:
    item: dict[str, Any] = {"id": str(choice.get("id", "")), "label": str(choice.get("label", ""))}
    asked = choice.get("input")
    if isinstance(asked, Mapping) and isinstance(asked.get("name"), str):
        item["input"] = asked["name"]
    return item


def _status(facts: _Facts) -> str:
    # The one rule the run list uses too (domain/_display_status.py).
    return display_status(
        StatusFacts(
            run_status=facts.run.status,
            paused=bool(facts.run.paused),
            queue_state=facts.queue.state if facts.queue is not None else None,
            ambiguous_effect=bool(facts.ambiguous),
            runner_active=facts.runner is not None,
            turn_open=facts.turn is not None,
        )
    )


def _reason_code(facts: _Facts, status: str) -> str | None:
    """The reason a run needs someone, or why it ended; none while it runs (a waiting
    step whose model turn is open is `running`, with no stopped reason beside it)."""
    run = facts.run
    if status in TERMINAL:
        if status in ("completed", "cancelled"):
            return None
        code = run.failure_class or ("nodeTimedOut" if status == "timed_out" else None)
        return _node_code(run.failure_reason) or code
    if facts.ambiguous:
        return "effectAmbiguous"
    park = facts.queue.park_reason if facts.queue is not None else None
    if status == "paused":
        return "paused"
    if status == "waiting":
        if facts.protected and park in (None, "checkpoint"):
            return "humanDecision"
        return park or "checkpoint"
    if _parked(facts, status):
        return park
    return None


def _node_code(reason: str | None) -> str | None:
    """The failed node's own code named in a stored run reason, if the table knows it:
    `nodeFailed: ask: piUnavailable: …` names `piUnavailable` (its words and action are
    more useful than those of the class)."""
    if not reason:
        return None
    parts = reason.split(": ", 3)
    return parts[2] if len(parts) >= 3 and parts[2] in ADVICE else None


def _activity(runner: RunnerEpochRow | None, turn: OpenTurn | None) -> dict[str, Any] | None:
    """The supervised runner or the exact origin-session model turn, apart from status."""
    if turn is not None:
        return {
            "kind": "piTurn",
            "state": "open",
            "since": turn.started_at,
            "turnId": turn.turn_id,
            "messageId": turn.message_id,
        }
    if runner is None:
        return None
    return {"kind": "runner", "state": runner.status, "since": runner.started_at}


def _controls(facts: _Facts, status: str) -> list[str]:
    """The commands allowed now; every handler checks its own conditions again."""
    if status in TERMINAL:
        # An unresolved effect of a finished run can only be reviewed (`ambiguousEffects`).
        return ["restart", "review"] if facts.ambiguous else ["restart"]
    if status == "ambiguous":
        if facts.queue is None or facts.queue.state != "parked":
            return ["cancel"]  # its runner is still parking it: recovery waits for that
        if all(str(e["effectType"]).startswith(CHANNEL_EFFECT) for e in facts.ambiguous):
            # A Telegram delivery or edit of a waiting decision: `channel.recover`.
            return ["channelRecoverConfirm", "channelRecoverRetry", "cancel"]
        return ["recoverConfirm", "recoverRetry", "cancel"]
    if status == "paused":
        return ["resume", "cancel"]
    controls: list[str] = []
    if status == "waiting":
        controls += _request_actions(facts)
    if _parked(facts, status):
        controls.append("resume")
    return [*controls, "pause", "cancel"]


def _request_actions(facts: _Facts) -> list[str]:
    """The response action a pending request's kind allows."""
    kinds = {request.kind for request in facts.pending}
    if facts.checkpoint_node is not None and facts.protected:
        return ["human-answer"]  # a person's answer (decision.answer), never the model's
    if facts.checkpoint_node is not None or "checkpoint" in kinds:
        return ["answer"]
    if "decision" in kinds:
        return ["human-answer"]
    if "agent" in kinds:
        return ["submit", "update"]
    return []  # a visible-response request completes through no tool


def _queue(queue: QueueRow) -> dict[str, Any]:
    """Queue display metadata only: no input, launch options, affinity or claim."""
    item: dict[str, Any] = {
        "state": queue.state,
        "kind": queue.kind,
        "priority": queue.priority,
        "enqueuedAt": queue.enqueued_at,
    }
    if queue.park_reason is not None:
        item["parkReason"] = queue.park_reason
    return item


def _lineage(db: Database, run: RunRow) -> dict[str, Any]:
    links = lineage_links(db, run.run_id)
    lineage: dict[str, Any] = {"rootRunId": run.root_run_id}
    for key, value in (
        ("parentRunId", run.parent_run_id),
        ("restartOf", run.restart_of),
        ("continuationOf", run.continuation_of),
    ):
        if value is not None:
            lineage[key] = value
    if links.restarted_by:
        lineage["restartedBy"] = links.restarted_by
    if links.continued_by:
        lineage["continuedBy"] = links.continued_by
    return lineage


# --- values, trace and graph --------------------------------------------------------


def _result(db: Database, run: RunRow) -> dict[str, Any] | None:
    """The completed run's output (inline, or a content reference for a large one)."""
    if run.status != "completed":
        return None
    payload = run_result_payload(db, run.run_id)
    if payload is None:
        return None
    if "continuedBy" in payload and "output" not in payload:
        # Settled by its checkpoint's continuation: the chain's result is its leaf's,
        # not a null output of this run (`lineage.continuedBy` names the next run).
        return None
    if "outputRef" in payload:
        digest = str(payload["outputRef"]["digest"])
        return {"output": json_blob_value(db, run.run_id, digest)}
    # The same canonical bytes the runner handler stored when the output is large.
    return {"output": json_text_value(db, run.run_id, dumps(payload.get("output")).decode())}


def _trace(db: Database, run_id: str) -> dict[str, Any]:
    """The newest byte-bounded window of attempts, in start order, and the cursor to
    the older ones (`view.page`)."""
    window = newest_trace(db, run_id)
    trace: dict[str, Any] = {
        "count": window.count,
        "omitted": window.count - len(window.items),
        "items": window.items,
    }
    cursors = window.cursors("trace")
    cursors.pop("newer", None)  # the view's window is the newest
    trace["cursors"] = cursors
    return trace


def _graph(db: Database, run: RunRow) -> dict[str, Any]:
    """Bounded node and edge projections of the definition snapshot, the count of
    `view.page`'s graphSteps, and a reference to the
    complete snapshot (stored as view content when the run was created)."""
    # `transitions` are counted by their own page, not here: that count reads rows.
    graph: dict[str, Any] = {"steps": {"count": count_attempts(db, run.run_id)}}
    ref = stored_ref(db, run.run_id, run.definition_digest, VIEW_JSON_MEDIA_TYPE)
    graph["definition"] = ref if ref is not None else {"unavailable": "notStored"}
    try:
        snapshot = read_json_blob(db, run.definition_digest)
    except ContentUnavailableError:
        return graph
    if not isinstance(snapshot, dict):
        return graph
    nodes = snapshot.get("nodes") if isinstance(snapshot.get("nodes"), dict) else {}
    assert isinstance(nodes, dict)
    graph["startAt"] = snapshot.get("startAt")
    graph["nodes"] = {
        "count": len(nodes),
        "items": [
            {"id": path, "kind": _node_kind(node)}
            for path, node in list(sorted(nodes.items()))[:GRAPH_ITEMS]
        ],
    }
    edges = snapshot.get("edges") if isinstance(snapshot.get("edges"), list) else []
    assert isinstance(edges, list)
    shown: list[Any] = []
    spent = 0
    for edge in edges[:GRAPH_ITEMS]:
        spent += len(json.dumps(edge))
        if spent > GRAPH_EDGE_BYTES:
            break
        shown.append(edge)
    graph["edges"] = {"count": len(edges), "items": shown}
    return graph


def _node_kind(node: Any) -> str:
    """A snapshot node's kind as people name it: a protected checkpoint is the
    `human_decision` it was written as (its attempts run as a checkpoint)."""
    if not isinstance(node, dict):
        return ""
    if node.get("protected") is True:
        return "human_decision"
    return str(node.get("kind", ""))
