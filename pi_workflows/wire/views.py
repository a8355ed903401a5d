"""Typed views: the documents a client reads, as TypedDicts a type checker knows.

Implements client-protocol.md § Run and session views for Python users: the
`pi-workflows.run-view.v1` document (display, trace, lineage, queue, content
references), `pi-workflows.run-list-page.v1` and its items, `pi-workflows.run-page.v1`
and `pi-workflows.session-view.v1`. They describe what the server sends (the JSON
schemas in `wire/schemas/` are the wire truth); nothing here validates at run time, so a
view stays a plain `dict` that prints, serialises and compares as one.

    view: RunView = ...
    if view["display"]["status"] == "failed":
        print(view["display"].get("reasonText"))

Keys a view may leave out are `NotRequired`: read them with `.get()`. Views are open
(the server may add top-level fields); these types name the fields that are fixed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal, NotRequired, TypeAlias, TypedDict

from pi_workflows.wire.protocol import DisplayStatus

__all__ = [
    "SETTLED_PARK_REASONS",
    "TERMINAL_STATUSES",
    "Activity",
    "AmbiguousEffectItem",
    "ChannelDeliveryItem",
    "ContentRef",
    "Control",
    "Counted",
    "DecisionChoice",
    "Display",
    "DisplayStatus",
    "Graph",
    "Lineage",
    "PendingRequestItem",
    "QueueItem",
    "RunListDisplay",
    "RunListItem",
    "RunListPage",
    "RunPage",
    "RunResult",
    "RunState",
    "RunStatus",
    "RunView",
    "SessionMessages",
    "SessionView",
    "Step",
    "StepCount",
    "Trace",
    "TraceCursors",
    "TraceItem",
    "TraceOutcome",
    "Traceback",
    "Unavailable",
    "Value",
    "is_settled",
]

RunStatus: TypeAlias = Literal[
    "queued", "running", "waiting", "completed", "failed", "timed_out", "cancelled"
]
"""The durable run status; renderers use `display.status` (a `DisplayStatus`)."""

Control: TypeAlias = Literal[
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
]
"""A command `display.controls` allows now (its handler still checks again). A name,
never shown to a person: each renderer turns it into a command of its own."""

Step: TypeAlias = Control | Literal["show", "logs", "verify"]
"""One advised step of `display.next`: a control, or an inspection that changes nothing
(`show` the run's details, `logs` its log, `verify` the state database's check)."""

TraceOutcome: TypeAlias = Literal[
    "running", "waiting", "completed", "failed", "timed_out", "cancelled", "interrupted"
]


class ContentRef(TypedDict):
    """A digest-bound reference to content fetched with `view.content` (run-scoped).

    A client verifies the assembled bytes against `digest` (and the response's digest)
    and treats them as data of `mediaType`, never as something to execute.
    """

    digest: str
    """`sha256:<64 hex>` of the complete bytes."""
    mediaType: str
    byteCount: int
    marker: Literal["server"]
    """`server`: created by the server and stored in `run_view_content` (opaque content
    never becomes a reference)."""


class Value(TypedDict, total=False):
    """A JSON value in a view: exactly one of three forms.

    - inline: `{"value": ...}` (it fits the 16 KiB inline threshold and the byte budget);
    - referenced: `{"ref": ContentRef, "preview": str}` (too large to inline);
    - `{"unavailable": reason}` (the stored content is missing or damaged).
    """

    value: Any
    ref: ContentRef
    preview: str
    unavailable: str


class Traceback(TypedDict):
    """A failed node's traceback, kept as durable content; `text` when it was inlined."""

    ref: ContentRef
    text: NotRequired[str]
    unavailable: NotRequired[str]


class Activity(TypedDict):
    """What executes now, apart from status: the supervised runner or an exact Pi turn."""

    kind: Literal["runner", "piTurn"]
    state: NotRequired[str]
    since: NotRequired[int]
    """Epoch milliseconds."""


class PendingRequestItem(TypedDict):
    """The request a waiting run has open."""

    kind: Literal["agent", "assistant", "checkpoint", "decision"]
    node: str


class DecisionChoice(TypedDict):
    """One choice of a waiting decision: `{"choice": id}` answers with it."""

    id: str
    label: str
    input: NotRequired[str]
    """The name of the text the answer gives with this choice."""


class Display(TypedDict):
    """The one server-computed display object (§ Live run view); render it directly."""

    status: DisplayStatus
    activity: Activity | None
    controls: list[Control]
    currentNode: NotRequired[str]
    """The node of the unfinished attempt of a running run."""
    waitingOn: NotRequired[str]
    """The node a waiting or parked run waits at (a checkpoint: its completed node)."""
    request: NotRequired[PendingRequestItem]
    reason: NotRequired[str]
    """The stored reason code of a nonterminal run that needs action."""
    reasonCode: NotRequired[str]
    reasonText: NotRequired[str]
    """The reason in words; a short notice when the reason is above 16 KiB."""
    reasonContent: NotRequired[ContentRef]
    """The complete reason (`text/plain; charset=utf-8`) when it is above 16 KiB."""
    action: NotRequired[str]
    """What to do about the reason, in words that name no command."""
    next: NotRequired[list[Step]]
    """The reason's advised steps, in order (with `action`)."""
    parked: NotRequired[Literal[True]]
    """A `queued` run held at a durable boundary until an operator resumes it."""
    question: NotRequired[str]
    """What the waiting checkpoint or decision asks."""
    choices: NotRequired[list[DecisionChoice]]
    """A waiting decision's choices."""


class Lineage(TypedDict):
    """Parent, restart and continuation links of a run."""

    rootRunId: str
    parentRunId: NotRequired[str]
    restartOf: NotRequired[str]
    continuationOf: NotRequired[str]
    restartedBy: NotRequired[list[str]]
    continuedBy: NotRequired[list[str]]


class QueueItem(TypedDict):
    """Queue display metadata only: never input, launch options, affinity or claim."""

    state: Literal["queued", "starting", "running", "parked", "done", "failed", "cancelled"]
    kind: Literal["workflow", "resource"]
    priority: NotRequired[int]
    enqueuedAt: NotRequired[int]
    parkReason: NotRequired[str]


class TraceItem(TypedDict):
    """One node attempt (also a `trace` item of `view.page`)."""

    attemptId: str
    node: str
    kind: str
    visit: int
    attempt: int
    """The attempt's number within its node visit, from 1."""
    generation: int
    startedAt: int
    outcome: TraceOutcome
    finishedAt: NotRequired[int]
    next: NotRequired[str]
    output: NotRequired[Value]
    error: NotRequired[str]
    """The error, or its first 1 KiB when `errorContent` references it whole."""
    errorContent: NotRequired[ContentRef]
    errorTruncated: NotRequired[bool]
    traceback: NotRequired[Traceback]


class TraceCursors(TypedDict, total=False):
    """Cursors into `view.page` (list `trace`) for attempts the view leaves out."""

    older: str


class Trace(TypedDict):
    """The newest attempts (at most 256) and how many the run has in all."""

    count: int
    omitted: int
    items: list[TraceItem]
    cursors: NotRequired[TraceCursors]


class Unavailable(TypedDict):
    """Stored content that is missing or damaged: the reason, never the content."""

    unavailable: str


class Counted(TypedDict):
    """A bounded projection: the first items and how many there are in all."""

    count: int
    items: list[dict[str, Any]]


class StepCount(TypedDict):
    count: int
    """Graph steps behind `view.page` (list `graphSteps`)."""


class Graph(TypedDict):
    """Bounded projections of the definition snapshot, and a reference to all of it."""

    definition: ContentRef | Unavailable
    steps: StepCount
    startAt: NotRequired[str | None]
    nodes: NotRequired[Counted]
    edges: NotRequired[Counted]


class RunState(TypedDict):
    input: Value


class RunResult(TypedDict):
    output: Value


class AmbiguousEffectItem(TypedDict):
    """An external effect that may have been applied without a receipt."""

    effectId: str
    effectType: str
    nodePath: str | None
    visit: int | None
    attemptNumber: int | None


class ChannelDeliveryItem(TypedDict):
    """A Telegram delivery (or edit) of the run's decision that is not sent yet or
    failed: `retrying` goes again at `retryAt` by itself; `failed` waits for
    `channel recover RUN retry`."""

    channel: str
    decisionId: str
    operation: Literal["deliver", "settle"]
    state: Literal["retrying", "failed"]
    reason: NotRequired[str]
    retryAt: NotRequired[int]


class RunView(TypedDict):
    """`pi-workflows.run-view.v1`: one run, built by the server from one consistent read."""

    schema: Literal["pi-workflows.run-view.v1"]
    revision: int
    """The presentation revision: a subscription's events carry it."""
    runId: str
    workflow: str
    status: RunStatus
    display: Display
    lineage: Lineage
    trace: Trace
    title: NotRequired[str]
    paused: NotRequired[bool]
    generation: NotRequired[int]
    createdAt: NotRequired[int]
    updatedAt: NotRequired[int]
    finishedAt: NotRequired[int]
    executionMode: NotRequired[Literal["headless", "interactive"]]
    failureClass: NotRequired[str]
    failureReason: NotRequired[str]
    restartOf: NotRequired[str]
    queue: NotRequired[QueueItem]
    state: NotRequired[RunState]
    result: NotRequired[RunResult]
    ambiguousEffects: NotRequired[list[AmbiguousEffectItem]]
    channelDeliveries: NotRequired[list[ChannelDeliveryItem]]
    graph: NotRequired[Graph]
    steps: NotRequired[list[dict[str, Any]]]
    """Earlier clients' short attempt list; use `trace`."""


class RunListDisplay(TypedDict):
    """The display facts the run list carries (status facts only)."""

    status: DisplayStatus
    reason: NotRequired[str]
    failureClass: NotRequired[str]
    parked: NotRequired[Literal[True]]
    """As the run view's: a `queued` run held until an operator resumes it."""
    currentNode: NotRequired[str]
    """As the run view's: the node a running run executes."""
    waitingOn: NotRequired[str]
    """As the run view's: the node a waiting, paused or parked run stopped at."""


class RunListItem(TypedDict):
    """One run of the list: status and source facts only (never input or trace)."""

    runId: str
    workflow: str
    revision: int
    createdAt: int
    updatedAt: int
    display: RunListDisplay
    title: NotRequired[str]
    finishedAt: NotRequired[int]
    executionMode: NotRequired[Literal["headless", "interactive"]]
    continuationOf: NotRequired[str]
    """The run whose answered checkpoint this run continues."""
    continuedBy: NotRequired[str]
    """The run that continues this one: its result is that chain's, not its own."""


class RunListPage(TypedDict):
    """`pi-workflows.run-list-page.v1`: one revision-bound page, newest first."""

    schema: Literal["pi-workflows.run-list-page.v1"]
    revision: int
    items: list[RunListItem]
    cursor: NotRequired[str | None]
    """The requested cursor (None for the first page)."""
    nextCursor: NotRequired[str]
    """Present when another page follows."""


class RunPage(TypedDict):
    """`pi-workflows.run-page.v1`: a byte-bounded window of one run history.

    Apply it only when `cursor` and `revision` both match the request and the held
    view. Items of the `trace` list are `TraceItem`s.
    """

    schema: Literal["pi-workflows.run-page.v1"]
    runId: str
    list: Literal["trace", "transitions", "graphSteps"]
    revision: int
    cursor: str | None
    items: list[Any]
    count: int
    first: NotRequired[int]
    """Position of the first item in the history (0: the oldest)."""
    nextCursor: NotRequired[str]
    """The older window."""
    previousCursor: NotRequired[str]
    """The newer window."""


class SessionMessages(TypedDict):
    count: int
    """The complete count of the recovery window."""
    items: list[dict[str, Any]]
    """Message records in session order, at most 256 and 256 KiB."""
    complete: bool
    """Every counted record is in `items`."""


class SessionView(TypedDict):
    """`pi-workflows.session-view.v1`: an origin session's active (or retained terminal)
    run, its message window, and the next message for its active coordinator."""

    schema: Literal["pi-workflows.session-view.v1"]
    sessionId: str
    revision: int
    activeRun: RunView | None
    coordinator: bool
    """This subscription holds the session's active coordinator epoch."""
    messages: SessionMessages
    nextMessage: dict[str, Any] | None
    """The next eligible pending message with its content (coordinator only)."""


TERMINAL_STATUSES: Final = ("completed", "failed", "timed_out", "cancelled")
SETTLED_PARK_REASONS: Final = (
    "runnerNoProgress",
    "workflowSourceChanged",
    "effectAmbiguous",
    "workerCrashed",
    "contentUnavailable",
    "serverCrashLoop",
)
"""Park reasons only an operator clears: a run parked for one waits for someone."""


def is_settled(display: Mapping[str, Any]) -> bool:
    """True once a run needs nothing more from the server: terminal, or it needs
    someone (waiting, paused, ambiguous, or parked for a reason only an operator
    clears). `display` is a run view's or a run list item's `display`."""
    if display["status"] in (*TERMINAL_STATUSES, "waiting", "paused", "ambiguous"):
        return True
    return bool(display.get("parked")) or display.get("reason") in SETTLED_PARK_REASONS
