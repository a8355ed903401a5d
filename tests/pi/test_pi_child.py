"""The real `pi --mode rpc` against the fake provider: launch, RPC, the bridge, stopping.

Every test here starts the npm-installed pi (issue 12 § Headless Pi children and § The
bridge extension) with the argv and environment `PiLaunch` builds, in its own group,
and drives it through `PiChild`. Processes are checked through /proc after each stop.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

from pi_workflows.engine._pi_child import (
    PiChild,
    PiExited,
    PiOptions,
    PiRpcError,
    PiTimeout,
    tool_texts,
)
from pi_workflows.supervision import identity_of, is_alive
from pi_workflows.testing import (
    FAKE_API_KEY,
    FakeProvider,
    ProviderError,
    Stall,
    bash_turn,
    text_turn,
    workflow_submit_turn,
    workflow_update_turn,
)
from tests.pi.conftest import OUTPUT_SCHEMA, PiHarness

TURN_TIMEOUT = 60.0
T = TypeVar("T")


def group_alive(pgid: int) -> list[int]:
    """PIDs of live (non-zombie) processes in process group `pgid`."""
    alive = []
    for process in psutil.process_iter(["status"]):
        try:
            if os.getpgid(process.pid) == pgid and process.info["status"] != "zombie":
                alive.append(process.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return alive


def sleeps_below(pid: int) -> list[psutil.Process] | None:
    """pi's descendants once both `sleep`s of the bash tool run, else None."""
    tools = psutil.Process(pid).children(recursive=True)
    names = [p.name() for p in tools]
    return tools if names.count("sleep") == 2 else None


