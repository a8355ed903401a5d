"""The two ways out for a run whose origin Pi session cannot come back (issue 24, item 1),
through real processes: `/workflow adopt RUN_ID` in another real `pi` with the
extension (its confirmation dialog answered over RPC), and `pi-workflows run resume
RUN_ID --headless` as a real CLI process, after which a headless pi child runs the step.

In both, the step is presented once, the (fake) model submits, and the run completes;
the refused cases end in one clear error and change nothing.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.testing import FakeProvider, ScriptedTurn, text_turn, workflow_submit_turn
from tests.conftest import Processes, write_workflow
from tests.pi.agents import running_server
from tests.pi.origin_pi import (
    OriginPi,
    OriginRig,
    is_workflow_message,
    origin_rig,
    origin_server,
    wait_until,
)
from tests.server.runs import TERMINAL, wait_for

pytestmark = pytest.mark.timeout(240)
__all__ = ["origin_rig", "origin_server"]

DIGEST = """
import time
from pathlib import Path

from pi_workflows import agent, compute, define_workflow


def gather(ctx):
    gate = Path(ctx.input["gate"])
    while not gate.exists():  # the test opens the gate once Pi is gone
        time.sleep(0.02)
    return {"items": 3}


workflow = define_workflow(
    name="digest",
    start_at="gather",
    nodes={
        "gather": compute(gather),
        "summarise": agent(
            prompt=lambda ctx: f"Summarise the {ctx.outputs['gather']['items']} items",
            output_schema={"type": "object", "properties": {"summary": {"type": "string"}},
                           "required": ["summary"]},
            timeout=600,
        ),
    },
    edges=[{"from": "gather", "to": "summarise"}],
)
"""
PROMPT = "Summarise the 3 items"
ATTEMPT = re.compile(r"step: summarise, attempt: (attempt-[0-9a-f]+)\)")
STARTED = re.compile(r"^Started workflow digest: (run-[0-9a-f]+)$", re.M)


def submit(body: Mapping[str, Any]) -> ScriptedTurn:
    found = ATTEMPT.search(json.dumps(body.get("messages")))
    assert found is not None, "the step prompt carries its contract"
    return workflow_submit_turn("summarise", found.group(1), {"summary": "three items"})


def prompted(provider: FakeProvider) -> int:
    """How many model requests carried the step's prompt as their newest message."""
    return sum(
        1
        for request in provider.chat_requests()
        if PROMPT in json.dumps((request.body.get("messages") or [{}])[-1])
    )


# --- /workflow adopt in another real pi ---------------------------------------------------


def _ui_request(origin: OriginPi, method: str, since: int) -> dict[str, Any]:
    return origin.wait_event(
        lambda e: e.get("type") == "extension_ui_request" and e.get("method") == method,
        f"a {method} request",
        since=since,
    )


def _adopt(origin: OriginPi, run_id: str, *, confirm: bool) -> tuple[dict[str, Any], str]:
    """Type `/workflow adopt RUN_ID`, answer its dialog; (the dialog, the notice)."""
    mark = len(origin.events)
    command = origin.child.send({"type": "prompt", "message": f"/workflow adopt {run_id}"})
    dialog = _ui_request(origin, "confirm", mark)
    origin.child.answer_ui(str(dialog["id"]), {"confirmed": confirm})
    notice = _ui_request(origin, "notify", mark)
    assert origin.child.wait_response(command, 60).get("success")
    return dialog, str(notice["message"])


@pytest.fixture
def stranded(origin_rig: OriginRig, origin_server: WorkflowServer) -> Iterator[tuple[str, Path]]:
    """A run started in Pi A (on its own session file), whose Pi then ended for good;
    the run waits at its agent step for A's session. (run ID, A's session file)."""
    write_workflow(origin_rig.project, "digest", DIGEST)
    gate = origin_rig.root / "gate"
    session_a = origin_rig.root / "sessions" / "a.jsonl"
    first = origin_rig.spawn(session_a)
    found = STARTED.search(first.notice(f'/workflow start digest {{"gate": "{gate}"}}'))
    assert found is not None
    run_id = found.group(1)
    first.child.stop()
    gate.touch()
    wait_until(lambda: origin_rig.status(run_id) == "waiting", "the run to wait at its step")
    assert [m[3] for m in origin_rig.messages(run_id)] == ["pending"]
    yield run_id, session_a


def test_another_pi_adopts_the_run_after_a_confirmation_and_its_step_completes_there(
    origin_rig: OriginRig, stranded: tuple[str, Path]
) -> None:
    run_id, _ = stranded
    origin_rig.provider.script(submit, text_turn("Done: three items."))
    session_b = origin_rig.root / "sessions" / "b.jsonl"
    second = origin_rig.spawn(session_b)  # a fresh session: saved before it adopts
    dialog, notice = _adopt(second, run_id, confirm=True)
    assert run_id in dialog["title"]
    assert "digest" in dialog["message"] and "at step summarise" in dialog["message"]
    first_line, reopen = notice.splitlines()
    assert first_line == f"Adopted {run_id}: its step summarise is presented in this session."
    assert reopen == f"If Pi exits, reopen this session with: pi --session {session_b}"
    # B's session is on disk and is now the run's origin session.
    header = json.loads(session_b.read_text().splitlines()[0])
    assert origin_rig.origin_session(run_id) == header["id"]
    wait_until(lambda: origin_rig.status(run_id) == "completed", "the run to complete", 120)
    messages = wait_until(
        lambda: (
            [m for m in origin_rig.messages(run_id) if m[1] == "terminal" and m[3] == "sent"]
            and origin_rig.messages(run_id)
        ),
        "the terminal message in B",
    )
    assert [(kind, state) for _, kind, _, state, _ in messages] == [
        ("step", "sent"),
        ("terminal", "sent"),
    ], "the step was presented once, in B"
    second.drain()
    shown = [e["message"]["details"]["messageId"] for e in second.events if is_workflow_message(e)]
    assert shown[0] == messages[0][0] and shown.count(messages[0][0]) == 1
    assert prompted(origin_rig.provider) == 1


