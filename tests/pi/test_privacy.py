"""Privacy of agent steps with the real pi (issue 12, item 8).

Provider credentials, prompts and submitted outputs are never in logs, `server status`
or error texts, and pi's stderr and the bridge's config stay in the user-only state
folder (workflow-server.md § Status and privacy). One server (started detached by the
CLI, so its `server.out` exists) runs two agent steps against the fake provider with a
distinctive API key: one whose model submits a distinctive output, and one whose model
only ever submits an invalid, distinctive output and fails after three turns. Then
every log in the state folder, `server status` (CLI text, CLI JSON, `server.status`),
the run views and the stored error texts are searched for the prompt, the outputs and
the key. The run view's trace shows an accepted output as the step's output (issue 13);
that one place is asserted, not searched.
"""

from __future__ import annotations

import json
import stat
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient
from pi_workflows.storage import open_database
from pi_workflows.testing import FakeProvider, ScriptedTurn, text_turn, workflow_submit_turn
from tests.conftest import Processes, write_workflow
from tests.pi.agents import attempt_of as _attempt

pytestmark = pytest.mark.timeout(180)

MARK = uuid.uuid4().hex[:12]
PROMPT_MARKER = f"prompt-marker-{MARK}"
OUTPUT_MARKER = f"output-marker-{MARK}"
INVALID_MARKER = f"invalid-output-{MARK}"
REPLY_MARKER = f"model-reply-{MARK}"
API_KEY = f"sk-privacy-{MARK}"
SECRETS = (PROMPT_MARKER, OUTPUT_MARKER, INVALID_MARKER, REPLY_MARKER, API_KEY)

WORKFLOW = """
from pi_workflows import agent, define_workflow


def refuse(output, ctx):
    # A validator whose error quotes the output, as a careless one would.
    raise ValueError(f"not good enough: {{output}}")


workflow = define_workflow(
    name="{name}",
    start_at="ask",
    nodes={{
        "ask": agent(
            prompt=lambda ctx: "Summarise the work: {marker}",
            output_schema={{"type": "object", "properties": {{"summary": {{"type": "string"}}}},
                           "required": ["summary"]}},
            validate={validate},
            provider="fake",
            model="fake-model",
            timeout=120,
        ),
    }},
)
"""


def _valid(body: Mapping[str, Any]) -> ScriptedTurn:
    return workflow_submit_turn("ask", _attempt(body), {"summary": OUTPUT_MARKER})


def _invalid_then_end(body: Mapping[str, Any]) -> ScriptedTurn:
    """Submit an output `validate` refuses; after the tool's answer, end pi's run."""
    messages = list(body.get("messages") or [])
    if messages and messages[-1].get("role") == "tool":
        return text_turn(f"I could not do it: {REPLY_MARKER}")
    return workflow_submit_turn("ask", _attempt(body), {"summary": INVALID_MARKER})


@pytest.fixture
def agent_dir(state_dir: Path, provider: FakeProvider) -> Path:
    """The server's agent folder: the fake provider's models.json with our own key."""
    folder = provider.write_agent_dir(state_dir.parent)
    models = provider.models_json()
    models["providers"]["fake"]["apiKey"] = API_KEY
    (folder / "models.json").write_text(json.dumps(models))
    return folder


@pytest.fixture
def cli_server(
    processes: Processes,
    state_dir: Path,
    agent_dir: Path,
    pi_binary: Path,
    pi_slot: None,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Processes]:
    monkeypatch.setenv("PI_WORKFLOWS_PI", str(pi_binary))  # the detached server inherits it
    started = processes.cli(state_dir, "server", "start")
    assert started.returncode == 0, started.stdout + started.stderr
    processes.adopt(int((state_dir / "host" / "server.lock").read_text().strip()))
    try:
        yield processes
    finally:
        processes.cli(state_dir, "server", "stop")


def _run(processes: Processes, state_dir: Path, project: Path, name: str) -> dict[str, Any]:
    started = processes.cli(state_dir, "run", "start", name, "--project", str(project))
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    processes.cli(state_dir, "run", "wait", run_id, "--timeout", "120")
    shown = processes.cli(state_dir, "run", "status", run_id, "--json")
    assert shown.returncode == 0, shown.stderr
    view: dict[str, Any] = json.loads(shown.stdout)
    text = processes.cli(state_dir, "run", "status", run_id)
    view["_text"] = text.stdout + text.stderr
    return view


