"""The `piw` app, headless (textual's `run_test()`/Pilot), against a real server.

An embedded server executes real runs in runner processes; the app reaches it only
through its socket (`LiveViews` and `WorkflowClient` on their own threads). The tests
browse and select runs, expand a failed step's traceback, pause and resume through the
buttons, answer a checkpoint through the form, see a refusal, and page through the
steps of a 3,000-step run; each waits for what it expects, never for a fixed time.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Button, DataTable, Input, Static

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.testing import perform_with_calls
from pi_workflows.viewer import Target
from pi_workflows.viewer._app import PiwApp
from pi_workflows.viewer._browser import RunBrowser
from pi_workflows.viewer._controls import AnswerForm, ControlsBar
from pi_workflows.viewer._inspector import Inspector
from tests.conftest import SLEEPY_WORKFLOW, write_workflow
from tests.server.origin import AGENT_WORKFLOW, SESSION, rows, session_snapshot, start
from tests.server.runs import TERMINAL, start_run, wait_for
from tests.server.watchers import Watcher
from tests.server.watchers import wait_for as poll

pytestmark = pytest.mark.timeout(180)

WAIT_S = 60.0
SIZE = (160, 50)

BOOM = """
from pi_workflows import compute, define_workflow

def boom(ctx):
    raise RuntimeError("no luck in " + "boom")

workflow = define_workflow(name="boom", start_at="b", nodes={"b": compute(boom)})
"""

APPROVAL = """
from pi_workflows import checkpoint, compute, define_workflow

SCHEMA = {
    "type": "object",
    "required": ["approved"],
    "properties": {"approved": {"type": "boolean"}},
    "additionalProperties": False,
}

workflow = define_workflow(
    name="approval",
    start_at="ask",
    nodes={
        "ask": checkpoint(summary="Ship it?", input_schema=SCHEMA),
        "done": compute(lambda ctx: {"shipped": ctx.outputs["ask"]["approved"]}),
    },
    edges=[{"from": "ask", "to": "done"}],
)
"""

STEPS = 3_000
LOOP = f"""
from pi_workflows import compute, define_workflow

def step(ctx):
    n = ((ctx.outputs.get("step") or {{}}).get("n") or 0) + 1
    return {{"n": n, "more": n < {STEPS}}}

workflow = define_workflow(
    name="loop",
    start_at="step",
    max_steps={STEPS + 100},
    nodes={{"step": compute(step), "done": compute(lambda ctx: ctx.outputs["step"])}},
    edges=[{{"from": "step", "switch": {{"on": "$.more", "cases": {{"true": "step"}},
            "default": "done"}}}}],
)
"""


@pytest.fixture
def project(short_tmp: Path) -> Path:
    folder = short_tmp / "project"
    write_workflow(folder, "hello")
    write_workflow(folder, "sleepy", SLEEPY_WORKFLOW.format(name="sleepy"))
    write_workflow(folder, "boom", BOOM)
    write_workflow(folder, "approval", APPROVAL)
    write_workflow(folder, "loop", LOOP)
    write_workflow(folder, "ask", AGENT_WORKFLOW)
    return folder


@pytest.fixture
def server(state_dir: Path) -> Iterator[WorkflowServer]:
    instance = WorkflowServer(
        state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=True, units=perform_with_calls
    )
    instance.start()
    try:
        yield instance
    finally:
        instance.stop("test teardown")


@pytest.fixture
def client(server: WorkflowServer) -> Iterator[WorkflowClient]:
    with WorkflowClient(server.state_dir, autostart=False, timeout=30) as connected:
        yield connected


def drive(
    state_dir: Path,
    run_id: str | None,
    scenario: Callable[[PiwApp, Pilot[int]], Coroutine[Any, Any, None]],
    *,
    session_id: str | None = None,
) -> PiwApp:
    """Run the app headless on `state_dir` and play `scenario`; the threads must stop."""
    app = PiwApp(Target(state_dir), run_id, theme="textual-dark", session_id=session_id)

    async def main() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await scenario(app, pilot)
            await pilot.press("q")

    asyncio.run(main())
    assert not app.live.alive and not app.commands.alive, "a viewer thread outlived the app"
    assert not [t for t in threading.enumerate() if t.name.startswith("piw-")]
    return app


async def until(pilot: Pilot[Any], check: Callable[[], Any], what: str) -> Any:
    """Let the app work until `check()` is truthy (its value is returned)."""
    deadline = time.monotonic() + WAIT_S
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.05)
    return value


def controls(app: PiwApp) -> list[str]:
    return [] if app.view is None else list(app.view["display"]["controls"])


def status(app: PiwApp) -> str | None:
    return None if app.view is None else str(app.view["display"]["status"])


def text_of(app: PiwApp, selector: str) -> str:
    return str(app.query_one(selector, Static).render())


async def click_control(app: PiwApp, pilot: Pilot[int], control: str) -> None:
    """Click the control's button once it is laid out (a click goes by screen position)."""

    def placed() -> bool:
        found = app.query(f"#control-{control}")
        return bool(found) and found.first(Button).region.area > 0

    await until(pilot, placed, f"the {control} button")
    await pilot.pause()
    await pilot.click(f"#control-{control}")


