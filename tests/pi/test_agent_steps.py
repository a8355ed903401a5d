"""Agent steps through a real server and runner (issue 12, the slice built so far).

With `PI_WORKFLOWS_PI` naming a missing file, the step fails `piUnavailable` before any
request exists, the run view says why, and `$result.outcome` routes the failure.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import psutil
import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.engine.runner import RUNNER_PROCESS_NAME
from pi_workflows.engine.validate import VALIDATOR_PROCESS_NAME
from pi_workflows.testing import (
    FakeProvider,
    ProviderError,
    ScriptedTurn,
    Stall,
    bash_turn,
    text_turn,
    workflow_submit_turn,
)
from tests.conftest import write_workflow
from tests.pi.agents import alive as _alive
from tests.pi.agents import attempt_of as _attempt_of
from tests.pi.agents import running_server
from tests.server.runs import TERMINAL, start_run, wait_for

pytestmark = pytest.mark.timeout(120)

ONE_AGENT = """
from pi_workflows import agent, compute, define_workflow

workflow = define_workflow(
    name="ask",
    start_at="ask",
    nodes={
        "ask": agent(prompt="Say hi", output_schema={"type": "object"}),
        "fallback": compute(lambda ctx: {"routed": "failed"}),
    },
    edges=[{"from": "ask", "switch": {"on": "$result.outcome",
                                      "cases": {"failed": "fallback"}}}],
)
"""


@pytest.fixture
def server_without_pi(
    state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[WorkflowServer]:
    # Set before the server (and its zygote) start: runners inherit the environment.
    monkeypatch.setenv("PI_WORKFLOWS_PI", str(tmp_path / "no-such-pi"))
    with running_server(state_dir) as instance:
        yield instance


def test_a_missing_pi_fails_the_step_with_pi_unavailable_and_routes_it(
    server_without_pi: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "ask", ONE_AGENT)
    with WorkflowClient(server_without_pi.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "ask")
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
    assert view["display"]["status"] == "completed", view
    (database,) = Path(server_without_pi.state_dir).rglob("*.sqlite")
    with sqlite3.connect(database) as conn:
        rows = conn.execute(
            "SELECT status, error FROM node_attempts WHERE run_id = ? AND node_path = 'ask'",
            (run_id,),
        ).fetchall()
        requests = conn.execute("SELECT count(*) FROM interactive_requests").fetchone()[0]
    assert [status for status, _ in rows] == ["failed"]
    assert "PI_WORKFLOWS_PI" in rows[0][1], rows
    assert requests == 0, "pi is resolved before any request is proposed"


ONLY_AGENT = """
from pi_workflows import agent, define_workflow

workflow = define_workflow(
    name="ask",
    start_at="ask",
    nodes={"ask": agent(prompt="Say hi", output_schema={"type": "object"})},
    edges=[],
)
"""


def test_a_missing_pi_with_no_route_fails_the_run_and_its_view_says_why(
    server_without_pi: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "ask", ONLY_AGENT)
    with WorkflowClient(server_without_pi.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "ask")
        wait_for(client, run_id, TERMINAL | {"ambiguous"})
        view = client.call("run.get", run_id=run_id)["receipt"]
    assert view["display"]["status"] == "failed", view
    reason = view.get("failureReason") or ""
    assert "piUnavailable" in reason and "PI_WORKFLOWS_PI" in reason, view
    assert str(short_tmp) not in reason, "the reason names no user path"


@pytest.fixture
def server_with_a_pi_that_exists(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[WorkflowServer]:
    # A file that exists: the step gets past `piUnavailable` and proposes its request.
    monkeypatch.setenv("PI_WORKFLOWS_PI", "/bin/true")
    with running_server(state_dir) as instance:
        yield instance


def test_a_proposed_request_is_committed_and_the_server_stays_up(
    server_with_a_pi_that_exists: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "ask", ONE_AGENT)
    with WorkflowClient(server_with_a_pi_that_exists.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "ask")
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
        status = client.call("server.status")
    assert view["display"]["status"] == "completed", view  # the failure routed to fallback
    assert status["outcome"] == "accepted", "the commit of interaction.requested kept it up"
    (database,) = Path(server_with_a_pi_that_exists.state_dir).rglob("*.sqlite")
    with sqlite3.connect(database) as conn:
        requests = conn.execute(
            "SELECT count(*) FROM interactive_requests WHERE run_id = ?", (run_id,)
        ).fetchone()[0]
    assert requests == 1


# --- the real pi, against the fake provider ---------------------------------------------

SUBMITTING_AGENT = """
from pi_workflows import agent, define_workflow

