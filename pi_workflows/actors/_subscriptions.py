"""The subscription actor: live-view subscriptions and revisioned snapshots.

Implements client-protocol.md § Subscriptions and reconnection: "the server waits
for socket drain before it publishes another snapshot to that connection. Polling
coalesces while the connection is blocked." A snapshot is offered only to a drained
connection, so a stalled reader costs at most one buffered snapshot.

Fan-out (issue 11, item 12): subscriptions of the same view (kind and builder) share
one read and one encoding per revision. A commit costs one read per view, not one per
subscriber, so many subscribers, stalled or not, never put work in front of commands
on the database actor; each subscriber then costs one frame offered to the listener.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pykka

from pi_workflows.actors._base import ActorFailureHandler, Reply, ServerActor, tell_if_alive
from pi_workflows.actors._database import Committed, Transact
from pi_workflows.actors._ticker import Tick
from pi_workflows.storage import Database
from pi_workflows.wire._listener import Connection, offer_event_frames
from pi_workflows.wire.canonical import dumps
from pi_workflows.wire.framing import MAX_FRAME_BYTES
from pi_workflows.wire.protocol import CLIENT_SCHEMA

__all__ = [
    "MAX_SUBSCRIPTIONS_PER_CONNECTION",
    "ConnectionClosed",
    "SnapshotBuilder",
    "SnapshotRead",
    "Subscribe",
    "SubscriptionActor",
    "Unsubscribe",
    "event_frame",
]

log = logging.getLogger(__name__)

SnapshotBuilder = Callable[[Database, int], "tuple[int, dict[str, Any]] | None"]
"""Reads the view when its revision differs from the given one: (revision, payload)."""

MAX_SUBSCRIPTIONS_PER_CONNECTION = 32
"""Subscriptions one connection may hold: with one pending event each, its bound."""

ViewKey = tuple[str, SnapshotBuilder]
"""(kind, builder): subscriptions with the same key see the same snapshots."""


@dataclass(frozen=True, slots=True)
class Subscribe:
    """Install a subscription and send its first snapshot when the connection drains."""

    connection: Connection
    """Where events go."""
    subscription_id: str
    """Unique per connection; echoed in every event."""
    kind: str
    """The event kind, e.g. `runList`."""
    build: SnapshotBuilder = field(repr=False)
    """Builds the snapshot on the database actor; the same builder for the same view."""
    reply: Callable[[Reply], None] | None = field(default=None, repr=False)
    """Receives True when installed, False when the connection holds too many already."""


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """Remove one subscription; later snapshots for it are dropped."""

    connection_id: str
    subscription_id: str
    reply: Callable[[Reply], None]
    """Receives True when a subscription was removed."""


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """Remove every subscription of a closed connection."""

    connection_id: str


@dataclass(frozen=True, slots=True)
class SnapshotRead:
    """The database actor read one view."""

    view: ViewKey
    reply: Reply
    """(revision, payload), None when unchanged, or an error."""


@dataclass
class _Subscription:
    connection: Connection
    subscription_id: str
    revision: int = -1
    """The revision last offered to this subscriber."""


@dataclass
class _View:
    """One view, read once per change for all its subscribers."""

    kind: str
    build: SnapshotBuilder
    members: dict[tuple[str, str], _Subscription] = field(default_factory=dict)
    revision: int = -1
    payload: bytes | None = None
    """The canonical JSON of the payload at `revision`, encoded once for everyone."""
    reading: bool = False
    stale: bool = False
    """A change came while a read was in flight: read again once it is answered."""


class SubscriptionActor(ServerActor):
    """Owns: every live subscription, grouped by view, and the last revision each was sent.

    Receives: `Subscribe`, `Unsubscribe`, `ConnectionClosed`, `Tick`, `Committed` (from
        the database actor after a group commit that wrote), `SnapshotRead`.
    Sends: `Transact` to the database actor (one per view, never one per subscriber);
        events to connections (non-blocking, one hand-over per delivery).
    Invariants: one read in flight per view; a subscriber is offered a snapshot only
        when its connection has drained the previous one (drain before next snapshot),
        so it holds at most one pending event; each offered revision is newer than the
        last one offered to it.
    On failure: reported to the server; subscriptions are connection state, and
        clients resubscribe after reconnecting.
    """

    name = "subscriptions"

    def __init__(
        self, database: pykka.ActorRef[Any], on_actor_failure: ActorFailureHandler
    ) -> None:
        super().__init__(on_actor_failure)
        self._database = database
        self._views: dict[ViewKey, _View] = {}
        self._where: dict[tuple[str, str], ViewKey] = {}
        """Each subscription's view, by (connection ID, subscription ID)."""
        self.snapshots_skipped_undrained = 0
        """Offers held back because the connection had not drained (coalesced)."""
        self.pages_built = 0
        """Reads that built a page: at most one per view and revision."""

    def on_receive(self, message: Any) -> Any:
        match message:
            case Subscribe():
                self._subscribe(message)
            case Unsubscribe(connection_id=cid, subscription_id=sid, reply=reply):
                reply(Reply(self._remove((cid, sid))))
            case ConnectionClosed(connection_id=cid):
                for key in [key for key in self._where if key[0] == cid]:
                    self._remove(key)
            case Tick() | Committed():
                # A commit refreshes at once; the tick covers a connection that drained.
                for view in list(self._views.values()):
                    self._refresh(view)
            case SnapshotRead(view=view_key, reply=reply):
                self._deliver(view_key, reply)
            case _:
                raise TypeError(f"subscription actor got {type(message).__name__}")
        return None

    def _subscribe(self, message: Subscribe) -> None:
        cid = message.connection.connection_id
        key = (cid, message.subscription_id)
        held = sum(1 for known in self._where if known[0] == cid and known != key)
        if held >= MAX_SUBSCRIPTIONS_PER_CONNECTION:
            if message.reply is not None:
                message.reply(Reply(False))
            return
        self._remove(key)
        view_key: ViewKey = (message.kind, message.build)
        view = self._views.setdefault(view_key, _View(message.kind, message.build))
        view.members[key] = _Subscription(message.connection, message.subscription_id)
        self._where[key] = view_key
        if message.reply is not None:
            message.reply(Reply(True))
        self._refresh(view)

    def _remove(self, key: tuple[str, str]) -> bool:
        view_key = self._where.pop(key, None)
        if view_key is None:
            return False
        view = self._views[view_key]
        del view.members[key]
        if not view.members:
            del self._views[view_key]  # a read in flight for it is dropped on arrival
        return True

    def _refresh(self, view: _View) -> None:
        """Read the view once if any subscriber could take a newer snapshot."""
        for key in [key for key, member in view.members.items() if member.connection.closed]:
            self._remove(key)
        if not view.members:
            return
        if view.reading:
            view.stale = True
            return
        if not any(member.connection.is_drained() for member in view.members.values()):
            self.snapshots_skipped_undrained += len(view.members)
            return
        since, build = view.revision, view.build
        view_key: ViewKey = (view.kind, view.build)
        me = self.actor_ref
        view.reading = True
        self._database.tell(
            Transact(
                lambda db: build(db, since),
                lambda reply: tell_if_alive(me, SnapshotRead(view_key, reply)),
                "subscription.read",
            )
        )

    def _deliver(self, view_key: ViewKey, reply: Reply) -> None:
        view = self._views.get(view_key)
        if view is None:
            return  # every subscriber left while the read was in flight
        view.reading = False
        try:
            self._store(view, reply)
            self._offer(view)
        finally:
            if view.stale and self._views.get(view_key) is view:
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
        revision, payload = reply.value
        view.revision, view.payload = revision, dumps(payload)
        self.pages_built += 1

    def _offer(self, view: _View) -> None:
        payload = view.payload
        if payload is None:
            return
        behind = [member for member in view.members.values() if member.revision != view.revision]
        if behind and len(payload) > MAX_FRAME_BYTES - 512:  # 512: the envelope around it
            log.warning(
                "a snapshot exceeds the frame limit; this revision is not sent",
                extra={"action": "subscription.error", "reason": "FrameTooLargeError"},
            )
            for member in behind:
                member.revision = view.revision
            return
        offers: list[tuple[Connection, str, bytes]] = []
        for member in behind:
            if not member.connection.is_drained():
                self.snapshots_skipped_undrained += 1  # coalesced: the newest goes later
                continue
            member.revision = view.revision
            frame = event_frame(view.kind, member.subscription_id, view.revision, payload)
            offers.append((member.connection, member.subscription_id, frame))
        offer_event_frames(offers)


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
