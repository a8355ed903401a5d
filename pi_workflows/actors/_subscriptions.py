"""The subscription actor: live-view subscriptions, revisioned snapshots and patches.

Implements client-protocol.md § Subscriptions and reconnection: "the server waits
for socket drain before it publishes another snapshot to that connection. Polling
coalesces while the connection is blocked." An event is offered only to a drained
connection, so a stalled reader costs at most one buffered event per connection.

Fan-out (issue 11, item 12): subscriptions of the same view (its `ViewSpec`, which is
data: the kind and the run or session it shows) share one read and one encoding per
revision. A commit costs one read per view, not one per subscriber; an unchanged run
view costs one revision lookup, not a rebuild (the view reader returns None).

Patches (issue 13, item 4): a run view keeps its last few encoded revisions. A
subscriber that holds one of them (it was sent it, or it names it when it subscribes
again after a reconnect) gets a `runPatch` from it when the patch is smaller than the
snapshot; any other subscriber gets the snapshot. A patch's base is always what was
written to that connection: an event is offered only once the previous one was handed
to the listener and the connection drained, so the actor never replaces an unwritten
event, and the revision a subscriber holds is the one the client reads last.

Reads go to the reader actor (a WAL reader connection), never in front of commands,
claim renewal or runner messages on the database actor.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Final

import pykka

from pi_workflows.actors._base import ActorFailureHandler, Address, Done, Reply, ServerActor, answer
from pi_workflows.actors._database import Committed
from pi_workflows.actors._reader import Read
from pi_workflows.actors._ticker import Tick
from pi_workflows.domain import ActiveEpochs, ReadView, ViewGone, ViewSnapshot, ViewSpec
from pi_workflows.wire import Connection, offer_event_frames
from pi_workflows.wire.canonical import dumps
from pi_workflows.wire.framing import MAX_FRAME_BYTES
from pi_workflows.wire.protocol import CLIENT_SCHEMA
from pi_workflows.wire.view_patch import diff_views

__all__ = [
    "EVENT_KINDS",
    "MAX_SUBSCRIPTIONS_PER_CONNECTION",
    "RETAINED_REVISIONS",
    "ConnectionClosed",
    "ReserveSubscription",
    "SnapshotRead",
    "Subscribe",
    "SubscriptionActor",
    "Unsubscribe",
    "event_frame",
]

log = logging.getLogger(__name__)

MAX_SUBSCRIPTIONS_PER_CONNECTION: Final = 32
"""Subscriptions one connection may hold: with one pending event each, its bound."""
RETAINED_REVISIONS: Final = 8
"""Encoded revisions a patchable view keeps, so a subscriber holding one gets a patch."""
RETAINED_BYTES: Final = 4 * 1024 * 1024
"""At most this much retained per view (the newest revision is always kept)."""
RETAINED_VIEWS: Final = 16
"""Views without subscribers whose retained revisions are kept for a reconnect."""
ENVELOPE_BYTES: Final = 512
"""Room for the event envelope around a payload under the frame limit."""

EVENT_KINDS: Final = {"runList": "runList", "run": "runSnapshot", "sessionView": "sessionSnapshot"}
"""The snapshot event kind of each view kind."""
PATCH_KINDS: Final = {"run": "runPatch"}
"""View kinds that retain revisions and send patches, and their patch event kind."""


@dataclass(frozen=True, slots=True)
class Subscribe:
    """Install a subscription and send its first event when the connection drains."""

    connection: Connection
    """Where events go."""
    subscription_id: str
    """Unique per connection; echoed in every event."""
    spec: ViewSpec
    revision: int | None = None
    """The view revision the client still holds (after a reconnect), if any."""
    reply_to: Address | None = None
    """Told `Done(tag, Reply(True))` when installed, `Reply(False)` when the connection
    holds too many already."""
    tag: Any = None


@dataclass(frozen=True, slots=True)
class ReserveSubscription:
    """Hold one of the connection's subscription places for `subscription_id`, to be
    filled by its `Subscribe`: a coordinator's session view takes its place before the
    session's epoch moves, so a connection that may hold no more is refused with nothing
    changed (the active coordinator stays unfenced)."""

    connection_id: str
    subscription_id: str
    reply_to: Address
    """Told `Done(tag, Reply(True))` when the place is held, `Reply(False)` when the
    connection holds too many already."""
    tag: Any = None


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """Remove one subscription of any kind; later events for it are dropped."""

    connection_id: str
    subscription_id: str
    reply_to: Address | None = None
    """Told `Done(tag, Reply(True))` when a subscription was removed."""
    tag: Any = None


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """Remove every subscription of a closed connection."""

    connection_id: str


@dataclass(frozen=True, slots=True)
class SnapshotRead:
    """Tag: the read of one view (its answer: a `ViewSnapshot`, None when unchanged, a
    `ViewGone`, or an error)."""

    spec: ViewSpec


class _HandOver:
    """Set on the listener's loop once an offered batch of frames is queued there."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = False

    def mark(self) -> None:
        self.done = True  # one attribute store: atomic, read later by the actor's thread


