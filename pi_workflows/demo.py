"""`make demo`: start a server on a temporary agent dir and run real workflows through it.

Everything goes through the real CLI, the real socket and real runner processes;
nothing opens SQLite but the server. The temporary folder is removed at the end.
The agent step runs the real `pi --mode rpc` (`node_modules/.bin/pi`, or the one
`PI_WORKFLOWS_PI` names) against a scripted fake model on 127.0.0.1, one pi child.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pi_workflows.pi import PI_BINARY_ENV
from pi_workflows.testing import (
    FAKE_MODEL,
    FAKE_PROVIDER,
    FakeProvider,
    ScriptedTurn,
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
ATTEMPT_IN_PROMPT = re.compile(r"\b(attempt-[0-9a-f]{32})\b")  # named by the step contract
NOTES = {"summary": "Release 1.2.0 fixes three bugs and adds run status.", "version": "1.2.0"}


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
    """The fake model's one turn: call `workflow submit` for the attempt the prompt names."""
    text = json.dumps(body.get("messages"))
    found = ATTEMPT_IN_PROMPT.search(text)
    attempt = found.group(1) if found else "attempt-unknown"
    return workflow_submit_turn("summarise", attempt, NOTES)


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


def _cli(state_dir: Path, *args: str, check: bool = True) -> str:
    command = [sys.executable, "-m", "pi_workflows.cli", "--state-dir", str(state_dir), *args]
    print("$ pi-workflows " + " ".join(args), flush=True)
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    output = (result.stdout + result.stderr).rstrip()
    if output:
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
        provider = FakeProvider().start()
        try:
            _write_pi_agent_dir(provider, agent_dir)
            provider.script(_fake_model_submits)
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
            _cli(state_dir, "run", "list")
            _cli(state_dir, "server", "status", "--json")
        finally:
            _cli(state_dir, "server", "stop", check=False)
            provider.stop()
    print(
        "demo finished: the daemon ran three workflows in runner processes, one with an "
        "agent step in a headless pi, and stopped."
    )


if __name__ == "__main__":
    main()