def test_browse_select_and_expand_a_failed_steps_traceback(
    server: WorkflowServer, client: WorkflowClient, project: Path
) -> None:
    first = start_run(client, project, "hello")
    wait_for(client, first, TERMINAL)
    failed = start_run(client, project, "boom")
    wait_for(client, failed, TERMINAL)

    async def scenario(app: PiwApp, pilot: Pilot[int]) -> None:
        browser = app.query_one(RunBrowser)
        await until(pilot, lambda: browser.run_ids == [failed, first], "both runs, newest first")
        assert "connected" in text_of(app, "#connection")
        await until(pilot, lambda: app.view is not None, "the newest run's view")
        browser.focus()
        browser.move_cursor(row=1)
        await pilot.press("enter")
        await until(pilot, lambda: app.view and app.view["runId"] == first, "the older run")
        assert status(app) == "completed"
        browser.move_cursor(row=0)
        await pilot.press("enter")
        await until(pilot, lambda: app.view and app.view["runId"] == failed, "the failed run")
        assert status(app) == "failed"
        inspector = app.query_one(Inspector)
        table = inspector.steps_table
        await until(pilot, lambda: table.row_count == 1, "the failed attempt")
        table.focus()
        await pilot.press("enter")
        detail = await until(
            pilot,
            lambda: "Traceback" in text_of(app, "#steps-text") and text_of(app, "#steps-text"),
            "the expanded traceback",
        )
        assert "RuntimeError: no luck in boom" in detail
        assert "outcome: failed" in detail
        await until(pilot, lambda: app.definition is not None, "the verified definition")
        assert set((app.definition or {})["nodes"]) == {"b"}
        inspector.active = "info"
        await pilot.pause()
        assert f"run: {failed}" in text_of(app, "#info-text")
        assert not browser.has_class("hidden")
        await pilot.press("b")
        await until(pilot, lambda: browser.has_class("hidden"), "the browser collapsed")
        inspector.active = "trace"
        await pilot.pause()
        assert '"attemptId"' in text_of(app, "#trace-text")

    drive(server.state_dir, None, scenario)


def test_pause_and_resume_through_the_buttons_and_a_refusal(
    server: WorkflowServer, client: WorkflowClient, project: Path
) -> None:
    run_id = start_run(client, project, "sleepy")
    wait_for(client, run_id, {"running"})

    async def scenario(app: PiwApp, pilot: Pilot[int]) -> None:
        assert app.query_one(RunBrowser).has_class("hidden"), "piw RUN_ID hides the browser"
        await until(pilot, lambda: status(app) == "running", "the running run")
        await click_control(app, pilot, "pause")
        await until(pilot, lambda: status(app) == "paused", "paused")
        assert "pause" not in controls(app) and "resume" in controls(app)
        await click_control(app, pilot, "resume")
        await until(pilot, lambda: status(app) in ("queued", "running"), "resumed")
        await click_control(app, pilot, "cancel")
        await until(pilot, lambda: status(app) == "cancelled", "cancelled")
        # A refusal: the run is finished; the viewer sends what it is told and shows
        # the server's error (sent straight, as a stale screen would send it).
        app._send("cancel", "run.cancel", {}, run_id)
        refused = await until(
            pilot, lambda: app.answers.get("cancel", {}).get("refused"), "a refusal"
        )
        assert "cancel" in refused or "finished" in refused or "cancelled" in refused, refused

    drive(server.state_dir, run_id, scenario)