def wait_for(probe: Callable[[], T | None], timeout: float) -> T:
    """Poll `probe` until it returns a value (a condition in /proc has no event to wait on)."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while (value := probe()) is None:
        assert time.monotonic() < deadline, "the condition never held"
        pause.wait(0.02)
    return value


def proc_environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def test_pi_starts_isolated_with_the_built_env_group_and_cwd(harness: PiHarness) -> None:
    launch = harness.launch()
    harness.provider.script(text_turn("ok"))
    child = harness.spawn(launch)

    # pi sets process.title, which overwrites /proc/PID/cmdline; the argv is checked in
    # test_pi_launch.py and its effects here and below.
    assert proc_environ(child.pid) == dict(launch.env)
    assert os.getpgid(child.pid) == child.pid and os.getsid(child.pid) == child.pid
    assert Path(f"/proc/{child.pid}/cwd").resolve() == harness.project.resolve()
    child.run_turn("hi", TURN_TIMEOUT)
    child.stop()
    # --no-session: no session files; the only file pi adds to the agent dir is auth.json.
    written = {p.relative_to(harness.agent_dir).as_posix() for p in harness.agent_dir.rglob("*")}
    assert written <= {"models.json", "settings.json", "auth.json"}
    assert list(harness.project.iterdir()) == []


def test_a_prompt_streams_the_scripted_text_to_agent_end(harness: PiHarness) -> None:
    harness.provider.script(text_turn("Hello from the fake model.", chunk_size=4))
    child = harness.spawn()
    events: list[dict[str, Any]] = []

    outcome = child.run_turn("Say hello", TURN_TIMEOUT, on_event=events.append)

    assert outcome.stop_reason == "stop" and outcome.error_message is None
    deltas = [
        e["assistantMessageEvent"]["delta"]
        for e in events
        if e["type"] == "message_update" and e["assistantMessageEvent"]["type"] == "text_delta"
    ]
    assert len(deltas) > 1 and "".join(deltas) == "Hello from the fake model."
    assert events[-1]["type"] == "agent_end" and not child.busy
    (request,) = harness.provider.chat_requests()
    assert request.body["stream"] is True and request.body["model"] == "fake-model"
    assert request.messages()[-1] == {
        "role": "user",
        "content": [{"type": "text", "text": "Say hello"}],
    }
    assert "workflow" in request.tool_names()


def test_project_extensions_and_context_files_are_not_loaded(harness: PiHarness) -> None:
    extensions = harness.project / ".pi" / "extensions"
    extensions.mkdir(parents=True)
    (extensions / "intruder.ts").write_text(
        'export default function (pi: any) { pi.registerTool({ name: "intruder", label: "x",'
        ' description: "x", parameters: { type: "object", properties: {} },'
        " async execute() { return { content: [], details: {} }; } }); }\n"
    )
    (harness.project / "AGENTS.md").write_text("CONTEXT-FILE-MARKER-7f1c\n")
    harness.provider.script(text_turn("ok"))
    child = harness.spawn()

    child.run_turn("hi", TURN_TIMEOUT)

    (request,) = harness.provider.chat_requests()
    assert "intruder" not in request.tool_names()
    assert "CONTEXT-FILE-MARKER-7f1c" not in json.dumps(request.body)


NO_SERVER = "The workflow bridge has no server socket configured."
"""What the bridge answers when its configuration names no server socket (here: the
harness). Acceptance through the real server: tests/pi/test_agent_steps.py and
tests/pi/test_bridge_typescript.py."""


def test_workflow_submit_reaches_the_bridge_with_the_steps_schema(harness: PiHarness) -> None:
    harness.provider.script(
        workflow_submit_turn("plan", "attempt-1", {"summary": "done"}, call_id="call_wf_1"),
        text_turn("no server, giving up"),
    )
    child = harness.spawn()

    outcome = child.run_turn("Do the plan step", TURN_TIMEOUT)

    (call,) = outcome.workflow_calls()
    assert call.args == {
        "action": "submit",
        "step": "plan",
        "attempt": "attempt-1",
        "output": {"summary": "done"},
    }
    # The call passed the step contract checks and reached the transport.
    assert call.is_error is True and tool_texts(call) == [NO_SERVER]
    first, _ = harness.provider.chat_requests()
    (tool,) = [t for t in first.body["tools"] if t["function"]["name"] == "workflow"]
    parameters = tool["function"]["parameters"]
    assert parameters["required"] == ["action"] and parameters["additionalProperties"] is False
    assert parameters["properties"]["output"]["required"] == OUTPUT_SCHEMA["required"]


def test_a_stale_attempt_is_an_error_the_model_sees_and_corrects(harness: PiHarness) -> None:
    harness.provider.script(
        workflow_submit_turn("plan", "attempt-0", {"summary": "old"}),
        workflow_submit_turn("plan", "attempt-1", {"summary": "new"}),
        text_turn("no server, giving up"),
    )
    child = harness.spawn()

    outcome = child.run_turn("Do the plan step", TURN_TIMEOUT)

    stale, fixed = outcome.workflow_calls()
    assert stale.is_error is True and "Stale attempt id" in tool_texts(stale)[0]
    assert tool_texts(fixed) == [NO_SERVER], "the corrected call got past the checks"
    _, second, _ = harness.provider.chat_requests()
    tool_messages = [m for m in second.messages() if m["role"] == "tool"]
    assert "Stale attempt id" in json.dumps(tool_messages)


def test_an_update_reaches_the_bridge_and_the_turn_goes_on(harness: PiHarness) -> None:
    update = {"type": "progress", "key": "main", "data": {"label": "halfway"}}
    harness.provider.script(workflow_update_turn("plan", "attempt-1", update), text_turn("ok"))
    child = harness.spawn()

    outcome = child.run_turn("Report progress", TURN_TIMEOUT)

    (call,) = outcome.workflow_calls()
    assert call.args["update"] == update and tool_texts(call) == [NO_SERVER]
    assert not call.result.get("terminate")
    assert outcome.stop_reason == "stop" and len(harness.provider.chat_requests()) == 2


def test_schema_invalid_arguments_never_reach_the_bridge(harness: PiHarness) -> None:
    harness.provider.script(
        workflow_submit_turn("plan", "attempt-1", {"wrong": 1}),
        text_turn("giving up"),
    )
    child = harness.spawn()

    outcome = child.run_turn("Do the plan step", TURN_TIMEOUT)

    (call,) = outcome.workflow_calls()
    assert call.is_error is True
    assert "Validation failed" in tool_texts(call)[0]
    assert NO_SERVER not in json.dumps(call.result)


def test_a_provider_error_ends_the_run_with_stop_reason_error(harness: PiHarness) -> None:
    harness.provider.script(ProviderError(500, "scripted boom"))
    child = harness.spawn()

    outcome = child.run_turn("hi", TURN_TIMEOUT)

    assert outcome.provider_error and outcome.stop_reason == "error"
    assert outcome.error_message is not None and "scripted boom" in outcome.error_message
    assert len(harness.provider.chat_requests()) == 1, "settings.json turns retries off"


def test_a_prompt_while_busy_is_refused(harness: PiHarness) -> None:
    harness.provider.script(Stall())
    child = harness.spawn()
    child.command({"type": "prompt", "message": "first"}, TURN_TIMEOUT)
    harness.provider.wait_for_requests(1, TURN_TIMEOUT)

    with pytest.raises(PiRpcError, match="already processing"):
        child.run_turn("second", TURN_TIMEOUT)


# -- stopping --------------------------------------------------------------------------


def test_stop_when_idle_closes_stdin_and_pi_exits_0(harness: PiHarness) -> None:
    child = harness.spawn()

    report = child.stop()

    assert (report.how, report.returncode, report.aborted) == ("eof", 0, False)
    assert group_alive(child.pid) == []
    assert child.stop() is report, "stop is idempotent"


def test_stop_mid_stream_aborts_the_run_then_closes_stdin(harness: PiHarness) -> None:
    harness.provider.script(Stall("thinking about it"))
    child = harness.spawn()
    child.command({"type": "prompt", "message": "go"}, TURN_TIMEOUT)
    harness.provider.wait_for_requests(1, TURN_TIMEOUT)
    assert child.busy

    report = child.stop()

    assert report.aborted and report.how == "eof" and report.returncode == 0
    assert group_alive(child.pid) == []


def test_stop_mid_bash_tool_leaves_no_tool_process(harness: PiHarness) -> None:
    harness.provider.script(bash_turn("sleep 300 & echo started; sleep 301"))
    child = harness.spawn()
    child.command({"type": "prompt", "message": "run it"}, TURN_TIMEOUT)
    while True:
        event = child.next_event(TURN_TIMEOUT)
        if event["type"] == "tool_execution_update" and "started" in json.dumps(event):
            break
    # "started" can arrive before the forked sleeps have exec'd: wait until both run.
    tools = wait_for(lambda: sleeps_below(child.pid), TURN_TIMEOUT)
    identities = [identity_of(p.pid) for p in tools]
    # (pi itself is below its keeper, `child.pid`, in the keeper's group.)
    tool_groups = {os.getpgid(p.pid) for p in tools if p.name() == "sleep"}
    assert child.pid not in tool_groups, "pi's bash tool runs in a session of its own"

    report = child.stop()

    assert report.aborted
    assert not any(identity is not None and is_alive(identity) for identity in identities)
    for group in (child.pid, *tool_groups):
        assert group_alive(group) == []


def test_nothing_logged_holds_the_prompt_or_the_key(
    harness: PiHarness, provider: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "PROMPT-SECRET-4b1d"
    provider.script(text_turn("ok"), ProviderError(400, "bad request"))
    caplog.set_level(logging.DEBUG)
    launch = harness.launch(options=PiOptions(provider="fake", model="fake-model"))
    child = harness.spawn(launch)

    child.run_turn(f"{secret} do it", TURN_TIMEOUT)
    failed = child.run_turn(f"{secret} again", TURN_TIMEOUT)
    report = child.stop()

    assert secret in json.dumps(provider.chat_requests()[0].body), "the prompt did reach pi"
    texts = [
        harness.stderr_path.read_text() if harness.stderr_path.exists() else "",
        repr(launch),
        repr(report),
        repr(failed),
        *(record.getMessage() for record in caplog.records),
    ]
    for text in texts:
        assert secret not in text and FAKE_API_KEY not in text
    assert FAKE_API_KEY not in json.dumps(dict(launch.env)), "credentials stay in the agent dir"


def test_an_unconfigured_bridge_still_loads_and_refuses_calls(harness: PiHarness) -> None:
    launch = harness.launch()
    bare = type(launch)(
        launch.argv,
        {k: v for k, v in launch.env.items() if k != "PI_WORKFLOWS_BRIDGE_CONFIG"},
        launch.cwd,
        launch.stderr_path,
    )
    harness.provider.script(
        workflow_submit_turn("plan", "attempt-1", {"summary": "x"}), text_turn("ok")
    )
    child: PiChild = harness.spawn(bare)

    outcome = child.run_turn("go", TURN_TIMEOUT)

    (call,) = outcome.workflow_calls()
    assert call.is_error is True and "No workflow step is pending" in tool_texts(call)[0]


def test_a_run_past_its_time_raises_pi_timeout_and_pi_can_still_be_stopped(
    harness: PiHarness,
) -> None:
    harness.provider.script(Stall())
    child = harness.spawn()

    with pytest.raises(PiTimeout):
        child.run_turn("go", 1.0)

    assert child.busy
    report = child.stop()
    assert report.aborted and group_alive(child.pid) == []


def test_a_stop_from_another_thread_ends_a_waiting_run(harness: PiHarness) -> None:
    harness.provider.script(Stall())
    child = harness.spawn()
    ended: list[str] = []

    def run() -> None:
        try:
            ended.append(child.run_turn("go", TURN_TIMEOUT).stop_reason)
        except PiExited:
            ended.append("exited")

    runner = threading.Thread(target=run)
    runner.start()
    harness.provider.wait_for_requests(1, TURN_TIMEOUT)
    child.stop()
    runner.join(TURN_TIMEOUT)

    assert not runner.is_alive() and ended in (["aborted"], ["exited"])


def test_a_bridge_that_fails_to_load_makes_pi_exit_before_it_is_ready(
    harness: PiHarness,
) -> None:
    broken = harness.root / "broken-bridge.ts"
    broken.write_text("export default function (pi: any) { throw new Error('no'); }\n")
    launch = harness.launch()
    argv = list(launch.argv)
    argv[argv.index("-e") + 1] = str(broken)
    child = PiChild.spawn(type(launch)(tuple(argv), launch.env, launch.cwd, launch.stderr_path))
    harness.children.append(child)

    with pytest.raises(PiExited) as caught:
        child.wait_ready(TURN_TIMEOUT)

    assert caught.value.returncode == 1
    assert "Failed to load extension" in harness.stderr_path.read_text()
