"""The textual app of `piw`: run browser, graph, inspector, timeline and controls.

Two threads carry everything it shows or sends (viewer/_connection.py): the live
thread's views and connection states, and the command thread's answers, both posted
into the app's message loop. The app renders what the server produced and sends the
controls the server allows; it computes no status of its own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import Footer, OptionList, Static
from textual.widgets.option_list import Option

from pi_workflows.viewer._browser import RunBrowser, ticking
from pi_workflows.viewer._config import THEMES, load_theme, save_theme
from pi_workflows.viewer._connection import (
    CommandDone,
    CommandWorker,
    ConnectionChanged,
    ConnectionState,
    LiveWorker,
    RunChanged,
    RunListChanged,
    RunMissing,
)
from pi_workflows.viewer._controls import (
    CLEAR_KEY,
    CONTROLS,
    AnswerForm,
    ConfirmPrompt,
    ControlsBar,
    choices_schema,
    recover_words,
)
from pi_workflows.viewer._conversation import ConversationPane
from pi_workflows.viewer._graph import GraphView
from pi_workflows.viewer._inspector import Inspector
from pi_workflows.viewer._target import Target
from pi_workflows.viewer._timeline import SPEEDS, Replay, Timeline, timeline_text
from pi_workflows.wire.client import WorkflowClient
from pi_workflows.wire.conversation import load_page

__all__ = ["PiwApp", "run_app"]

TERMINAL = ("completed", "failed", "timed_out", "cancelled")
RENDER_EVERY_S = 0.25
"""The shortest time between two renderings of the selected run's views."""


class Posted(Message):
    """Something a worker thread reported (plain data from viewer/_connection.py)."""

    def __init__(self, event: object) -> None:
        super().__init__()
        self.event = event