@dataclass
class _Subscription:
    connection: Connection
    subscription_id: str
    revision: int = -1
    """The revision this client holds: the last one offered to it, or the one it named."""
    handover: _HandOver | None = None
    """The last offer's hand-over: until it is done, that frame may not be queued yet."""
    unsendable: int = -1
    """A revision too large to send to it: not tried again."""


@dataclass
class _View:
    """One view, read once per change for all its subscribers."""

    spec: ViewSpec
    members: dict[tuple[str, str], _Subscription] = field(default_factory=dict)
    revision: int = -1
    payload: bytes | None = None
    """The canonical JSON of the payload at `revision`, encoded once for everyone."""
    document: dict[str, Any] | None = None
    """The payload at `revision` (kept while patches from it may be made)."""
    previous: tuple[int, dict[str, Any]] | None = None
    """The payload before it: the base most patches start from, not decoded again."""
    retained: OrderedDict[int, bytes] = field(default_factory=OrderedDict)
    """Encoded payloads of the last few revisions, oldest first (patchable kinds)."""
    patches: dict[int, bytes | None] = field(default_factory=dict)
    """Patch payloads to `revision`, by base revision; None: the snapshot is smaller."""
    reading: bool = False
    stale: bool = False
    """A change came while a read was in flight: read again once it is answered."""