def test_answer_a_checkpoint_through_the_form(
    server: WorkflowServer, client: WorkflowClient, project: Path
) -> None:
    run_id = start_run(client, project, "approval")
    wait_for(client, run_id, {"waiting"} | TERMINAL)

    async def scenario(app: PiwApp, pilot: Pilot[int]) -> None:
        await until(pilot, lambda: status(app) == "waiting", "the waiting checkpoint")
        await until(pilot, lambda: app.definition is not None, "the definition (its schema)")
        await click_control(app, pilot, "answer")
        form = await until(
            pilot, lambda: isinstance(app.screen, AnswerForm) and app.screen, "the answer form"
        )
        field = form.query_one("#answer-input", Input)
        field.value = '{"approved": "yes"}'
        await pilot.click("#answer-send")
        await until(
            pilot,
            lambda: "boolean" in text_of(form, "#answer-problem"),
            "the schema's objection",
        )
        assert "at /approved" in text_of(form, "#answer-problem")
        assert app.answers == {}, "an answer that breaks the schema is never sent"
        field.value = '{"approved": true}'
        field.focus()  # Enter in the field sends too (a button ignores a second press
        await pilot.press("enter")  # within its 0.2 s press effect)
        answer = await until(pilot, lambda: app.answers.get("answer"), "the answer's receipt")
        assert answer["outcome"] == "accepted", answer
        await until(pilot, lambda: status(app) == "completed", "the answered run")
        # Answered twice: the server refuses, and the viewer shows its error.
        app._send("answer", "run.answer", {"answer": {"approved": True}}, run_id)
        await until(pilot, lambda: "refused" in app.answers.get("answer", {}), "the refusal")

    drive(server.state_dir, run_id, scenario)


def test_a_3000_step_run_scrolls_through_its_pages(
    server: WorkflowServer, client: WorkflowClient, project: Path
) -> None:
    run_id = start_run(client, project, "loop")
    done = wait_for(client, run_id, TERMINAL)
    assert done["display"]["status"] == "completed", done["display"]
    count = done["trace"]["count"]
    assert count == STEPS + 1

    async def scenario(app: PiwApp, pilot: Pilot[int]) -> None:
        inspector = app.query_one(Inspector)
        window = await until(pilot, lambda: inspector.window, "the newest window")
        assert window.live and window.first + len(window.items) == count
        assert window.older is not None
        seen = len(window.items)
        pages = 0
        while inspector.window is not None and inspector.window.first > 0:
            before = inspector.window.first
            await pilot.press("o")
            await until(
                pilot,
                lambda: inspector.window is not None and inspector.window.first < before,  # noqa: B023
                "an older window",
            )
            pages += 1
            seen += len(inspector.window.items)
            table: DataTable[str] = inspector.steps_table
            assert table.row_count == len(inspector.window.items), "one window at a time"
            assert table.row_count <= 256
        assert inspector.window is not None and inspector.window.first == 0
        assert seen >= count and pages >= 10
        first_row = inspector.steps_table.get_row_at(0)
        assert first_row[0] == "1" and first_row[1] == "step"
        await pilot.press("n")
        await until(
            pilot, lambda: inspector.window and inspector.window.first > 0, "a newer window"
        )
        # The replay track never looks live.
        await pilot.press("L")
        await pilot.press("left_square_bracket")
        await until(pilot, lambda: app.replay_attempt is not None, "a replayed step")
        assert "REPLAY" in text_of(app, "#timeline") and "LIVE" not in text_of(app, "#timeline")
        replayed = app.replay_attempt
        await pilot.press("left_square_bracket")
        await until(pilot, lambda: app.replay_attempt != replayed, "the previous step")
        await pilot.press("right_square_bracket")
        await until(pilot, lambda: app.replay_attempt == replayed, "the next step")
        await pilot.press("L", "space")  # play from the window's first step at 1×, 2×, …
        await until(pilot, lambda: app.speed == 1 and "▶ 1×" in text_of(app, "#timeline"), "1×")
        for speed in (2, 5, 10):
            await pilot.press("space")
            await until(pilot, lambda: app.speed == speed, f"{speed}×")  # noqa: B023
        await pilot.press("space")
        await until(pilot, lambda: app.speed is None, "stopped")
        await pilot.press("L")
        await until(pilot, lambda: app.replay_attempt is None, "live again")
        assert "LIVE" in text_of(app, "#timeline")

    drive(server.state_dir, run_id, scenario)


def test_a_missing_run_is_said_plainly(server: WorkflowServer) -> None:
    async def scenario(app: PiwApp, pilot: Pilot[int]) -> None:
        await until(
            pilot, lambda: "no run 'run-nope'" in text_of(app, "#connection"), "the message"
        )
        assert app.view is None

    drive(server.state_dir, "run-nope", scenario)


