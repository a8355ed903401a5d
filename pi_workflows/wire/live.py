"""`LiveViews`: subscriptions as iterators of typed views, across reconnections.

Implements client-protocol.md § Subscriptions and reconnection for Python clients.
A `LiveViews` owns one connection and records the subscriptions its caller wants (the
run list, a run by ID, a session by ID) with the last revision and view of each:

- `runSnapshot`, `runList` and `sessionSnapshot` events replace the held view;
- a `runPatch` applies (`view_patch.apply_patch`) only to the view held at exactly its
  `baseRevision`; otherwise the client resubscribes without a revision and so gets a
  snapshot, never a view patched from the wrong base;
- when the connection is lost (the server stopped, crashed or restarted), it reconnects
  with a bounded backoff for at most `reconnect_timeout` seconds and sends every
  subscription again, a run's with the revision it holds, so a server that still
  retains that revision answers with patches only;
- a `run` subscription answered `notFound` raises `RunNotFoundError` at once.

It waits on its socket with timeouts and never spins; it never opens SQLite. A
reconnection never starts a server: a stopped server was stopped on purpose, and the
caller's timeout decides how long to wait for the next one (only the first connection
may start one, with `autostart`).
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, cast

from pi_workflows.errors import PiWorkflowsError
from pi_workflows.wire.client import (
    DEFAULT_REQUEST_TIMEOUT_S,
    HostUnavailableError,
    RequestFailedError,
    WorkflowClient,
)
from pi_workflows.wire.framing import FrameError
from pi_workflows.wire.protocol import ProtocolViolation, client_message_from_wire
from pi_workflows.wire.view_patch import PatchError, PatchOperation, apply_patch
from pi_workflows.wire.views import RunListPage, RunView, SessionView, is_settled

__all__ = [
    "DEFAULT_RECONNECT_TIMEOUT_S",
    "LiveViews",
    "RunNotFoundError",
    "ViewKey",
    "ViewUnavailableError",
    "ViewUpdate",
    "WatchTimeoutError",
]

DEFAULT_RECONNECT_TIMEOUT_S: Final = 120.0
"""How long a lost connection may stay lost before `HostUnavailableError`: long enough
for a graceful stop (its drain period is 30 s by default) and the next start."""
BACKOFF_FIRST_S: Final = 0.05
BACKOFF_MAX_S: Final = 1.0
"""Pauses between reconnection attempts double from the first to the last."""
IDLE_READ_S: Final = 5.0
"""The longest single socket wait; the loop then checks its deadline again."""

ViewKind = Literal["runList", "run", "sessionView"]


class RunNotFoundError(PiWorkflowsError):
    """The server has no such run: its subscription answered `notFound`."""

    def __init__(self, run_id: str, message: str) -> None:
        super().__init__(message)
        self.run_id = run_id


class ViewUnavailableError(PiWorkflowsError):
    """The server ended a subscription with an `unavailable` event (the run was pruned)."""

    def __init__(self, key: ViewKey, code: str, message: str) -> None:
        super().__init__(message)
        self.key = key
        self.code = code


class WatchTimeoutError(PiWorkflowsError, TimeoutError):
    """The caller's timeout passed before the next view arrived."""


@dataclass(frozen=True, slots=True)
class ViewKey:
    """Which view a subscription follows: its kind and its run or session ID."""

    kind: ViewKind
    target: str | None = None

    @classmethod
    def run(cls, run_id: str) -> ViewKey:
        return cls("run", run_id)

    @classmethod
    def run_list(cls) -> ViewKey:
        return cls("runList")

    @classmethod
    def session(cls, session_id: str) -> ViewKey:
        return cls("sessionView", session_id)


@dataclass(frozen=True, slots=True)
class ViewUpdate:
    """A new view of one subscription and how it arrived."""

    key: ViewKey
    revision: int
    view: Any
    """A `RunView`, `RunListPage` (the first page) or `SessionView`, by `key.kind`."""
    via: Literal["snapshot", "patch"]


@dataclass(slots=True)
class _Held:
    """A wanted subscription: its ID on the current connection and the last view."""

    key: ViewKey
    subscription_id: str | None = None
    revision: int | None = None
    view: Any = None


class _LostError(Exception):
    """The connection is gone, or the server is stopping: reconnect."""