class ThemePicker(ModalScreen[str | None]):
    """The themes; the highlighted one is previewed at once, Enter keeps it."""

    DEFAULT_CSS = """
    ThemePicker { align: center middle; }
    ThemePicker OptionList { width: 40; height: auto; max-height: 14; border: thick $accent; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [("escape", "cancel", "Cancel")]

    def __init__(self, current: str) -> None:
        super().__init__()
        self.original = current

    def compose(self) -> ComposeResult:
        yield OptionList(*(Option(name, id=name) for name in THEMES), id="themes")

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        if self.original in THEMES:
            options.highlighted = THEMES.index(self.original)
        options.focus()

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if event.option.id is not None:
            self.app.theme = event.option.id

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.app.theme = self.original
        self.dismiss(None)


def _control_bindings() -> list[BindingType]:
    keys = sorted({spec.key for spec in CONTROLS.values()} | {CLEAR_KEY})
    return [Binding(key, f"control_key('{key}')", show=False) for key in keys]


class PiwApp(App[int]):
    """The viewer; `run_id` keeps that run selected (the browser starts hidden).
    `session_id` is the Pi origin session piw was opened from: Clear stops that
    session's view retaining its finished run."""

    TITLE = "piw"
    CSS = """
    #connection { height: 1; background: $primary-background; padding: 0 1; }
    #main { height: 1fr; }
    #center { width: 1fr; }
    #graph { height: 3fr; border-bottom: solid $primary; }
    #inspector { height: 2fr; }
    .hidden { display: none; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
        Binding("b", "toggle_browser", "Browser"),
        Binding("left_square_bracket", "replay_previous", "Prev"),
        Binding("right_square_bracket", "replay_next", "Next"),
        Binding("space", "play", "Play"),
        Binding("L", "live", "Live"),
        Binding("o", "load_older", "Older", show=False),
        Binding("n", "load_newer", "Newer", show=False),
        Binding("comma", "pick_theme", "Theme"),
        *_control_bindings(),
    ]

    def __init__(
        self,
        target: Target,
        run_id: str | None,
        *,
        theme: str | None = None,
        session_id: str | None = None,
    ) -> None:
        super().__init__()
        self.target = target
        self.session_id = session_id
        """Never shown: it names the user's Pi session (only `clearTerminal` gets it)."""
        self.fixed_run = run_id
        self.selected: str | None = run_id
        self.view: dict[str, Any] | None = None
        self.definition: dict[str, Any] | None = None
        self.definition_run: str | None = None
        self.connection: ConnectionState = "connecting"
        self.connection_detail = ""
        self.replay_attempt: str | None = None
        self.speed: int | None = None
        self.run_items: list[dict[str, Any]] = []
        self.answers: dict[str, Any] = {}
        """Answers and refusals of controls, by control (tests read them)."""
        self._pending: dict[str, Any] | None = None
        """The newest view of the selected run not shown yet (see `_coalesce`)."""
        self._render_timer: Timer | None = None
        self._collecting = False
        """A collection of every run-list page is on its way (one at a time)."""
        self._play_timer: Timer | None = None
        self._clock: Timer | None = None
        """Moves elapsed times on: each second while a run runs, else each minute."""
        self._slow_clock: Timer | None = None
        self.live = LiveWorker(target, self._post)
        self.commands = CommandWorker(target, self._post)
        if theme is not None:
            self.theme = theme

    # --- layout ------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Static("", id="connection")
        with Horizontal(id="main"):
            yield RunBrowser(id="browser", classes="hidden" if self.fixed_run else "")
            with Vertical(id="center"):
                yield GraphView(id="graph")
                yield Inspector(id="inspector")
        yield Timeline("", id="timeline")
        yield ControlsBar(id="controls")
        yield Footer()

    def on_mount(self) -> None:
        self.live.start()
        self.commands.start()
        if self.selected is not None:
            self.live.select(self.selected)
        self._clock = self.set_interval(1.0, self._tick, pause=True)
        self._slow_clock = self.set_interval(60.0, self._tick, pause=True)
        self._render_connection()
        self._render_run()

    def on_unmount(self) -> None:
        self.stop_workers()

    def stop_workers(self) -> None:
        """Stop both threads and close their connections (idempotent)."""
        self.live.stop()
        self.commands.stop()

    def _post(self, event: object) -> None:
        self.post_message(Posted(event))  # thread-safe: the workers call it

    # --- what the workers report -------------------------------------------------------

    def on_posted(self, message: Posted) -> None:
        event = message.event
        if isinstance(event, ConnectionChanged):
            self.connection, self.connection_detail = event.state, event.detail
            self._render_connection()
            self._render_timeline()
        elif isinstance(event, RunListChanged):
            self._run_list(event.page)
        elif isinstance(event, RunChanged):
            if event.run_id == self.selected:
                self._coalesce(event.view)
        elif isinstance(event, RunMissing):
            self._run_missing(event)
        elif isinstance(event, CommandDone):
            self._command_done(event)

    def _run_list(self, page: dict[str, Any]) -> None:
        self.run_items = list(page.get("items") or [])
        self.query_one(RunBrowser).show(self.run_items, self.selected)
        self._pace_clocks()
        if page.get("nextCursor") and not self._collecting:  # all pages of one revision
            self._collecting = True
            self.commands.submit("runs", lambda client: list(client.list_runs().items))
        if self.selected is None and self.fixed_run is None and self.run_items:
            self.select_run(str(self.run_items[0]["runId"]))

    def _run_missing(self, event: RunMissing) -> None:
        if event.run_id != self.selected:
            return
        self.connection_detail = event.message
        self.notify(event.message, title="no such run", severity="error", timeout=10)
        self.selected, self.view = None, None
        self._render_connection()
        self._render_run()

    def _command_done(self, done: CommandDone) -> None:
        if done.tag == "runs":
            self._collecting = False
            if done.value is not None:
                self.run_items = list(done.value)
                self.query_one(RunBrowser).show(self.run_items, self.selected)
        elif done.tag == "definition":
            if done.context == self.selected:
                if done.error is not None:
                    self.notify(done.error, title="definition", severity="error")
                self.definition = done.value
                self._render_graph()
        elif done.tag == "page":
            self._page_done(done)
        elif done.tag == "session-page":
            run_id, generation = done.context
            if run_id == self.selected:
                conversation = self.query_one(Inspector).conversation
                conversation.page_arrived(generation, done.value, done.error)
        elif done.tag == "attempt":
            texts = done.value if done.error is None else {"problem": done.error}
            self.query_one(Inspector).show_expanded(str(done.context), texts)
        elif done.tag == "control":
            self._control_done(done)
        elif done.tag == "decision-schema":
            self._decision_form(done)

    def _page_done(self, done: CommandDone) -> None:
        run_id, cursor = done.context
        if run_id != self.selected:
            return
        inspector = self.query_one(Inspector)
        page = done.value
        if done.error is not None or page.get("cursor") != cursor:
            self.notify(
                f"that window is gone ({done.error or 'the run changed'}); showing the newest",
                severity="warning",
            )
            inspector.go_live()
            return
        inspector.show_page(page)

    # --- selection ---------------------------------------------------------------------

    def on_run_browser_selected(self, message: RunBrowser.Selected) -> None:
        self.select_run(message.run_id)

    def select_run(self, run_id: str) -> None:
        """Follow `run_id` instead of the selected run."""
        if run_id == self.selected and self.view is not None:
            return
        self.selected, self.view, self._pending = run_id, None, None
        self.definition, self.definition_run = None, None
        if self.connection == "connected":
            self.connection_detail = ""
        self._stop_replay()
        self.query_one(Inspector).clear_run()
        self.live.select(run_id)
        self._render_connection()
        self._render_run()

    def _coalesce(self, view: dict[str, Any]) -> None:
        """Show a new view at once, and the views of a fast run at most every
        `RENDER_EVERY_S` (the last one wins), so following costs what a screen needs."""
        if self.view is None or self._render_timer is None:
            if self._render_timer is not None:
                self._render_timer.stop()
            self._pending = None
            self._show_view(view)
            self._render_timer = self.set_timer(RENDER_EVERY_S, self._flush_view)
        else:
            self._pending = view

    def _flush_view(self) -> None:
        self._render_timer = None
        pending, self._pending = self._pending, None
        if pending is not None and str(pending["runId"]) == self.selected:
            self._show_view(pending)
            self._render_timer = self.set_timer(RENDER_EVERY_S, self._flush_view)

    def _show_view(self, view: dict[str, Any]) -> None:
        self.view = view
        run_id = str(view["runId"])
        if self.definition_run != run_id:
            self.definition_run = run_id
            ref = (view.get("graph") or {}).get("definition")
            if isinstance(ref, Mapping) and "digest" in ref:
                self.commands.submit(
                    "definition",
                    lambda client: json.loads(client.run_content(run_id, ref)),
                    context=run_id,
                )
        self.query_one(Inspector).show_view(view)
        self._render_run()

    # --- rendering ---------------------------------------------------------------------

    def _render_connection(self) -> None:
        words = {
            "connecting": "connecting…",
            "connected": "connected",
            "reconnecting": "reconnecting: what is shown is not current",
            "disconnected": "disconnected: what is shown is not current",
        }[self.connection]
        parts = ["piw", self.target.describe(), words]
        if self.selected is not None:
            parts.append(f"run {self.selected}")
        if self.connection_detail:
            parts.append(self.connection_detail)
        from rich.markup import escape  # noqa: PLC0415

        self.query_one("#connection", Static).update(escape(" · ".join(parts)))

    def _render_run(self) -> None:
        view = self.view
        display = (view or {}).get("display") or {}
        self.query_one(ControlsBar).show(
            list(display.get("controls") or []), clearable=self._clearable()
        )
        self._render_graph()
        self._render_timeline()
        self._pace_clocks()

    def _clearable(self) -> bool:
        """Clear is offered for a finished run, when piw was opened from a Pi session
        (`/piw` passes `--session`): only a finished run is retained in a session's view."""
        status = ((self.view or {}).get("display") or {}).get("status")
        return self.session_id is not None and status in TERMINAL

    def _pace_clocks(self) -> None:
        """Tick each second while a shown run runs, each minute while one is unfinished,
        not at all otherwise (an idle screen costs nothing)."""
        if self._clock is None or self._slow_clock is None:
            return
        statuses = [item["display"]["status"] for item in self.run_items]
        if self.view is not None:
            statuses.append(self.view["display"]["status"])
        fast = any(ticking(status) for status in statuses)
        slow = not fast and any(status not in TERMINAL for status in statuses)
        (self._clock.resume if fast else self._clock.pause)()
        (self._slow_clock.resume if slow else self._slow_clock.pause)()

    def _render_graph(self) -> None:
        self.query_one(GraphView).show_run(
            self.view, self.definition, replay_attempt=self.replay_attempt
        )

    def _render_timeline(self) -> None:
        self.query_one(Timeline).update(
            timeline_text(
                self.view, connection=self.connection, replay=self._replay(), speed=self.speed
            )
        )

    def _tick(self) -> None:
        self._render_timeline()
        self.query_one(RunBrowser).tick(self.run_items)

    # --- replay ------------------------------------------------------------------------

    def _window_items(self) -> list[dict[str, Any]]:
        window = self.query_one(Inspector).window
        return [] if window is None else window.items

    def _replay(self) -> Replay | None:
        if self.replay_attempt is None:
            return None
        window = self.query_one(Inspector).window
        items = [] if window is None else window.items
        for index, item in enumerate(items):
            if item["attemptId"] == self.replay_attempt:
                assert window is not None
                return Replay(item["attemptId"], str(item["node"]), window.first + index + 1,
                              window.count)  # fmt: skip
        return Replay(self.replay_attempt, "?", 0, 0 if window is None else window.count)

    def _replay_index(self) -> int | None:
        items = self._window_items()
        for index, item in enumerate(items):
            if item["attemptId"] == self.replay_attempt:
                return index
        return None

    def _replay_to(self, index: int | None) -> None:
        items = self._window_items()
        inspector = self.query_one(Inspector)
        if index is None or not items or index >= len(items):
            self.replay_attempt = None
            self._stop_play()
            inspector.conversation.replay_until(None)
        else:
            item = items[max(0, index)]
            self.replay_attempt = str(item["attemptId"])
            inspector.select_attempt(self.replay_attempt)
            inspector.conversation.replay_until(_replayed_until(item))
        self._render_graph()
        self._render_timeline()

    def action_replay_previous(self) -> None:
        items = self._window_items()
        if not items:
            return
        index = self._replay_index()
        self._replay_to(len(items) - 1 if index is None else max(0, index - 1))

    def action_replay_next(self) -> None:
        index = self._replay_index()
        if self.replay_attempt is not None:
            self._replay_to(None if index is None else index + 1)

    def action_live(self) -> None:
        self._stop_replay()

    def action_play(self) -> None:
        """Space: play at 1×, then 2×, 5×, 10×, then stop."""
        if self.speed is None:
            speed: int | None = SPEEDS[0]
        else:
            position = SPEEDS.index(self.speed) + 1
            speed = SPEEDS[position] if position < len(SPEEDS) else None
        self._stop_play()
        if speed is None:
            self._render_timeline()
            return
        self.speed = speed
        if self.replay_attempt is None:
            self._replay_to(0)
        self._play_timer = self.set_interval(1.0 / speed, self.action_replay_next)
        self._render_timeline()

    def _stop_play(self) -> None:
        if self._play_timer is not None:
            self._play_timer.stop()
            self._play_timer = None
        self.speed = None

    def _stop_replay(self) -> None:
        self._stop_play()
        self.replay_attempt = None
        self.query_one(Inspector).conversation.replay_until(None)
        self._render_graph()
        self._render_timeline()

    # --- inspector ---------------------------------------------------------------------

    def action_load_older(self) -> None:
        self.query_one(Inspector).load_older()

    def action_load_newer(self) -> None:
        self.query_one(Inspector).load_newer()

    def on_inspector_page_wanted(self, message: Inspector.PageWanted) -> None:
        run_id, cursor, revision = self.selected, message.cursor, message.revision
        if run_id is None:
            return
        self.commands.submit(
            "page",
            lambda client: client.run_page(run_id, "trace", revision=revision, cursor=cursor),
            context=(run_id, cursor),
        )

    def on_conversation_pane_page_wanted(self, message: ConversationPane.PageWanted) -> None:
        run_id, revision, cursor = message.run_id, message.revision, message.cursor
        known = message.known
        if run_id != self.selected:
            return
        self.commands.submit(
            "session-page",
            lambda client: load_page(client, run_id, revision, cursor, known),
            context=(run_id, message.generation),
        )

    def on_inspector_attempt_selected(self, message: Inspector.AttemptSelected) -> None:
        run_id, item = self.selected, message.item
        if run_id is not None:
            self.commands.submit(
                "attempt",
                lambda client: _attempt_texts(client, run_id, item),
                context=item["attemptId"],
            )

    # --- controls ----------------------------------------------------------------------

    def on_controls_bar_pressed(self, message: ControlsBar.Pressed) -> None:
        self.run_control(message.name)

    def action_control_key(self, key: str) -> None:
        controls = ((self.view or {}).get("display") or {}).get("controls") or []
        for control in controls:
            spec = CONTROLS.get(control)
            if spec is not None and spec.key == key:
                self.run_control(control)
                return
        if key == CLEAR_KEY and self._clearable():
            self.run_control("clear")

    def run_control(self, control: str) -> None:
        """Send `control` for the selected run (after its form or prompt)."""
        view, run_id = self.view, self.selected
        if view is None or run_id is None:
            return
        if control == "clear":
            if self.session_id is not None:
                session = {"sessionId": self.session_id}
                self._send(control, "sessionView.clearTerminal", session, None)
            return
        spec = CONTROLS.get(control)
        if spec is None:
            return
        if spec.form == "answer":
            self._answer(control, view)
        elif spec.form == "recover":
            words, fields = recover_words(control, view)
            payload = {**spec.payload, **fields}

            def confirmed(yes: bool | None) -> None:
                if yes:
                    self._send(control, spec.operation, payload, run_id)

            self.push_screen(ConfirmPrompt(words, yes=spec.label), confirmed)
        else:
            self._send(control, spec.operation, dict(spec.payload), run_id)

    def _send(
        self, control: str, operation: str, payload: dict[str, Any], run_id: str | None
    ) -> None:
        self.commands.submit(
            "control",
            lambda client: dict(client.call(operation, payload, run_id=run_id)),
            context=control,
        )

    def _control_done(self, done: CommandDone) -> None:
        control = str(done.context)
        if done.error is not None:
            self.answers[control] = {"refused": done.error}
            self.notify(done.error, title=f"{control} refused", severity="error", timeout=10)
            return
        self.answers[control] = done.value
        if control == "clear":
            self._clear_done(done.value or {})
            return
        adopted = " (already done)" if (done.value or {}).get("outcome") == "adopted" else ""
        self.notify(f"{control}: sent{adopted}", timeout=4)

    def _clear_done(self, answer: Mapping[str, Any]) -> None:
        """The server's answer to Clear: which run the session no longer retains, or
        that it retained none (already cleared, or an unfinished run is shown there)."""
        cleared = (answer.get("receipt") or {}).get("clearedRunId")
        if isinstance(cleared, str):
            self.notify(f"clear: {cleared} is no longer retained in its Pi session", timeout=6)
        else:
            self.notify(
                "clear: nothing to clear, the Pi session retains no finished run",
                severity="warning",
                timeout=6,
            )

    def _answer(self, control: str, view: Mapping[str, Any]) -> None:
        display = view.get("display") or {}
        run_id = str(view["runId"])
        if control == "answer":
            node = display.get("waitingOn")
            nodes = (self.definition or {}).get("nodes") or {}
            schema = (nodes.get(node) or {}).get("answerSchema") if node else None
            self._open_form(control, display, schema, None)
            return
        choices = list(display.get("choices") or [])
        if choices:
            first = choices[0]
            example: dict[str, Any] = {"choice": first["id"]}
            if first.get("input"):
                example["input"] = {first["input"]: ""}
            self._open_form(control, display, choices_schema(choices), example)
            return
        self.commands.submit(
            "decision-schema",
            lambda client: client.call("decision.list", {"runId": run_id})["receipt"]["items"],
            context=run_id,
        )

    def _decision_form(self, done: CommandDone) -> None:
        if done.context != self.selected or self.view is None:
            return
        if done.error is not None:
            self.notify(done.error, title="decision", severity="error")
            return
        items = done.value or []
        schema = items[0].get("answerSchema") if items else None
        self._open_form("human-answer", self.view.get("display") or {}, schema, None)

    def _open_form(
        self,
        control: str,
        display: Mapping[str, Any],
        schema: Mapping[str, Any] | None,
        example: Any,
    ) -> None:
        spec = CONTROLS[control]
        run_id = self.selected
        words = (
            "The answer must match this schema:\n" + json.dumps(schema, indent=2)
            if schema is not None
            else "The server checks the answer (no schema is known here)."
        )
        from rich.markup import escape  # noqa: PLC0415

        question = str(display.get("question") or f"Answer {display.get('waitingOn', '')}")

        def answered(result: Any) -> None:
            if result is not None and run_id is not None:
                payload = {"answer": result["answer"]}
                if control == "human-answer":
                    payload["sourceChannel"] = "cli"
                self._send(control, spec.operation, payload, run_id)

        self.push_screen(
            AnswerForm(escape(question), schema, example, schema_words=escape(words)), answered
        )

    # --- the rest ----------------------------------------------------------------------

    def action_toggle_browser(self) -> None:
        self.query_one(RunBrowser).toggle_class("hidden")

    def action_pick_theme(self) -> None:
        def chosen(name: str | None) -> None:
            if name is None:
                return
            self.theme = name
            try:
                save_theme(name)
            except (OSError, ValueError) as exc:
                self.notify(f"the theme was not saved: {exc}", severity="warning")

        self.push_screen(ThemePicker(self.theme), chosen)

    async def action_quit(self) -> None:
        self.exit(0)