class SubscriptionActor(ServerActor):
    """Owns: every live subscription, grouped by view, and the revision each client holds.

    Receives: `Subscribe`, `ReserveSubscription`, `Unsubscribe`, `ConnectionClosed`,
        `Tick`, `Committed` (from the database actor after a group commit that wrote),
        `Done` (a `SnapshotRead`).
    Sends: `Read` to the reader actor (one per view, never one per subscriber); events
        to connections (non-blocking, one hand-over per delivery).
    Invariants: one read in flight per view; a subscriber is offered an event only when
        its previous one was handed over and its connection drained, so it holds at
        most one pending event and no offered event is ever replaced unwritten; a patch
        goes from the revision the client holds; each offered revision is newer than
        the one the client holds.
    On failure: reported to the server; subscriptions are connection state, and
        clients resubscribe after reconnecting.
    """

    name = "subscriptions"

    def __init__(
        self,
        reader: pykka.ActorRef[Any],
        on_actor_failure: ActorFailureHandler,
        *,
        epochs: ActiveEpochs | None = None,
    ) -> None:
        super().__init__(on_actor_failure)
        self._reader = reader
        self._epochs = epochs
        """The coordinator epochs, for a coordinator's session view (`ReadView`)."""
        self._views: dict[ViewSpec, _View] = {}
        self._where: dict[tuple[str, str], ViewSpec] = {}
        """Each subscription's view, by (connection ID, subscription ID)."""
        self._reserved: set[tuple[str, str]] = set()
        """Places held for a subscription still to come (`ReserveSubscription`)."""
        self._idle: OrderedDict[ViewSpec, OrderedDict[int, bytes]] = OrderedDict()
        """Retained revisions of views that lost their last subscriber, for a reconnect."""
        self.snapshots_skipped_undrained = 0
        """Offers held back because the connection had not drained (coalesced)."""
        self.pages_built = 0
        """Reads that built a view: at most one per view and revision."""
        self.reads = 0
        """Reads asked of the reader (each a revision check, and a build if it changed)."""
        self.snapshots_sent = 0
        self.patches_sent = 0

    def on_receive(self, message: Any) -> Any:
        match message:
            case Subscribe():
                self._subscribe(message)
            case ReserveSubscription(connection_id=cid, subscription_id=sid):
                key = (cid, sid)
                held = self._held(key) < MAX_SUBSCRIPTIONS_PER_CONNECTION
                if held:
                    self._reserved.add(key)
                answer(message.reply_to, message.tag, Reply(held))
            case Unsubscribe(connection_id=cid, subscription_id=sid):
                self._reserved.discard((cid, sid))
                answer(message.reply_to, message.tag, Reply(self._remove((cid, sid))))
            case ConnectionClosed(connection_id=cid):
                self._reserved = {key for key in self._reserved if key[0] != cid}
                for key in [key for key in self._where if key[0] == cid]:
                    self._remove(key)
            case Tick() | Committed():
                # A commit refreshes at once; the tick covers a connection that drained.
                for view in list(self._views.values()):
                    self._refresh(view)
            case Done(tag=SnapshotRead(spec=spec), reply=reply):
                self._deliver(spec, reply)
            case _:
                raise TypeError(f"subscription actor got {type(message).__name__}")
        return None

    def subscription_count(self) -> int:
        """How many subscriptions are installed, of every kind (for status and tests)."""
        return len(self._where)

    def pending_events(self) -> dict[str, int]:
        """Subscriptions per connection ID whose last offer is not yet handed over."""
        pending: dict[str, int] = {}
        for view in self._views.values():
            for (cid, _), member in view.members.items():
                if member.handover is not None and not member.handover.done:
                    pending[cid] = pending.get(cid, 0) + 1
        return pending

    # --- membership --------------------------------------------------------------------

    def _held(self, key: tuple[str, str]) -> int:
        """Places the connection of `key` holds for other subscriptions (installed or
        reserved)."""
        cid = key[0]
        installed = sum(1 for known in self._where if known[0] == cid and known != key)
        return installed + sum(1 for known in self._reserved if known[0] == cid and known != key)

    def _subscribe(self, message: Subscribe) -> None:
        cid = message.connection.connection_id
        key = (cid, message.subscription_id)
        if self._held(key) >= MAX_SUBSCRIPTIONS_PER_CONNECTION:
            answer(message.reply_to, message.tag, Reply(False))
            return
        self._reserved.discard(key)  # its reserved place, if any, is filled now
        self._remove(key)
        spec = message.spec
        view = self._views.get(spec)
        if view is None:
            view = self._views[spec] = _View(spec, retained=self._idle.pop(spec, OrderedDict()))
        member = _Subscription(message.connection, message.subscription_id)
        if message.revision is not None:
            member.revision = message.revision
        view.members[key] = member
        self._where[key] = spec
        answer(message.reply_to, message.tag, Reply(True))
        if view.payload is not None:
            self._offer(view)  # a view already read: the newcomer need not wait for a read
        self._refresh(view)

    def _remove(self, key: tuple[str, str]) -> bool:
        spec = self._where.pop(key, None)
        if spec is None:
            return False
        view = self._views[spec]
        del view.members[key]
        if not view.members:
            del self._views[spec]  # a read in flight for it is dropped on arrival
            if view.retained:
                self._idle[spec] = view.retained
                while len(self._idle) > RETAINED_VIEWS:
                    self._idle.popitem(last=False)
        return True

    # --- reads -------------------------------------------------------------------------

    def _refresh(self, view: _View) -> None:
        """Read the view once if any subscriber could take a newer event."""
        for key in [key for key, member in view.members.items() if member.connection.closed]:
            self._remove(key)
        if not view.members:
            return
        if view.reading:
            view.stale = True
            return
        if not any(_ready(member) for member in view.members.values()):
            self.snapshots_skipped_undrained += len(view.members)
            return
        view.reading = True
        self.reads += 1
        unit = ReadView(view.spec, view.revision, self._epochs)
        self._reader.tell(Read(unit, self.actor_ref, SnapshotRead(view.spec)))

    def _deliver(self, spec: ViewSpec, reply: Reply) -> None:
        view = self._views.get(spec)
        if view is None:
            return  # every subscriber left while the read was in flight
        view.reading = False
        try:
            if isinstance(reply.value, ViewGone):
                self._gone(view, reply.value)
                return
            self._store(view, reply)
            self._offer(view)
        finally:
            if view.stale and self._views.get(spec) is view:
                view.stale = False
                self._refresh(view)  # one read in flight; a commit during it is read next

    def _store(self, view: _View, reply: Reply) -> None:
        if reply.error is not None:
            log.warning(
                "snapshot read failed",
                extra={"action": "subscription.error", "reason": type(reply.error).__name__},
            )
            return
        if reply.value is None:
            return  # unchanged since the last read
        snapshot: ViewSnapshot = reply.value
        if view.spec.kind in PATCH_KINDS and view.document is not None:
            view.previous = (view.revision, view.document)
        view.revision, view.payload = snapshot.revision, dumps(snapshot.payload)
        view.patches = {}
        self.pages_built += 1
        if view.spec.kind in PATCH_KINDS:
            view.document = snapshot.payload
            _retain(view.retained, snapshot.revision, view.payload)

    def _gone(self, view: _View, gone: ViewGone) -> None:
        """Tell every subscriber once, then drop the view and everything it retained."""
        body = dumps({"code": gone.code, "message": gone.message})
        revision = max(view.revision, 0)
        offers = [
            (member.connection, member.subscription_id,
             event_frame("unavailable", member.subscription_id, revision, body))
            for member in view.members.values()
        ]  # fmt: skip
        for key in list(view.members):
            self._remove(key)
        self._idle.pop(view.spec, None)
        offer_event_frames(offers)  # the last event: it may replace an unwritten one

    # --- offers ------------------------------------------------------------------------

    def _offer(self, view: _View) -> None:
        if view.payload is None:
            return
        offers: list[tuple[Connection, str, bytes]] = []
        offered: list[_Subscription] = []
        for member in view.members.values():
            if view.revision in (member.revision, member.unsendable):
                continue
            if not _ready(member):
                self.snapshots_skipped_undrained += 1  # coalesced: the newest goes later
                continue
            frame = self._frame(view, member)
            if frame is None:
                member.unsendable = view.revision
                continue
            member.revision = view.revision
            offers.append((member.connection, member.subscription_id, frame))
            offered.append(member)
        if not offers:
            return
        handover = _HandOver()
        for member in offered:
            member.handover = handover
        offer_event_frames(offers, handover.mark)

    def _frame(self, view: _View, member: _Subscription) -> bytes | None:
        """A patch from what the client holds when one is retained and smaller, else the
        snapshot; None if even the snapshot does not fit in a frame."""
        payload = view.payload
        assert payload is not None
        patch_kind = PATCH_KINDS.get(view.spec.kind)
        if patch_kind is not None and member.revision in view.retained:
            patch = self._patch(view, member.revision)
            if patch is not None:
                self.patches_sent += 1
                return event_frame(patch_kind, member.subscription_id, view.revision, patch)
        if len(payload) > MAX_FRAME_BYTES - ENVELOPE_BYTES:
            log.warning(
                "a snapshot exceeds the frame limit; this revision is not sent",
                extra={"action": "subscription.error", "reason": "FrameTooLargeError"},
            )
            return None
        self.snapshots_sent += 1
        kind = EVENT_KINDS[view.spec.kind]
        return event_frame(kind, member.subscription_id, view.revision, payload)

    def _patch(self, view: _View, base: int) -> bytes | None:
        """The patch payload from `base` to the view's revision (made once per base)."""
        if base in view.patches:
            return view.patches[base]
        old, payload = view.retained[base], view.payload
        assert payload is not None
        if view.document is None:
            view.document = json.loads(payload)
        if view.previous is not None and view.previous[0] == base:
            base_document = view.previous[1]
        else:
            base_document = json.loads(old)
        operations = diff_views(base_document, view.document)
        encoded: bytes | None = dumps({"baseRevision": base, "operations": operations})
        if encoded is not None and (
            len(encoded) >= len(payload) or len(encoded) > MAX_FRAME_BYTES - ENVELOPE_BYTES
        ):
            encoded = None
        view.patches[base] = encoded
        return encoded


