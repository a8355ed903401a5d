"""Draw the README's `piw` screenshot (docs/piw.svg) from a real server and real runs.

A temporary state folder, an embedded server, three workflows run to their ends (a
loop with a branch, a failed run, a run waiting at a checkpoint), then the app headless
(textual's `run_test`) on the loop run, saved with `save_screenshot`. Run it with
`python scripts/piw_screenshot.py [OUT.svg]` after a change to the viewer's look.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.viewer import Target
from pi_workflows.viewer._app import PiwApp

SIZE = (150, 46)
REVIEW = """
from pi_workflows import checkpoint, compute, define_workflow


def draft(ctx):
    rounds = (ctx.outputs.get("draft") or {}).get("round", 0) + 1
    return {"round": rounds}


workflow = define_workflow(
    name="review",
    title=lambda ctx: "Draft, check and revise the release notes",
    start_at="draft",
    max_steps=50,
    nodes={
        "draft": compute(draft),
        "check": compute(lambda ctx: {"ok": ctx.outputs["draft"]["round"] >= 3}),
        "publish": compute(lambda ctx: {"published": True}),
        "approve": checkpoint(summary="Publish the notes?"),
    },
    edges=[
        {"from": "draft", "to": "check"},
        {"from": "check", "switch": {"on": "$.ok", "cases": {True: "approve"}, "default": "draft"}},
        {"from": "approve", "to": "publish"},
    ],
)
"""
BOOM = """
from pi_workflows import compute, define_workflow


def fetch(ctx):
    raise ConnectionError("the mirror did not answer")


workflow = define_workflow(name="mirror", start_at="fetch", nodes={"fetch": compute(fetch)})
"""


def _wait(client: WorkflowClient, run_id: str, statuses: set[str]) -> None:
    deadline = time.monotonic() + 60
    while client.call("run.get", run_id=run_id)["receipt"]["display"]["status"] not in statuses:
        if time.monotonic() > deadline:
            raise TimeoutError(run_id)
        time.sleep(0.05)  # a one-off script: polling a condition is fine here


def main(out: Path) -> None:
    root = Path(tempfile.mkdtemp(prefix="piw-shot-", dir="/tmp"))
    state_dir, project = root / "agent" / "workflows", root / "project"
    folder = project / ".pi" / "workflows"
    folder.mkdir(parents=True)
    (folder / "review.workflow.py").write_text(REVIEW)
    (folder / "mirror.workflow.py").write_text(BOOM)
    server = WorkflowServer(state_dir, idle_exit_s=None, execute_runs=True)
    server.start()
    try:
        with WorkflowClient(state_dir, autostart=False) as client:
            started = {}
            for name in ("mirror", "review"):
                answer = client.call(
                    "run.start", {"workflow": name, "input": {}, "projectPath": str(project)}
                )
                started[name] = answer["receipt"]["runId"]
            _wait(client, started["mirror"], {"failed"})
            _wait(client, started["review"], {"waiting"})
        app = PiwApp(Target(state_dir), None, theme="tokyo-night")

        async def shoot() -> None:
            async with app.run_test(size=SIZE) as pilot:
                deadline = time.monotonic() + 30
                while app.view is None or app.view["runId"] != started["review"]:
                    if time.monotonic() > deadline:
                        raise TimeoutError("the app never showed the run")
                    await pilot.pause(0.1)
                await pilot.pause(1.0)
                app.save_screenshot(filename=out.name, path=str(out.parent))
                await pilot.press("q")

        asyncio.run(shoot())
    finally:
        server.stop("screenshot taken")
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/piw.svg").absolute())