workflow = define_workflow(
    name="ask",
    start_at="ask",
    nodes={
        "ask": agent(
            prompt=lambda ctx: "Summarise the work",
            output_schema={"type": "object", "properties": {"summary": {"type": "string"}},
                           "required": ["summary"]},
            tools=["bash"],
            provider="fake",
            model="fake-model",
            timeout=120,
        ),
    },
    edges=[],
)
"""

SLEEPS = ("sleep 3001", "sleep 3002")


def _tree_of_pi(project: Path) -> list[tuple[psutil.Process, str]]:
    """The pi child serving `project` (and its keeper), every process below it, and the
    SLEEPS; each with its command line. The runner and a validation child work in the
    project too, but they are not pi's tree: they exit after the run's last commit."""
    found: list[tuple[psutil.Process, str]] = []
    for process in psutil.process_iter(["cmdline", "cwd", "name"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if process.info["name"] in (RUNNER_PROCESS_NAME, VALIDATOR_PROCESS_NAME):
            continue
        if process.info["cwd"] == str(project) and cmdline not in SLEEPS:  # pi (it retitles)
            found.append((process, cmdline))
            with contextlib.suppress(psutil.Error):
                found.extend((child, "") for child in process.children(recursive=True))
        elif cmdline in SLEEPS:
            found.append((process, cmdline))
    return found


@pytest.fixture
def server_with_pi(
    state_dir: Path,
    tmp_path: Path,
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


def test_a_submitting_model_completes_the_run_and_no_process_of_pis_tree_is_left(
    server_with_pi: WorkflowServer, provider: FakeProvider, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "ask", SUBMITTING_AGENT)
    seen: list[tuple[psutil.Process, str]] = []

    def submit(body: Mapping[str, Any]) -> ScriptedTurn:
        # The bash call's sleeps are running (one in a session of its own): note them.
        seen.extend(_tree_of_pi(project))
        return workflow_submit_turn("ask", _attempt_of(body), {"summary": "done"})

    provider.script(
        lambda body: bash_turn(f"{SLEEPS[0]} & setsid {SLEEPS[1]} & echo {_attempt_of(body)}"),
        submit,
    )
    with WorkflowClient(server_with_pi.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "ask")
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
    logs = [
        log.read_text()[-2000:] for log in Path(server_with_pi.state_dir).rglob("pi.stderr.log")
    ]
    assert view["display"]["status"] == "completed", (view, logs)
    (database,) = Path(server_with_pi.state_dir).rglob("*.sqlite")
    with sqlite3.connect(database) as conn:
        (output,) = conn.execute(
            "SELECT b.content FROM node_attempts a JOIN blobs b ON b.digest = a.output_hash"
            " WHERE a.run_id = ? AND a.node_path = 'ask'",
            (run_id,),
        ).fetchone()
    assert json.loads(output) == {"summary": "done"}
    commands = [cmdline for _, cmdline in seen]
    assert len(commands) > len(SLEEPS), f"pi was seen running: {commands}"
    assert sorted(c for c in commands if c in SLEEPS) == sorted(SLEEPS), commands
    left = [process.pid for process, _ in seen if _alive(process)]
    assert left == [], f"processes of pi's tree outlived the step: {left}"


def _database(server: WorkflowServer) -> Path:
    (database,) = Path(server.state_dir).rglob("*.sqlite")
    return database


def _submissions(server: WorkflowServer, run_id: str) -> list[str]:
    with sqlite3.connect(_database(server)) as conn:
        rows = conn.execute(
            "SELECT s.outcome FROM interactive_submissions s JOIN interactive_requests r"
            " ON r.request_id = s.request_id WHERE r.run_id = ? ORDER BY s.submitted_at",
            (run_id,),
        ).fetchall()
    return [outcome for (outcome,) in rows]


def _requests(server: WorkflowServer, run_id: str) -> list[tuple[str, int, str | None]]:
    """(status, unproductive turn ends, last turn error) of each request of the run."""
    with sqlite3.connect(_database(server)) as conn:
        return conn.execute(
            "SELECT status, unproductive_turn_ends, last_turn_error FROM interactive_requests"
            " WHERE run_id = ? ORDER BY created_at",
            (run_id,),
        ).fetchall()


def _attempts(server: WorkflowServer, run_id: str, node: str) -> list[tuple[str, str | None]]:
    with sqlite3.connect(_database(server)) as conn:
        return conn.execute(
            "SELECT status, error FROM node_attempts WHERE run_id = ? AND node_path = ?"
            " ORDER BY started_at",
            (run_id, node),
        ).fetchall()


def _node_output(server: WorkflowServer, run_id: str, node: str) -> Any:
    with sqlite3.connect(_database(server)) as conn:
        (output,) = conn.execute(
            "SELECT b.content FROM node_attempts a JOIN blobs b ON b.digest = a.output_hash"
            " WHERE a.run_id = ? AND a.node_path = ? AND a.status = 'completed'",
            (run_id, node),
        ).fetchone()
    return json.loads(output)


def _run(server: WorkflowServer, project: Path, source: str) -> tuple[str, dict[str, Any]]:
    write_workflow(project, "ask", source)
    with WorkflowClient(server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "ask")
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
    return run_id, view


def _logs(server: WorkflowServer) -> list[str]:
    return [log.read_text()[-2000:] for log in Path(server.state_dir).rglob("pi.stderr.log")]


def _tool_messages(request: Any) -> str:
    return json.dumps([m for m in request.messages() if m["role"] == "tool"])


def _user_messages(request: Any) -> str:
    return json.dumps([m for m in request.messages() if m["role"] == "user"])


VALIDATED_AGENT = """
from pi_workflows import agent, define_workflow