def _without_outputs(view: dict[str, Any]) -> dict[str, Any]:
    """The view without the outputs it shows on purpose (attempt outputs and the run's
    output); everything else, errors and reasons included, is searched."""
    shown = {key: value for key, value in view.items() if key != "result"}
    trace = view.get("trace", {"items": []})
    shown["trace"] = [
        {key: value for key, value in item.items() if key != "output"} for item in trace["items"]
    ]
    return shown


def _leaks(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


def test_prompts_outputs_and_the_key_stay_out_of_logs_status_and_errors(
    cli_server: Processes, state_dir: Path, short_tmp: Path, provider: FakeProvider
) -> None:
    processes = cli_server
    project = short_tmp / "project"
    write_workflow(
        project, "good", WORKFLOW.format(name="good", marker=PROMPT_MARKER, validate=None)
    )
    write_workflow(
        project, "bad", WORKFLOW.format(name="bad", marker=PROMPT_MARKER, validate="refuse")
    )

    provider.script(_valid)
    good = _run(processes, state_dir, project, "good")
    assert good["display"]["status"] == "completed", good
    chats = provider.chat_requests()
    assert chats, "pi asked the model"
    headers = {name.lower(): value for name, value in chats[0].headers.items()}
    assert headers.get("authorization") == f"Bearer {API_KEY}", "pi used our key"
    assert PROMPT_MARKER in json.dumps(chats[0].body), "the prompt reached the model"

    provider.script(*[_invalid_then_end] * 12)
    bad = _run(processes, state_dir, project, "bad")
    assert bad["display"]["status"] == "failed", bad
    seen_by_model = json.dumps([r.body for r in provider.chat_requests()])
    assert f"not good enough: {{'summary': '{INVALID_MARKER}'}}" in seen_by_model, (
        "validate ran and its error, quoting the output, went back to the model"
    )

    # The run views and their error texts (CLI JSON and text). An accepted output is the
    # step's output, which the run view's trace shows by design (issue 13): it is left
    # out of the search, and it must be exactly where the trace puts it.
    ask = next(item for item in good["trace"]["items"] if item["node"] == "ask")
    assert ask["output"] == {"value": {"summary": OUTPUT_MARKER}}, ask
    for view in (good, bad):
        assert _leaks(json.dumps(_without_outputs(view))) == [], view
    # The stored error texts of the failed attempt and run.
    with open_database(state_dir / "state.sqlite") as db:
        errors = db.connection.execute(
            "SELECT coalesce(error, '') FROM node_attempts UNION ALL "
            "SELECT coalesce(failure_reason, '') FROM runs"
        ).fetchall()
    assert any(text for (text,) in errors), "the failed attempt stored an error"
    assert _leaks(json.dumps(errors)) == [], errors

    # server status: CLI text, CLI JSON and the operation.
    for args in (("server", "status"), ("server", "status", "--json")):
        status = processes.cli(state_dir, *args)
        assert status.returncode == 0, status.stderr
        assert _leaks(status.stdout + status.stderr) == [], status.stdout
    with WorkflowClient(state_dir, autostart=False) as client:
        receipt = client.call("server.status")["receipt"]
    assert _leaks(json.dumps(receipt)) == [], receipt

    # Every log of the state folder: the server's, the zygote's, the runners', server.out.
    # (pi's own stderr may hold what pi chooses to print: it only has to stay private.)
    logs = [
        path
        for path in state_dir.rglob("*")
        if path.is_file()
        and (path.suffix == ".log" or path.name.startswith("server.out"))
        and path.name != "pi.stderr.log"
    ]
    assert any(path.name.startswith("server.out") for path in logs), logs
    assert any(path.parent.name == "runners" for path in logs), logs
    for path in logs:
        assert _leaks(path.read_text(errors="replace")) == [], path

    # pi's stderr and the bridge config: under the state folder, user-only.
    pi_logs = list(state_dir.rglob("pi.stderr.log"))
    configs = list(state_dir.rglob("bridge.json"))
    assert len(pi_logs) == 2 and len(configs) == 2, (pi_logs, configs)
    for path in (*pi_logs, *configs):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        for folder in path.relative_to(state_dir).parents:
            mode = stat.S_IMODE((state_dir / folder).stat().st_mode)
            assert mode == 0o700, (folder, oct(mode))
