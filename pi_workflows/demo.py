"""`make demo`: start a server on a temporary agent dir and run real workflows through it.

Everything goes through the real CLI, the real socket and real runner processes;
nothing opens SQLite but the server. The temporary folder is removed at the end.
The agent steps run the real `pi --mode rpc` (`node_modules/.bin/pi`, or the one
`PI_WORKFLOWS_PI` names) against a scripted fake model on 127.0.0.1. Last, the shipped
`summaries` resource manager keeps a folder summarised, one agent-step run per file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pi_workflows.examples import install_example
from pi_workflows.pi import PI_BINARY_ENV
from pi_workflows.testing import (
    FAKE_MODEL,
    FAKE_PROVIDER,
    FakeProvider,
    ScriptedTurn,
    text_turn,
    workflow_submit_turn,
)

WORKFLOW = '''"""release: compute, a shell command and a managed effect, run by the daemon."""
from pi_workflows import action, compute, define_workflow, notify, shell


def plan(ctx):
    return {"version": ctx.input["version"], "files": 3}


def publish(ctx):
    # A managed effect: the server reserves it before `apply` and settles it after,
    # so a crash never publishes twice without saying so.
    return ctx.effect(
        "demo.publish",
        {"version": ctx.outputs["plan"]["version"]},
        apply=lambda key, request: {"published": request["version"]},
    )


workflow = define_workflow(
    name="release",
    start_at="plan",
    nodes={
        "plan": compute(plan),
        "build": shell(lambda ctx: ["sh", "-c", "echo building $0", ctx.input["version"]]),
        "publish": action(publish),
        "announce": notify(lambda ctx: f"released {ctx.outputs['publish']['published']}"),
    },
    edges=[
        {"from": "plan", "to": "build"},
        {"from": "build", "to": "publish"},
        {"from": "publish", "to": "announce"},
    ],
)
'''


NOTES_WORKFLOW = '''"""notes: an agent step (a Pi model), then a compute node keeping its output."""
import json
from pathlib import Path

from pi_workflows import agent, compute, define_workflow


def keep(ctx):
    # Callbacks run in the project folder. The run view shows no node outputs, so the
    # demo prints the agent's output from this file.
    Path("release-notes.json").write_text(json.dumps(ctx.outputs["summarise"]))
    return {"kept": True}


workflow = define_workflow(
    name="notes",
    start_at="summarise",
    nodes={
        # No provider or model here: pi uses the defaults of the agent dir's settings.json.
        "summarise": agent(
            prompt=lambda ctx: f"Summarise release {ctx.input['version']} in one sentence.",
            output_schema={
                "type": "object",
                "properties": {"summary": {"type": "string"}, "version": {"type": "string"}},
                "required": ["summary", "version"],
            },
            timeout=120,
        ),
        "keep": compute(keep),
    },
    edges=[{"from": "summarise", "to": "keep"}],
)
'''

REPO = Path(__file__).resolve().parents[1]
CONTRACT = re.compile(  # the step contract the runner appends to every agent step's prompt
    r"Workflow step contract \(workflow: ([\w-]+), step: ([\w-]+), attempt: (attempt-[0-9a-f]+)\)"
)
FILE_IN_PROMPT = re.compile(r"Summarise the file (\S+) in")  # the summarise workflow's prompt
NOTES = {"summary": "Release 1.2.0 fixes three bugs and adds run status.", "version": "1.2.0"}
MODEL_TURNS = 32
"""Turns scripted for the fake model: two per agent step (submit, then end the turn)."""
WAIT_S = 120.0
MAX_WORKERS = "PI_WORKFLOWS_MAX_WORKERS"  # read by the server the demo starts


def _pi_binary() -> str:
    """The pi the demo's server runs: `PI_WORKFLOWS_PI`, else the repository's pinned one."""
    configured = os.environ.get(PI_BINARY_ENV, "").strip()
    if configured:
        return configured
    installed = REPO / "node_modules" / ".bin" / "pi"
    if not installed.exists():
        raise SystemExit(
            "demo: node_modules/.bin/pi is missing: run `make node_modules` (needs Node.js "
            f">= 20.6 and npm), or set {PI_BINARY_ENV} to a pi binary"
        )
    return str(installed)


def _fake_model_submits(body: Mapping[str, Any]) -> ScriptedTurn:
    """The fake model's turn: call `workflow submit` with an output for the workflow and
    step the prompt's contract names; once the tool has answered, end the turn."""
    messages = body.get("messages") or []
    if messages and messages[-1].get("role") == "tool":
        return text_turn("Submitted.")
    text = json.dumps(messages)
    found = CONTRACT.search(text)
    workflow, step, attempt = found.groups() if found else ("", "summarise", "attempt-unknown")
    if workflow == "summarise":
        named = FILE_IN_PROMPT.search(text)
        about = named.group(1) if named else "this file"
        return workflow_submit_turn(step, attempt, {"summary": f"A short note about {about}."})
    return workflow_submit_turn(step, attempt, NOTES)


def _write_pi_agent_dir(provider: FakeProvider, agent_dir: Path) -> None:
    """models.json pointing pi at the fake provider, and settings.json choosing it."""
    provider.write_agent_dir(agent_dir)
    settings_path = agent_dir / "settings.json"
    settings = json.loads(settings_path.read_text())
    settings.update(defaultProvider=FAKE_PROVIDER, defaultModel=FAKE_MODEL)
    settings_path.write_text(json.dumps(settings, indent=2))