def check(output, ctx):
    if not output["summary"].startswith("good"):
        raise ValueError("summary must start with the word good")
    return {**output, "checked": True}


workflow = define_workflow(
    name="ask",
    start_at="ask",
    nodes={
        "ask": agent(
            prompt="Summarise the work",
            output_schema={"type": "object", "properties": {"summary": {"type": "string"}},
                           "required": ["summary"]},
            validate=check,
            provider="fake",
            model="fake-model",
            timeout=120,
        ),
    },
    edges=[],
)
"""


def test_an_invalid_output_gets_the_validation_error_and_the_corrected_call_is_accepted(
    server_with_pi: WorkflowServer, provider: FakeProvider, short_tmp: Path
) -> None:
    provider.script(
        lambda body: workflow_submit_turn("ask", _attempt_of(body), {"summary": "bad"}),
        lambda body: workflow_submit_turn("ask", _attempt_of(body), {"summary": "good"}),
    )
    run_id, view = _run(server_with_pi, short_tmp / "project", VALIDATED_AGENT)

    assert view["display"]["status"] == "completed", (view, _logs(server_with_pi))
    # The node's output is the value the server accepted: what `validate` returned.
    assert _node_output(server_with_pi, run_id, "ask") == {"summary": "good", "checked": True}
    assert _submissions(server_with_pi, run_id) == ["rejected", "accepted"]
    first, second = provider.chat_requests()
    assert "summary must start with the word good" in _tool_messages(second), "the model saw why"
    assert "summary must start with the word good" not in _tool_messages(first)
    assert _requests(server_with_pi, run_id) == [("settled", 0, None)]


def test_a_valid_submit_completes_the_run_with_exactly_one_accepted_submission(
    server_with_pi: WorkflowServer, provider: FakeProvider, short_tmp: Path
) -> None:
    marker = "good-5c1e9d"
    provider.script(
        lambda body: workflow_submit_turn("ask", _attempt_of(body), {"summary": marker})
    )
    run_id, view = _run(server_with_pi, short_tmp / "project", VALIDATED_AGENT)

    assert view["display"]["status"] == "completed", (view, _logs(server_with_pi))
    assert _node_output(server_with_pi, run_id, "ask") == {"summary": marker, "checked": True}
    assert _submissions(server_with_pi, run_id) == ["accepted"]
    assert len(provider.chat_requests()) == 1, "acceptance ends the turn (terminate)"
    # Tool arguments are private: neither the bridge nor the server logs the output.
    logs = [*Path(server_with_pi.state_dir).rglob("*.log")]
    assert logs and all(marker not in log.read_text(errors="replace") for log in logs)


ROUTED_AGENT = """
from pi_workflows import agent, compute, define_workflow

