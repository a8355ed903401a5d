"""`make demo`: start a server on a temporary agent dir and run a real workflow through it.

Everything goes through the real CLI, the real socket and real runner processes;
nothing opens SQLite but the server. The temporary folder is removed at the end.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

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
        os.environ["PI_CODING_AGENT_DIR"] = str(agent_dir)
        try:
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
            _cli(state_dir, "run", "list")
            _cli(state_dir, "server", "status", "--json")
        finally:
            _cli(state_dir, "server", "stop", check=False)
    print("demo finished: the daemon ran two workflows in runner processes and stopped.")


if __name__ == "__main__":
    main()