def _ready(member: _Subscription) -> bool:
    """Its last event was handed over and written: the next one may be offered."""
    if member.handover is not None and not member.handover.done:
        return False
    return member.connection.is_drained()


def _retain(retained: OrderedDict[int, bytes], revision: int, payload: bytes) -> None:
    retained[revision] = payload
    retained.move_to_end(revision)
    size = sum(len(kept) for kept in retained.values())
    while len(retained) > 1 and (len(retained) > RETAINED_REVISIONS or size > RETAINED_BYTES):
        _, dropped = retained.popitem(last=False)
        size -= len(dropped)


def event_frame(kind: str, subscription_id: str, revision: int, payload: bytes) -> bytes:
    """The framed `event` around an already canonical payload, without re-encoding it.

    Canonical JSON sorts keys, and `kind` < `payload` < `revision` < `schema` <
    `subscriptionId` < `type`, so the payload's bytes go between the first key and the
    rest; the result is byte-identical with `encode_frame` of the whole event.
    """
    head = dumps({"kind": kind})[:-1]
    tail = dumps(
        {
            "revision": revision,
            "schema": CLIENT_SCHEMA,
            "subscriptionId": subscription_id,
            "type": "event",
        }
    )[1:]
    return head + b',"payload":' + payload + b"," + tail + b"\n"