def test_a_lost_server_shows_reconnecting_then_current_again(
    server: WorkflowServer, client: WorkflowClient, project: Path
) -> None:
    run_id = start_run(client, project, "hello")
    wait_for(client, run_id, TERMINAL)
    client.close()
    restarted: list[WorkflowServer] = []

    async def scenario(app: PiwApp, pilot: Pilot[int]) -> None:
        await until(pilot, lambda: status(app) == "completed", "the run's view")
        assert "LIVE" in text_of(app, "#timeline")
        await asyncio.to_thread(server.stop, "the test stops it")
        await until(pilot, lambda: app.connection == "reconnecting", "reconnecting")
        assert "not current" in text_of(app, "#connection")
        assert "RECONNECTING" in text_of(app, "#timeline")
        assert "LIVE" not in text_of(app, "#timeline")
        again = WorkflowServer(
            server.state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=True,
            units=perform_with_calls,
        )  # fmt: skip
        restarted.append(again)
        await asyncio.to_thread(again.start)
        await until(pilot, lambda: app.connection == "connected", "connected again")
        await until(pilot, lambda: "LIVE" in text_of(app, "#timeline"), "current again")
        assert status(app) == "completed"

    try:
        drive(server.state_dir, run_id, scenario)
    finally:
        for again in restarted:
            again.stop("test teardown")


def test_the_theme_picker_previews_and_saves(
    server: WorkflowServer, monkeypatch: pytest.MonkeyPatch, short_tmp: Path
) -> None:
    config = short_tmp / "config" / "piw" / "config.toml"
    monkeypatch.setenv("PIW_CONFIG_PATH", str(config))
    monkeypatch.delenv("PIW_THEME", raising=False)

    async def scenario(app: PiwApp, pilot: Pilot[int]) -> None:
        assert app.theme == "textual-dark"
        await pilot.press("comma")
        await until(pilot, lambda: app.screen.query("#themes"), "the picker")
        await pilot.press("down")
        await until(pilot, lambda: app.theme == "textual-light", "the preview")
        await pilot.press("escape")
        await until(pilot, lambda: app.theme == "textual-dark", "the theme restored")
        assert not config.exists()
        await pilot.press("comma")
        await until(pilot, lambda: app.screen.query("#themes"), "the picker")
        await pilot.press("down", "down", "enter")
        await until(pilot, config.exists, "the saved choice")
        assert app.theme == "nord"

    drive(server.state_dir, None, scenario)
    assert config.read_text() == 'theme = "nord"\n'
    assert oct(config.parent.stat().st_mode & 0o777) == "0o700"
    from pi_workflows.viewer._config import load_theme  # noqa: PLC0415

    assert load_theme() == "nord"
    monkeypatch.setenv("PIW_THEME", "dracula")
    assert load_theme() == "dracula"


def test_answer_a_protected_decision_through_the_form(
    server: WorkflowServer, client: WorkflowClient, project: Path
) -> None:
    from tests.server.test_human_decisions import SHIP_NOW  # noqa: PLC0415

    write_workflow(project, "ship", SHIP_NOW)
    run_id = start_run(client, project, "ship", {"version": "1.0"})
    wait_for(client, run_id, {"waiting"} | TERMINAL)

    async def scenario(app: PiwApp, pilot: Pilot[int]) -> None:
        await until(pilot, lambda: "human-answer" in controls(app), "the decision's control")
        assert "Ship version 1.0?" in str(app.view and app.view["display"].get("question"))
        await pilot.press("a")
        form = await until(
            pilot, lambda: isinstance(app.screen, AnswerForm) and app.screen, "the answer form"
        )
        field = form.query_one("#answer-input", Input)
        assert field.value == '{"choice": "approve"}', "the first choice is offered"
        field.value = '{"choice": "maybe"}'
        await pilot.press("enter")
        await until(pilot, lambda: "/choice" in text_of(form, "#answer-problem"), "the objection")
        assert app.answers == {}
        field.value = '{"choice": "approve"}'
        await pilot.press("enter")
        answer = await until(pilot, lambda: app.answers.get("human-answer"), "the receipt")
        assert answer["outcome"] == "accepted", answer
        await until(pilot, lambda: status(app) == "completed", "the decided run")

    drive(server.state_dir, run_id, scenario)


