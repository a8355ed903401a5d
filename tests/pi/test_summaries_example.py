"""The shipped `summaries` example end to end: installed into a project by
`python -m pi_workflows.examples`, applied through the CLI of a real server, each child
run's agent step in the real `pi` against the fake model.

One child run per file makes the resource Ready; after one file changes, a reconcile
starts exactly one more child run, for that file, and the resource is Ready again.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowServer
from pi_workflows.server import MAX_WORKERS_ENV
from pi_workflows.testing import (
    FAKE_MODEL,
    FAKE_PROVIDER,
    FakeProvider,
    ScriptedTurn,
    text_turn,
    workflow_submit_turn,
)
from tests.conftest import Processes
from tests.pi.agents import running_server
from tests.server.test_resource_ensure_e2e import _cli_json

pytestmark = pytest.mark.timeout(420)

WAIT_S = 180.0
"""For each phase: real pi children, one at a time, on a machine other tests load too."""

CONTRACT = re.compile(
    r"Workflow step contract \(workflow: summarise, step: summarise, "
    r"attempt: (attempt-[0-9a-f]+)\)"
)
FILE_NAMED = re.compile(r"Summarise the file (\S+) in one")


def _answer(body: Mapping[str, Any]) -> ScriptedTurn:
    """The fake model: submit a summary naming the file the prompt names; after the
    tool's answer, end the turn with text."""
    messages = body.get("messages") or []
    if messages and messages[-1].get("role") == "tool":
        return text_turn("Submitted.")
    text = json.dumps(messages)
    contract, named = CONTRACT.search(text), FILE_NAMED.search(text)
    assert contract is not None and named is not None, "the prompt names the step and file"
    return workflow_submit_turn(
        "summarise", contract.group(1), {"summary": f"about {named.group(1)}"}
    )


@pytest.fixture
def server(
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    pi_binary: Path,
    provider: FakeProvider,
    pi_slot: None,
) -> Iterator[WorkflowServer]:
    # The server's agent folder (the state dir's parent) is the one its pi children get;
    # the example's agent step names no model, so pi takes settings.json's defaults.
    agent_dir = provider.write_agent_dir(state_dir.parent)
    settings = json.loads((agent_dir / "settings.json").read_text())
    settings.update(defaultProvider=FAKE_PROVIDER, defaultModel=FAKE_MODEL)
    (agent_dir / "settings.json").write_text(json.dumps(settings))
    monkeypatch.setenv("PI_WORKFLOWS_PI", str(pi_binary))
    # One worker: at most one pi child at a time, the one real-pi slot this test holds.
    monkeypatch.setenv(MAX_WORKERS_ENV, "1")
    provider.script(*[_answer] * 16)
    with running_server(state_dir) as instance:
        yield instance


def _install(project: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pi_workflows.examples", "summaries", "--project", str(project)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 2 and "installed" in done.stdout


def _until(check: Callable[[], dict[str, Any] | None], what: str) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while (found := check()) is None:
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)  # polling the CLI, a separate process, for a condition
    return found


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_summaries_example_summarises_each_file_once_and_a_changed_file_again(
    server: WorkflowServer, processes: Processes, short_tmp: Path
) -> None:
    state_dir, project = server.state_dir, short_tmp / "project"
    docs = project / "docs"
    docs.mkdir(parents=True)
    (docs / "a.md").write_text("Alpha explains the first idea.\n")
    (docs / "b.md").write_text("Beta explains the second idea.\n")
    _install(project)

    def cli(*args: str) -> None:
        done = processes.cli(state_dir, "resource-manager", *args, "--project", str(project))
        assert done.returncode == 0, done.stderr

    def ready_for(digests: dict[str, str]) -> dict[str, Any] | None:
        shown = _cli_json(
            processes, state_dir, "resource-manager", "get", "summaries", "docs",
            "--project", str(project),
        )  # fmt: skip
        resource = shown["resource"]
        seen = {name: entry["digest"] for name, entry in resource["status"]["summarised"].items()}
        statuses = {(c["type"], c["status"]) for c in resource["conditions"]}
        return shown if seen == digests and ("Ready", "True") in statuses else None

    cli("apply", "summaries", "docs", "--spec-json", json.dumps({"folder": "docs"}))
    first = _until(
        lambda: ready_for({"a.md": _sha256(docs / "a.md"), "b.md": _sha256(docs / "b.md")}),
        "both files summarised",
    )
    summarised = first["resource"]["status"]["summarised"]
    assert {name: entry["summary"] for name, entry in summarised.items()} == {
        "a.md": "about a.md",
        "b.md": "about b.md",
    }
    children = first["childRuns"]
    assert len(children) == 2, "one child run per file"
    assert {c["runId"] for c in children} == {entry["runId"] for entry in summarised.values()}

    (docs / "b.md").write_text("Beta now explains a third idea.\n")
    cli("reconcile", "summaries", "docs")
    second = _until(
        lambda: ready_for({"a.md": _sha256(docs / "a.md"), "b.md": _sha256(docs / "b.md")}),
        "the changed file summarised again",
    )
    after = second["resource"]["status"]["summarised"]
    new = [c for c in second["childRuns"] if c["runId"] not in {c["runId"] for c in children}]
    assert len(second["childRuns"]) == 3 and len(new) == 1, "one more run, for b.md alone"
    assert after["a.md"] == summarised["a.md"], "the unchanged file keeps its summary"
    assert after["b.md"]["runId"] == new[0]["runId"]
    runs = _cli_json(processes, state_dir, "run", "list")
    assert len(runs["items"]) == 3, "no other run started"