workflow = define_workflow(
    name="ask",
    start_at="ask",
    nodes={
        "ask": agent(prompt="Summarise the work", output_schema={"type": "object"},
                     provider="fake", model="fake-model", timeout=120),
        "fallback": compute(lambda ctx: {"routed": "failed"}),
    },
    edges=[{"from": "ask", "switch": {"on": "$result.outcome",
                                      "cases": {"failed": "fallback"}}}],
)
"""


def test_turns_without_a_submit_get_reminders_and_the_third_fails_the_attempt_and_routes(
    server_with_pi: WorkflowServer, provider: FakeProvider, short_tmp: Path
) -> None:
    provider.script(text_turn("thinking"), text_turn("still thinking"), text_turn("done?"))
    run_id, view = _run(server_with_pi, short_tmp / "project", ROUTED_AGENT)

    assert view["display"]["status"] == "completed", (view, _logs(server_with_pi))
    assert _node_output(server_with_pi, run_id, "fallback") == {"routed": "failed"}
    ((status, error),) = _attempts(server_with_pi, run_id, "ask")
    assert status == "failed" and error is not None and "agentUnproductive" in error, error
    first, second, third = provider.chat_requests()
    assert "reason: reminder" not in _user_messages(first)
    assert "reason: reminder" in _user_messages(second), "the same child got a reminder"
    assert _user_messages(third).count("reason: reminder") == 2
    ((request_status, count, last_error),) = _requests(server_with_pi, run_id)
    assert (count, last_error) == (3, None), "counted by the server"
    assert request_status != "settled"
    assert provider.remaining() == 0


def test_a_provider_error_counts_as_an_unproductive_turn_and_its_message_is_kept(
    server_with_pi: WorkflowServer, provider: FakeProvider, short_tmp: Path
) -> None:
    provider.script(
        text_turn("thinking"),
        text_turn("still thinking"),
        ProviderError(500, "scripted upstream failure 7f2a"),
    )
    run_id, view = _run(server_with_pi, short_tmp / "project", ROUTED_AGENT)

    assert view["display"]["status"] == "completed", (view, _logs(server_with_pi))
    ((status, error),) = _attempts(server_with_pi, run_id, "ask")
    assert status == "failed" and "agentUnproductive" in (error or ""), error
    assert "provider error" in (error or "")
    ((request_status, count, last_error),) = _requests(server_with_pi, run_id)
    assert request_status != "settled" and count == 3
    assert last_error is not None and "scripted upstream failure 7f2a" in last_error
    assert len(last_error) <= 2048


def test_a_provider_error_gets_a_reminder_and_the_step_still_completes(
    server_with_pi: WorkflowServer, provider: FakeProvider, short_tmp: Path
) -> None:
    provider.script(
        ProviderError(500, "scripted upstream failure 91bc"),
        lambda body: workflow_submit_turn("ask", _attempt_of(body), {"summary": "good"}),
    )
    run_id, view = _run(server_with_pi, short_tmp / "project", VALIDATED_AGENT)

    assert view["display"]["status"] == "completed", (view, _logs(server_with_pi))
    assert _node_output(server_with_pi, run_id, "ask") == {"summary": "good", "checked": True}
    ((status, count, last_error),) = _requests(server_with_pi, run_id)
    assert (status, count) == ("settled", 1)
    assert last_error is not None and "scripted upstream failure 91bc" in last_error
    _, second = provider.chat_requests()
    assert "the model provider failed" in _user_messages(second)


def test_a_runner_killed_mid_step_presents_the_step_again_with_reason_resumed(
    server_with_pi: WorkflowServer, provider: FakeProvider, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "ask", VALIDATED_AGENT)
    provider.script(
        Stall("working on it"),
        lambda body: workflow_submit_turn("ask", _attempt_of(body), {"summary": "good"}),
    )
    with WorkflowClient(server_with_pi.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "ask")
        provider.wait_for_requests(1, timeout=60)  # pi streams the first turn
        _kill_the_runner()
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})

    assert view["display"]["status"] == "completed", (view, _logs(server_with_pi))
    first, second = provider.chat_requests()
    assert "reason: resumed" not in _user_messages(first)
    assert "reason: resumed" in _user_messages(second), "the step is presented again"
    assert _attempt_of(first.body) != _attempt_of(second.body)
    assert _node_output(server_with_pi, run_id, "ask") == {"summary": "good", "checked": True}
    assert _submissions(server_with_pi, run_id) == ["accepted"]


def _kill_the_runner() -> None:
    (runner,) = [
        child
        for child in psutil.Process().children(recursive=True)
        if _named(child, RUNNER_PROCESS_NAME)
    ]
    runner.kill()


def test_a_resumed_runner_goes_on_counting_unproductive_turns(
    server_with_pi: WorkflowServer, provider: FakeProvider, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "ask", ROUTED_AGENT)
    provider.script(text_turn("thinking"), Stall("still"), text_turn("hmm"), text_turn("done?"))
    with WorkflowClient(server_with_pi.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "ask")
        provider.wait_for_requests(2, timeout=60)  # the reminder's turn streams
        _kill_the_runner()
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})

    assert view["display"]["status"] == "completed", (view, _logs(server_with_pi))
    assert _node_output(server_with_pi, run_id, "fallback") == {"routed": "failed"}
    statuses = [status for status, _ in _attempts(server_with_pi, run_id, "ask")]
    assert statuses == ["interrupted", "failed"], statuses
    # 1 before the kill, then 2 and 3 in the resumed child: the third fails the attempt.
    assert len(provider.chat_requests()) == 4
    assert [count for _, count, _ in _requests(server_with_pi, run_id)] == [1, 3]
    assert "reason: resumed" in _user_messages(provider.chat_requests()[2])


def _named(process: psutil.Process, name: str) -> bool:
    try:
        return bool(process.name() == name)
    except psutil.Error:
        return False
