"""Memory of an idle server and of one runner, against a bare interpreter in the same run.

A real `server run` process; its RSS is read once it answers and has nothing to do
(targets, issue 10: idle server RSS at most 60 MB). Then one run whose only node blocks
on a FIFO: the runner is a child of the zygote, so its RSS counts pages it shares with
the zygote copy-on-write; its USS (pages only it holds) is what one more runner costs
(target: at most 30 MB). The baseline is a bare `python -c pass`-like interpreter
measured the same way. Run: .venv/bin/python benchmarks/bench_memory.py
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

from pi_workflows import WorkflowClient

MB = 1024 * 1024
BLOCK = """
from pi_workflows import compute, define_workflow

def hold(ctx):
    with open({fifo!r}, "w") as pipe:
        pipe.write("held")
    import time
    time.sleep(600)
    return {{}}

workflow = define_workflow(name="hold", start_at="hold", nodes={{"hold": compute(hold)}})
"""


def bare_interpreter_rss() -> float:
    """A bare interpreter's RSS, read once it says it is up (then it waits on stdin)."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "up"
        return float(psutil.Process(child.pid).memory_full_info().rss) / MB
    finally:
        child.kill()
        child.wait(10)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="piw-mem-") as root:
        state = Path(root) / "agent" / "workflows"
        project = Path(root) / "project"
        (project / ".pi" / "workflows").mkdir(parents=True)
        fifo = Path(root) / "held.fifo"
        os.mkfifo(fifo)
        (project / ".pi" / "workflows" / "hold.workflow.py").write_text(
            BLOCK.format(fifo=str(fifo))
        )
        env = dict(os.environ, PI_CODING_AGENT_DIR=str(state.parent))
        command = [
            sys.executable,
            "-m",
            "pi_workflows.cli",
            "--state-dir",
            str(state),
            "server",
            "run",
            "--idle-exit",
            "0",
        ]
        server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
        try:
            assert server.stdout is not None and "running" in server.stdout.readline()
            with WorkflowClient(state, autostart=False) as client:
                client.call("server.status")
                idle = psutil.Process(server.pid).memory_full_info()
                fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
                client.call(
                    "run.start", {"workflow": "hold", "input": {}, "projectPath": str(project)}
                )
                readable, _, _ = select.select([fd], [], [], 60)
                assert readable, "the runner never started its node"
                os.close(fd)
                runners = [
                    p
                    for p in psutil.Process(server.pid).children(recursive=True)
                    if p.name() == "piw-runner"
                ]
                assert len(runners) == 1, runners
                runner = runners[0].memory_full_info()
                client.call("server.stop", {"drainSeconds": 0})
            server.wait(30)
        finally:
            if server.poll() is None:
                server.kill()
                server.wait(10)
    bare = bare_interpreter_rss()
    print(f"bare interpreter RSS          {bare:6.1f} MB (baseline)")
    print(
        f"idle server RSS               {idle.rss / MB:6.1f} MB ({idle.rss / MB / bare:.1f}x bare;"
        f" target <= 60 MB {'MET' if idle.rss <= 60 * MB else 'NOT MET'})"
    )
    print(f"one runner RSS                {runner.rss / MB:6.1f} MB (shared with the zygote)")
    print(
        f"one runner USS                {runner.uss / MB:6.1f} MB ({runner.uss / MB / bare:.1f}x bare;"
        f" target <= 30 MB {'MET' if runner.uss <= 30 * MB else 'NOT MET'})"
    )


if __name__ == "__main__":
    main()