@dataclass
class LiveViews:
    """Live views over one connection of their own, kept across reconnections.

    Args:
        state_dir: the workflow state folder, `<agent dir>/workflows`.
        client_id: stable client identity; random when omitted.
        autostart: the first connection may start a server (reconnections never do).
        timeout: seconds to wait for one response.
        reconnect_timeout: seconds a lost connection may stay lost before
            `HostUnavailableError` (the outage, not the whole watch).
        url: a `piw serve` relay (`ws://127.0.0.1:PORT/ws`) to connect through
            instead of the state folder's socket (never starts a server).

    **Blocking:** every method blocks the calling thread. Not thread-safe: use one
    `LiveViews` per thread. Use it as a context manager, or call `close()`.

        with LiveViews(state_dir) as live:
            for view in live.watch_run(run_id, timeout=600):
                print(view["display"]["status"])
                if view["display"]["status"] == "completed":
                    break
    """

    state_dir: Path
    client_id: str | None = None
    autostart: bool = True
    timeout: float = DEFAULT_REQUEST_TIMEOUT_S
    reconnect_timeout: float = DEFAULT_RECONNECT_TIMEOUT_S
    url: str | None = None
    reconnects: int = 0
    """Connections made after a lost one (tests and displays read it)."""
    _client: WorkflowClient = field(init=False)
    _held: dict[ViewKey, _Held] = field(init=False, default_factory=dict)
    _by_subscription: dict[str, ViewKey] = field(init=False, default_factory=dict)
    _events: deque[dict[str, Any]] = field(init=False, default_factory=deque)
    _connection: int | None = field(init=False, default=None)
    """The client's connection number the subscriptions live on."""
    _lost_at: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        options: dict[str, Any] = {} if self.client_id is None else {"client_id": self.client_id}
        self._client = WorkflowClient(
            self.state_dir,
            autostart=self.autostart,
            timeout=self.timeout,
            connect_on_enter=False,
            url=self.url,
            event_sink=self._events.append,
            **options,
        )

    def __enter__(self) -> LiveViews:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection; the server removes its subscriptions."""
        self._client.close()
        self._forget_connection()

    # --- subscriptions ---------------------------------------------------------------

    def subscribe(self, key: ViewKey, *, timeout: float | None = None) -> None:
        """Want `key`'s view; subscribe now (reconnecting if needed).

        Raises:
            RunNotFoundError: a `run` subscription for a run that does not exist.
            RequestFailedError: the server refused the subscription otherwise.
            HostUnavailableError: no server for `reconnect_timeout` seconds.
            WatchTimeoutError: `timeout` passed first.
        """
        self._held.setdefault(key, _Held(key))
        self._ready(_deadline(timeout))

    def unsubscribe(self, key: ViewKey) -> None:
        """Stop following `key` (told to the server when connected; never reconnects)."""
        held = self._held.pop(key, None)
        if held is None or held.subscription_id is None:
            return
        self._by_subscription.pop(held.subscription_id, None)
        if self._client.connections == self._connection and self._client.is_connected:
            with contextlib.suppress(PiWorkflowsError, OSError, FrameError):
                self._client.autostart = False
                self._client.request("view.unsubscribe", {"subscriptionId": held.subscription_id})

    @property
    def lost_since(self) -> float | None:
        """When the connection was lost (`time.monotonic()`), None while it is not: a
        display marks what it shows as reconnecting, never current, until then."""
        return self._lost_at

    def view(self, key: ViewKey) -> Any:
        """The last view held for `key`, or None."""
        held = self._held.get(key)
        return None if held is None else held.view

    def revision(self, key: ViewKey) -> int | None:
        """The revision of the view held for `key`, or None."""
        held = self._held.get(key)
        return None if held is None else held.revision

    def next_update(self, timeout: float | None = None) -> ViewUpdate | None:
        """Wait for the next new view of any subscription; None when `timeout` passes.

        Raises what `subscribe` raises, and `ViewUnavailableError` when the server ends
        a subscription (the view is no longer wanted then).
        """
        deadline = _deadline(timeout)
        while True:
            if not self._ready(deadline, raise_timeout=False):
                return None
            while self._events:
                update = self._handle(self._events.popleft())
                if update is not None:
                    return update
            if self._subscribed():  # a resubscription above may be needed first
                wait = IDLE_READ_S if deadline is None else deadline - time.monotonic()
                if wait <= 0:
                    return None
                self._read_one(min(wait, IDLE_READ_S))

    def watch(self, key: ViewKey, *, timeout: float | None = None) -> Generator[Any, None, None]:
        """Yield `key`'s view now (once one is held) and after every change.

        `timeout` bounds the whole watch (`WatchTimeoutError`). Updates of other
        subscriptions are still applied while it waits. Leaving the loop unsubscribes.
        """
        deadline = _deadline(timeout)
        self.subscribe(key, timeout=_remaining(deadline))
        try:
            held = self._held[key]
            if held.view is not None:
                yield held.view
            while True:
                update = self.next_update(_remaining(deadline))
                if update is None:
                    raise WatchTimeoutError(f"no new view within {timeout} s")
                if update.key == key:
                    yield update.view
        finally:
            self.unsubscribe(key)

    def watch_run(
        self, run_id: str, *, timeout: float | None = None
    ) -> Generator[RunView, None, None]:
        """`watch` of one run's `pi-workflows.run-view.v1`."""
        return cast(
            Generator[RunView, None, None], self.watch(ViewKey.run(run_id), timeout=timeout)
        )

    def wait_run(self, run_id: str, *, timeout: float | None = None) -> RunView:
        """Follow the run's subscription until it settles (`views.is_settled`: terminal,
        or it needs someone) and return that view; one already settled returns at once.

        Raises:
            RunNotFoundError: there is no such run.
            ViewUnavailableError: the run was pruned while it was waited for.
            WatchTimeoutError: `timeout` passed first (the run goes on).
            HostUnavailableError: the server stayed unreachable for `reconnect_timeout`.
        """
        for view in self.watch_run(run_id, timeout=timeout):
            if is_settled(view["display"]):
                return view
        raise AssertionError("a watch ends only by a view or an error")

    def watch_run_list(self, *, timeout: float | None = None) -> Generator[RunListPage, None, None]:
        """`watch` of the run list's first page (newest runs)."""
        return cast(
            Generator[RunListPage, None, None], self.watch(ViewKey.run_list(), timeout=timeout)
        )

    def watch_session(
        self, session_id: str, *, timeout: float | None = None
    ) -> Generator[SessionView, None, None]:
        """`watch` of an origin session's `pi-workflows.session-view.v1`."""
        return cast(
            Generator[SessionView, None, None],
            self.watch(ViewKey.session(session_id), timeout=timeout),
        )

    # --- connection ------------------------------------------------------------------

    def _subscribed(self) -> bool:
        return all(held.subscription_id is not None for held in self._held.values())

    def _ready(self, deadline: float | None, *, raise_timeout: bool = True) -> bool:
        """Connect and subscribe every wanted view; False when `deadline` passed first."""
        pause = BACKOFF_FIRST_S
        while True:
            try:
                self._subscribe_all()
                self._lost_at = None
                return True
            except _LostError:
                self._lose()
            now = time.monotonic()
            assert self._lost_at is not None
            if now - self._lost_at >= self.reconnect_timeout:
                raise HostUnavailableError(
                    f"the workflow server was unreachable for {self.reconnect_timeout:.0f} s; "
                    "check `pi-workflows server status`"
                )
            if deadline is not None and now >= deadline:
                if raise_timeout:
                    raise WatchTimeoutError("the workflow server did not come back in time")
                return False
            stop = self._lost_at + self.reconnect_timeout
            time.sleep(max(0.0, min(pause, stop - now, (deadline or stop) - now)))
            pause = min(pause * 2, BACKOFF_MAX_S)

    def _subscribe_all(self) -> None:
        try:
            self._client.connect()
        except (HostUnavailableError, OSError) as exc:
            if self._connection is None:
                raise  # never connected: there is no server to wait for
            raise _LostError from exc
        self._adopt_connection()
        while not self._subscribed():  # a reconnection inside a request starts again
            for held in list(self._held.values()):
                if held.subscription_id is None and held.key in self._held:
                    self._send_subscribe(held)

    def _send_subscribe(self, held: _Held) -> None:
        key = held.key
        payload: dict[str, Any] = {"kind": key.kind}
        run_id = None
        if key.kind == "run":
            run_id = key.target
            if held.revision is not None:
                payload["revision"] = held.revision  # patches from here, if retained
        elif key.kind == "sessionView":
            payload["sessionId"] = key.target
        if self._connection is not None:
            self._client.autostart = False  # only the first connection may start a server
        try:
            response = self._client.request("view.subscribe", payload, run_id=run_id)
        except (HostUnavailableError, OSError, FrameError) as exc:
            raise _LostError from exc
        self._adopt_connection()
        outcome = response["outcome"]
        if outcome in ("accepted", "adopted"):
            subscription_id = str(response["receipt"]["subscriptionId"])
            held.subscription_id = subscription_id
            self._by_subscription[subscription_id] = key
            return
        error = response.get("error")
        if outcome == "unavailable" and error is not None and error["code"] == "serverStopping":
            self._client.close()
            raise _LostError
        del self._held[key]
        if outcome == "notFound" and key.kind == "run":
            raise RunNotFoundError(
                str(key.target),
                f"no run {key.target!r}; check the ID with `pi-workflows run list`",
            )
        raise RequestFailedError(response)

    def _adopt_connection(self) -> None:
        """After a request: a new connection (the client reconnected) holds nothing."""
        current = self._client.connections
        if current != self._connection:
            if self._connection is not None:
                self.reconnects += 1
            self._forget_subscriptions()
            self._connection = current

    def _lose(self) -> None:
        self._client.close()
        self._forget_connection()
        if self._lost_at is None:
            self._lost_at = time.monotonic()

    def _forget_connection(self) -> None:
        self._forget_subscriptions()
        self._events.clear()  # events of a dead connection name dead subscriptions

    def _forget_subscriptions(self) -> None:
        for held in self._held.values():
            held.subscription_id = None
        self._by_subscription.clear()

    def _read_one(self, wait: float) -> None:
        """Wait up to `wait` seconds for one message and queue it if it is an event."""
        try:
            self._client.set_read_timeout(wait)
            message = self._client.read_message()
            checked = None if message is None else client_message_from_wire(message)
        except TimeoutError:
            return
        except (OSError, FrameError, ProtocolViolation):
            checked = None
        if checked is None:  # end of stream, or a broken one
            self._lose()
            return
        if checked["type"] != "event":
            return  # a stale response of an abandoned request attempt
        if (
            checked["kind"] == "unavailable"
            and checked["subscriptionId"] == self._client.connection_id
        ):
            self._lose()  # the server closes this connection and says why
            return
        self._events.append(dict(checked))

    # --- events ----------------------------------------------------------------------

    def _handle(self, event: dict[str, Any]) -> ViewUpdate | None:
        key = self._by_subscription.get(str(event.get("subscriptionId")))
        held = None if key is None else self._held.get(key)
        if key is None or held is None:
            return None  # an abandoned subscription's late event
        kind, payload, revision = event["kind"], event["payload"], int(event["revision"])
        if kind in ("runList", "runSnapshot", "sessionSnapshot"):
            held.view, held.revision = payload, revision
            return ViewUpdate(key, revision, payload, "snapshot")
        if kind == "runPatch":
            return self._patch(held, payload, revision)
        if kind == "unavailable":
            self.unsubscribe(key)
            raise ViewUnavailableError(
                key, str(payload.get("code", "unavailable")), str(payload.get("message", ""))
            )
        return None  # `runPage` and kinds of later versions

    def _patch(self, held: _Held, payload: dict[str, Any], revision: int) -> ViewUpdate | None:
        base = payload.get("baseRevision")
        operations = cast(list[PatchOperation], payload.get("operations", []))
        if held.view is not None and held.revision is not None and held.revision == base:
            try:
                view = apply_patch(held.view, operations)
            except PatchError:
                pass
            else:
                held.view, held.revision = view, revision
                return ViewUpdate(held.key, revision, view, "patch")
        self._resnapshot(held)
        return None

    def _resnapshot(self, held: _Held) -> None:
        """A patch from another base: subscribe again without a revision (a snapshot)."""
        held.revision = None
        old = held.subscription_id
        held.subscription_id = None
        if old is None:
            return
        self._by_subscription.pop(old, None)
        with contextlib.suppress(PiWorkflowsError, OSError, FrameError):
            self._client.request("view.unsubscribe", {"subscriptionId": old})
            self._adopt_connection()


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())