def test_clear_stops_the_sessions_view_retaining_its_finished_run_and_nothing_else(
    server: WorkflowServer, client: WorkflowClient, project: Path
) -> None:
    """`piw --session SESSION_ID RUN_ID` (what `/piw` opens): Clear is offered for the
    session's finished run and sends `sessionView.clearTerminal`; the run is unchanged.
    An interactive run parks at its agent step without a pi; cancelled, its pending
    terminal message keeps it retained in the session's view."""
    run_id = start(client, project, "ask", SESSION)["receipt"]["runId"]
    wait_for(client, run_id, {"waiting"})
    # Parked, its runner exits by itself; once it has, nothing else moves the run.
    epochs = "SELECT status FROM runner_epochs WHERE run_id = ?"
    poll(lambda: rows(server.state_dir, epochs, run_id) == [("exited",)], "the runner's exit")
    client.call("run.cancel", {"reason": "test"}, run_id=run_id)
    wait_for(client, run_id, TERMINAL)
    watcher = Watcher(server.socket_path)
    try:
        watcher.subscribe({"kind": "sessionView", "sessionId": SESSION})
        shown = session_snapshot(watcher, lambda v: v["activeRun"] is not None, "the run")
        assert shown["activeRun"]["runId"] == run_id
        state = "SELECT status, revision FROM runs WHERE run_id = ?"
        before = rows(server.state_dir, state, run_id)

        async def without_session(app: PiwApp, pilot: Pilot[int]) -> None:
            await until(pilot, lambda: status(app) == "cancelled", "the cancelled run")
            bar = app.query_one(ControlsBar)
            await until(pilot, lambda: bar.controls == tuple(controls(app)), "the controls bar")
            assert not app.query("#control-clear"), "no session given: nothing to clear"
            await pilot.press("d")
            await pilot.pause(0.2)
            assert "clear" not in app.answers

        drive(server.state_dir, run_id, without_session)

        async def with_session(app: PiwApp, pilot: Pilot[int]) -> None:
            await until(pilot, lambda: status(app) == "cancelled", "the cancelled run")
            await click_control(app, pilot, "clear")
            answer = await until(pilot, lambda: app.answers.get("clear"), "the clear answer")
            assert answer["outcome"] == "accepted", answer
            assert answer["receipt"] == {"clearedRunId": run_id}
            assert SESSION not in text_of(app, "#connection")
            app.answers.pop("clear")
            await pilot.press("d")  # again: the server says nothing is retained
            again = await until(pilot, lambda: app.answers.get("clear"), "the second answer")
            assert again["receipt"] == {"clearedRunId": None}, again
            assert status(app) == "cancelled"

        drive(server.state_dir, run_id, with_session, session_id=SESSION)
        gone = session_snapshot(watcher, lambda v: v["activeRun"] is None, "no retained run")
        assert gone["revision"] > shown["revision"]
    finally:
        watcher.close()
    # No workflow state changed: the run's status and its event revision are as they
    # were (only its view moved: the view shows the binding).
    assert rows(server.state_dir, state, run_id) == before
    assert before[0][0] == "cancelled"


def test_controls_are_exactly_the_views_and_unknown_ones_show_as_text() -> None:
    from textual.app import App  # noqa: PLC0415

    from pi_workflows.viewer._controls import ControlsBar, answer_problem, recover_words  # noqa: PLC0415

    class Bar(App[None]):
        def compose(self) -> Any:
            yield ControlsBar(id="bar")

    async def main() -> None:
        app = Bar()
        async with app.run_test() as pilot:
            bar = app.query_one(ControlsBar)
            bar.show(["pause", "teleport", "cancel"])
            await until(pilot, lambda: len(bar.children) == 3, "three controls")
            kinds = [(type(child).__name__, child.id) for child in bar.children]
            assert kinds == [
                ("Button", "control-pause"),
                ("Static", None),
                ("Button", "control-cancel"),
            ]
            assert "teleport" in str(bar.children[1].render())
            bar.show([])
            await until(pilot, lambda: not bar.query(Button), "no buttons")
            assert "no controls" in str(bar.children[0].render())

    asyncio.run(main())
    schema = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}
    assert answer_problem({"n": 1}, schema) is None
    assert answer_problem({"n": "1"}, schema) == "at /n: '1' is not of type 'integer'"
    assert answer_problem("x", None) is None
    effect = {"effectId": "e1", "effectType": "http.post", "nodePath": "send"}
    words, fields = recover_words("recoverRetry", {"ambiguousEffects": [effect]})
    assert "http.post at node send" in words and "duplicate" in words and fields == {}
    words, _ = recover_words("recoverConfirm", {"ambiguousEffects": [effect, effect]})
    assert "as applied" in words