def _replayed_until(item: Mapping[str, Any]) -> int | None:
    """When the replayed attempt ended: the conversation is shown as it was then (all
    of it for an attempt still running: what is recorded so far is its own)."""
    finished = item.get("finishedAt")
    return finished if isinstance(finished, int) else None


def _attempt_texts(client: WorkflowClient, run_id: str, item: Mapping[str, Any]) -> dict[str, str]:
    """The complete output, error and traceback of an attempt, loaded and verified."""
    texts: dict[str, str] = {}
    output = item.get("output")
    if isinstance(output, Mapping) and "ref" in output and "value" not in output:
        value = json.loads(client.run_content(run_id, output["ref"]))
        texts["output"] = json.dumps(value, indent=2, ensure_ascii=False)
    if "errorContent" in item:
        texts["error"] = client.run_content(run_id, item["errorContent"]).decode("utf-8", "replace")
    traceback = item.get("traceback")
    if isinstance(traceback, Mapping) and "text" not in traceback and "ref" in traceback:
        texts["traceback"] = client.run_content(run_id, traceback["ref"]).decode("utf-8", "replace")
    return texts


def run_app(
    target: Target, run_id: str | None, *, theme: str | None, session_id: str | None = None
) -> int:
    """Run the viewer until the user quits; return the exit code."""
    chosen = theme if theme is not None else load_theme()
    app = PiwApp(
        target, run_id, theme=chosen if chosen in THEMES else THEMES[0], session_id=session_id
    )
    try:
        code = app.run()
    finally:
        app.stop_workers()
    return 0 if code is None else code