def _agent_step(state_dir: Path, project: Path) -> None:
    """Run `notes` (one agent step) and print the output the model submitted."""
    notes = _cli(
        state_dir,
        "run",
        "start",
        "notes",
        "--project",
        str(project),
        "--input-json",
        '{"version": "1.2.0"}',
    )
    _cli(state_dir, "run", "wait", notes, "--timeout", "120")
    _cli(state_dir, "run", "status", notes)
    submitted = json.loads((project / "release-notes.json").read_text())
    print(f"the agent step's submitted output: {json.dumps(submitted)}", flush=True)


def _resource_manager(state_dir: Path, project: Path) -> None:
    """Install the shipped `summaries` manager, apply it to a folder of two files, then
    change one file: a reconcile starts one new child run, for that file alone."""
    for installed in install_example("summaries", project):
        print(f"installed the example's {installed.path.relative_to(project)}", flush=True)
    docs = project / "docs"
    docs.mkdir()
    (docs / "intro.md").write_text("pi-workflows runs durable workflows for Pi.\n")
    (docs / "usage.md").write_text("Start the server, then start a run.\n")
    where = ("--project", str(project))
    _cli(state_dir, "resource-manager", "apply", "summaries", "docs",
         "--spec-json", '{"folder": "docs"}', *where)  # fmt: skip
    first = _wait_summarised(state_dir, project, docs)
    _cli(state_dir, "resource-manager", "get", "summaries", "docs", *where)
    (docs / "usage.md").write_text("Start the server, start a run, then watch it.\n")
    print("changed docs/usage.md", flush=True)
    _cli(state_dir, "resource-manager", "reconcile", "summaries", "docs", *where)
    second = _wait_summarised(state_dir, project, docs)
    _cli(state_dir, "resource-manager", "get", "summaries", "docs", *where)
    before = {child["runId"] for child in first["childRuns"]}
    started = [child for child in second["childRuns"] if child["runId"] not in before]
    print(
        f"child runs: {len(before)} for the first two files, then {len(started)} more "
        "for the changed file alone",
        flush=True,
    )
    if len(before) != 2 or len(started) != 1:
        raise SystemExit("demo: the summaries manager started an unexpected number of runs")


def _wait_summarised(state_dir: Path, project: Path, docs: Path) -> dict[str, Any]:
    """Poll `resource-manager get --json` until every file's current content (by SHA-256)
    is summarised and the Ready condition is true."""
    print("(waiting until the resource's status covers every file and Ready is True)")
    digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in docs.iterdir()}
    deadline = time.monotonic() + WAIT_S
    while True:
        shown = json.loads(
            _cli(state_dir, "resource-manager", "get", "summaries", "docs", "--project",
                 str(project), "--json", quiet=True)
        )  # fmt: skip
        resource = shown["resource"]
        seen = {name: entry["digest"] for name, entry in resource["status"]["summarised"].items()}
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in resource["conditions"])
        if ready and seen == digests:
            return dict(shown)
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: the resource was not summarised within {WAIT_S:g} s")
        time.sleep(0.5)  # the poll interval: each poll is a CLI process of its own


def _cli(state_dir: Path, *args: str, check: bool = True, quiet: bool = False) -> str:
    command = [sys.executable, "-m", "pi_workflows.cli", "--state-dir", str(state_dir), *args]
    if not quiet:
        print("$ pi-workflows " + " ".join(args), flush=True)
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    output = (result.stdout + result.stderr).rstrip()
    if output and not (quiet and result.returncode == 0):
        print(output, flush=True)
    if check and result.returncode != 0:
        raise SystemExit(f"demo step failed with exit code {result.returncode}")
    return result.stdout.strip()


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="piw-demo-", dir="/tmp") as temp:
        agent_dir = Path(temp) / "agent"
        state_dir = agent_dir / "workflows"
        project = Path(temp) / "project"
        (project / ".pi" / "workflows").mkdir(parents=True)
        (project / ".pi" / "workflows" / "release.workflow.py").write_text(WORKFLOW)
        (project / ".pi" / "workflows" / "notes.workflow.py").write_text(NOTES_WORKFLOW)
        os.environ["PI_CODING_AGENT_DIR"] = str(agent_dir)
        # Set before the server starts: its runners, and their pi children, inherit it.
        os.environ[PI_BINARY_ENV] = _pi_binary()
        os.environ[MAX_WORKERS] = "2"  # at most two runs (two pi children) at once
        provider = FakeProvider().start()
        try:
            _write_pi_agent_dir(provider, agent_dir)
            provider.script(*[_fake_model_submits] * MODEL_TURNS)
            _cli(state_dir, "server", "start")
            _cli(state_dir, "workflows", "list", "--project", str(project))
            run_id = _cli(
                state_dir,
                "run",
                "start",
                "release",
                "--project",
                str(project),
                "--input-json",
                '{"version": "1.2.0"}',
            )
            _cli(state_dir, "run", "wait", run_id, "--timeout", "60")
            _cli(state_dir, "run", "status", run_id)
            hello = _cli(state_dir, "run", "start", "hello", "--input-json", '{"name": "Ada"}')
            _cli(state_dir, "run", "wait", hello, "--timeout", "60")
            _agent_step(state_dir, project)
            _resource_manager(state_dir, project)
            _cli(state_dir, "run", "list")
            _cli(state_dir, "server", "status", "--json")
        finally:
            _cli(state_dir, "server", "stop", check=False)
            provider.stop()
    print(
        "demo finished: the daemon ran three workflows in runner processes, one with an "
        "agent step in a headless pi; a resource manager kept a folder summarised with "
        "one agent-step run per changed file; and the daemon stopped."
    )


if __name__ == "__main__":
    main()
