"""The viewer's two connections, each on a thread of its own (neither is thread-safe).

`LiveWorker` owns the `LiveViews` (the run list and the selected run) and hands every
new view, and every change of the connection's state, to a sink as plain data.
`CommandWorker` owns a `WorkflowClient` for commands, pages and content: jobs run in
order and their results come back tagged. The app posts both into its message loop.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pi_workflows.errors import PiWorkflowsError
from pi_workflows.viewer._target import Target, open_client, open_live
from pi_workflows.wire.client import HostUnavailableError, WorkflowClient
from pi_workflows.wire.framing import FrameError
from pi_workflows.wire.live import (
    LiveViews,
    RunNotFoundError,
    ViewKey,
    ViewUnavailableError,
    WatchTimeoutError,
)

__all__ = [
    "CommandDone",
    "CommandWorker",
    "ConnectionChanged",
    "ConnectionState",
    "LiveWorker",
    "RunChanged",
    "RunListChanged",
    "RunMissing",
]

ConnectionState = Literal["connecting", "connected", "reconnecting", "disconnected"]

WAIT_S = 0.2
"""The longest the live thread waits on its socket before it looks at a new selection
(a wake-up costs one timed-out read: no polling of the server)."""
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 5.0
"""Pauses before a new `LiveViews` after one gave up (its own reconnection is bounded)."""


@dataclass(frozen=True, slots=True)
class ConnectionChanged:
    state: ConnectionState
    detail: str = ""


@dataclass(frozen=True, slots=True)
class RunListChanged:
    page: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RunChanged:
    run_id: str
    view: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RunMissing:
    run_id: str
    message: str


@dataclass(frozen=True, slots=True)
class CommandDone:
    """A command job's answer: `value`, or the refusal or failure in words (`error`)."""

    tag: str
    context: Any
    value: Any = None
    error: str | None = None


Sink = Callable[[object], None]


class LiveWorker:
    """A thread that follows the run list and at most one selected run."""

    def __init__(self, target: Target, sink: Sink) -> None:
        self._target = target
        self._sink = sink
        self._selection: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="piw-live", daemon=True)
        self._state: ConnectionState | None = None

    def start(self) -> None:
        self._thread.start()

    def select(self, run_id: str | None) -> None:
        """Follow `run_id` from now on (None: no run); the previous one is unsubscribed."""
        self._selection.put(run_id)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread and close its connection."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _tell(self, state: ConnectionState, detail: str = "") -> None:
        if state != self._state or detail:
            self._state = state
            self._sink(ConnectionChanged(state, detail))

    def _main(self) -> None:
        pause = RETRY_FIRST_S
        selected: list[str | None] = [None]
        while not self._stop.is_set():
            if self._state is None:
                self._tell("connecting")
            try:
                live = open_live(self._target)
            except (PiWorkflowsError, OSError, NotImplementedError) as exc:
                self._tell("disconnected", str(exc))
            else:
                try:
                    self._follow(live, selected)
                    pause = RETRY_FIRST_S
                except (HostUnavailableError, OSError, FrameError) as exc:
                    self._tell("disconnected", str(exc) or "the workflow server is unreachable")
                except PiWorkflowsError as exc:
                    self._tell("disconnected", str(exc))
                finally:
                    live.close()
            self._stop.wait(pause)
            pause = min(pause * 2, RETRY_MAX_S)

    def _follow(self, live: LiveViews, selected: list[str | None]) -> None:
        """Follow until stopped; `selected[0]` survives a new `LiveViews`."""
        live.subscribe(ViewKey.run_list())
        if selected[0] is not None:
            self._subscribe(live, selected[0])
        self._tell("connected")
        while not self._stop.is_set():
            selected[0] = self._apply_selection(live, selected[0])
            try:
                update = live.next_update(WAIT_S)
            except RunNotFoundError as exc:
                self._sink(RunMissing(exc.run_id, str(exc)))
                selected[0] = None
                continue
            except ViewUnavailableError as exc:
                self._sink(RunMissing(str(exc.key.target), str(exc)))
                continue
            if live.lost_since is not None:
                self._tell("reconnecting", "")
                continue
            self._tell("connected")
            if update is None:
                continue
            if update.key.kind == "runList":
                self._sink(RunListChanged(dict(update.view)))
            elif update.key.kind == "run" and update.key.target == selected[0]:
                self._sink(RunChanged(str(update.key.target), dict(update.view)))

    def _apply_selection(self, live: LiveViews, current: str | None) -> str | None:
        wanted = current
        changed = False
        while True:
            try:
                wanted = self._selection.get_nowait()
                changed = True
            except queue.Empty:
                break
        if not changed or wanted == current:
            return current
        if current is not None:
            live.unsubscribe(ViewKey.run(current))
        if wanted is not None and not self._subscribe(live, wanted):
            return None
        return wanted

    def _subscribe(self, live: LiveViews, run_id: str) -> bool:
        try:
            live.subscribe(ViewKey.run(run_id), timeout=WAIT_S)
        except RunNotFoundError as exc:
            self._sink(RunMissing(run_id, str(exc)))
            return False
        except WatchTimeoutError:
            pass  # lost now: the subscription is wanted and is sent on reconnection
        held = live.view(ViewKey.run(run_id))
        if held is not None:  # a view held from before this selection is current
            self._sink(RunChanged(run_id, dict(held)))
        return True


@dataclass(frozen=True, slots=True)
class _Job:
    tag: str
    context: Any
    work: Callable[[WorkflowClient], Any]


@dataclass(slots=True)
class CommandWorker:
    """A thread that runs command jobs one at a time on its own client."""

    target: Target
    sink: Sink
    _jobs: queue.SimpleQueue[_Job | None] = field(default_factory=queue.SimpleQueue)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name="piw-commands", daemon=True)
        self._thread.start()

    def submit(self, tag: str, work: Callable[[WorkflowClient], Any], context: Any = None) -> None:
        """Run `work(client)` on the worker; its answer comes back as `CommandDone(tag)`."""
        self._jobs.put(_Job(tag, context, work))

    def stop(self, timeout: float = 10.0) -> None:
        self._jobs.put(None)
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _main(self) -> None:
        client: WorkflowClient | None = None
        try:
            while (job := self._jobs.get()) is not None:
                try:
                    if client is None:
                        client = open_client(self.target)
                        client.autostart = False  # the live connection may start one
                    value = job.work(client)
                except (PiWorkflowsError, OSError, FrameError, ValueError) as exc:
                    self.sink(
                        CommandDone(job.tag, job.context, error=str(exc) or type(exc).__name__)
                    )
                    if isinstance(exc, (OSError, FrameError, HostUnavailableError)):
                        if client is not None:
                            client.close()
                        client = None
                else:
                    self.sink(CommandDone(job.tag, job.context, value=value))
        finally:
            if client is not None:
                client.close()
