"""The subscription actor: live-view subscriptions and revisioned snapshots.

Implements client-protocol.md § Subscriptions and reconnection: "the server waits
for socket drain before it publishes another snapshot to that connection. Polling
coalesces while the connection is blocked." A snapshot is built only for a drained
connection, so a stalled reader costs at most one buffered snapshot.
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
from pi_workflows.wire._listener import Connection
from pi_workflows.wire.protocol import CLIENT_SCHEMA

__all__ = [
    "ConnectionClosed",
    "SnapshotBuilder",
    "SnapshotRead",
    "Subscribe",
    "SubscriptionActor",
    "Unsubscribe",
]

log = logging.getLogger(__name__)

SnapshotBuilder = Callable[[Database, int], "tuple[int, dict[str, Any]] | None"]
"""Reads the view when its revision differs from the given one: (revision, payload)."""


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
    """Builds the snapshot on the database actor."""


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
    """The database actor read one subscription's view."""

    key: tuple[str, str]
    """(connection ID, subscription ID)."""
    reply: Reply
    """(revision, payload), None when unchanged, or an error."""


@dataclass
class _Subscription:
    connection: Connection
    subscription_id: str
    kind: str
    build: SnapshotBuilder
    revision: int = -1
    reading: bool = False
    stale: bool = False
    """A commit came while a read was in flight: read again once it is answered."""


class SubscriptionActor(ServerActor):
    """Owns: every live subscription and the last revision each one was sent.

    Receives: `Subscribe`, `Unsubscribe`, `ConnectionClosed`, `Tick`, `Committed` (from
        the database actor after a group commit that wrote), `SnapshotRead`.
    Sends: `Transact` to the database actor; events to connections (non-blocking).
    Invariants: one read in flight per subscription; no snapshot is built for a
        connection that has not drained the previous one (drain before next snapshot).
    On failure: reported to the server; subscriptions are connection state, and
        clients resubscribe after reconnecting.
    """

    name = "subscriptions"

    def __init__(
        self, database: pykka.ActorRef[Any], on_actor_failure: ActorFailureHandler
    ) -> None:
        super().__init__(on_actor_failure)
        self._database = database
        self._subscriptions: dict[tuple[str, str], _Subscription] = {}
        self.snapshots_skipped_undrained = 0

    def on_receive(self, message: Any) -> Any:
        match message:
            case Subscribe(connection=connection, subscription_id=sid, kind=kind, build=build):
                key = (connection.connection_id, sid)
                self._subscriptions[key] = _Subscription(connection, sid, kind, build)
                self._poll(key)
            case Unsubscribe(connection_id=cid, subscription_id=sid, reply=reply):
                reply(Reply(self._subscriptions.pop((cid, sid), None) is not None))
            case ConnectionClosed(connection_id=cid):
                for key in [key for key in self._subscriptions if key[0] == cid]:
                    del self._subscriptions[key]
            case Tick() | Committed():
                # A commit refreshes at once; the tick covers a connection that drained.
                for key in list(self._subscriptions):
                    self._poll(key)
            case SnapshotRead(key=key, reply=reply):
                self._deliver(key, reply)
            case _:
                raise TypeError(f"subscription actor got {type(message).__name__}")
        return None

    def _poll(self, key: tuple[str, str]) -> None:
        subscription = self._subscriptions[key]
        if subscription.connection.closed:
            del self._subscriptions[key]
            return
        if subscription.reading:
            subscription.stale = True
            return
        if not subscription.connection.is_drained():
            self.snapshots_skipped_undrained += 1
            return
        since = subscription.revision
        build = subscription.build
        me = self.actor_ref
        subscription.reading = True
        self._database.tell(
            Transact(
                lambda db: build(db, since),
                lambda reply: tell_if_alive(me, SnapshotRead(key, reply)),
                "subscription.read",
            )
        )

    def _deliver(self, key: tuple[str, str], reply: Reply) -> None:
        subscription = self._subscriptions.get(key)
        if subscription is None:
            return  # unsubscribed while the read was in flight
        subscription.reading = False
        try:
            self._offer(subscription, reply)
        finally:
            if subscription.stale and key in self._subscriptions:
                subscription.stale = False
                self._poll(key)  # one read in flight; a commit during it is read next

    def _offer(self, subscription: _Subscription, reply: Reply) -> None:
        if reply.error is not None:
            log.warning(
                "snapshot read failed",
                extra={"action": "subscription.error", "reason": type(reply.error).__name__},
            )
            return
        if reply.value is None:
            return
        revision, payload = reply.value
        subscription.revision = revision
        subscription.connection.offer_event(
            subscription.subscription_id,
            {
                "schema": CLIENT_SCHEMA,
                "type": "event",
                "subscriptionId": subscription.subscription_id,
                "kind": subscription.kind,
                "revision": revision,
                "payload": payload,
            },
        )