def test_adopt_is_refused_while_the_run_is_open_in_its_own_pi_and_a_no_changes_nothing(
    origin_rig: OriginRig, origin_server: WorkflowServer
) -> None:
    write_workflow(origin_rig.project, "digest", DIGEST)
    gate = origin_rig.root / "gate"
    first = origin_rig.spawn(origin_rig.root / "sessions" / "a.jsonl")
    found = STARTED.search(first.notice(f'/workflow start digest {{"gate": "{gate}"}}'))
    assert found is not None
    run_id = found.group(1)
    origin = origin_rig.origin_session(run_id)
    second = origin_rig.spawn(origin_rig.root / "sessions" / "b.jsonl")
    _, declined = _adopt(second, run_id, confirm=False)
    assert declined == f"Not adopted: {run_id} is unchanged."
    _, refused = _adopt(second, run_id, confirm=True)  # A is open: its coordinator holds it
    assert "originSessionOpen" in refused and "close that Pi" in refused, refused
    assert origin_rig.origin_session(run_id) == origin, "nothing moved"
    usage = second.notice("/workflow adopt")
    assert usage == "Name the run to adopt: /workflow adopt RUN_ID (see /workflow list)."


# --- pi-workflows run resume RUN_ID --headless -------------------------------------------


@pytest.fixture
def headless_server(
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    pi_binary: Path,
    provider: FakeProvider,
    pi_slot: None,
) -> Iterator[WorkflowServer]:
    # The server's agent folder (the state dir's parent) is the one its pi children get.
    provider.write_agent_dir(state_dir.parent)
    monkeypatch.setenv("PI_WORKFLOWS_PI", str(pi_binary))
    with running_server(state_dir) as instance:
        yield instance


def _rows(state_dir: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{state_dir / 'state.sqlite'}?mode=ro", uri=True)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def test_run_resume_headless_runs_the_stranded_step_in_a_headless_pi_child(
    headless_server: WorkflowServer,
    provider: FakeProvider,
    processes: Processes,
    short_tmp: Path,
) -> None:
    state_dir = Path(headless_server.state_dir)
    project = short_tmp / "project"
    write_workflow(project, "digest", DIGEST)
    gate = short_tmp / "gate"
    gate.touch()
    provider.script(submit)
    with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
        # Started from a Pi session that never comes back.
        started = client.call(
            "run.start",
            {
                "workflow": "digest",
                "input": {"gate": str(gate)},
                "projectPath": str(project),
                "originSessionId": "pi-session-gone",
            },
        )
        run_id = started["receipt"]["runId"]
        wait_for(client, run_id, {"waiting"})
        assert provider.chat_requests() == [], "nothing runs the step yet"

        resumed = processes.cli(state_dir, "run", "resume", run_id, "--headless")
        assert resumed.returncode == 0, resumed.stderr
        assert resumed.stdout == f"{run_id}\n", "the run ID alone, for the next command"
        done = wait_for(client, run_id, TERMINAL | {"ambiguous"})
        assert done["display"]["status"] == "completed", done

        again = processes.cli(state_dir, "run", "resume", run_id, "--headless")
        assert again.returncode == 1
        assert again.stderr == (
            f"pi-workflows: rejected: run {run_id} is completed: there is nothing to hand over\n"
        )
        # A headless run (its first node never ends here) has no Pi session to leave.
        closed = {"gate": str(short_tmp / "never")}
        headless = client.call(
            "run.start", {"workflow": "digest", "input": closed, "projectPath": str(project)}
        )["receipt"]["runId"]
        refused = processes.cli(state_dir, "run", "resume", headless, "--headless")
        client.call("run.cancel", run_id=headless)
    assert refused.returncode == 1
    assert refused.stderr == (
        f"pi-workflows: rejected: run {headless} is headless: it has no origin Pi session to "
        "hand over\n"
    )
    assert _rows(
        state_dir,
        "SELECT execution_mode, origin_session_id, reserved FROM run_bindings WHERE run_id = ?",
        run_id,
    ) == [("headless", None, 0)]
    assert _rows(
        state_dir, "SELECT kind, state FROM workflow_messages WHERE run_id = ?", run_id
    ) == [("step", "cancelled")], "the lost session never got the step"
    assert _rows(
        state_dir,
        "SELECT count(*) FROM interactive_submissions s JOIN interactive_requests r "
        "ON r.request_id = s.request_id WHERE r.run_id = ? AND s.outcome = 'accepted'",
        run_id,
    ) == [(1,)]
    assert prompted(provider) == 1, "the headless pi child got the step once"
