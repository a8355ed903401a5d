"""`make demo`: start a server on a temporary agent dir, use it, show its status, stop it.

Everything goes through the real CLI and the real socket; nothing opens SQLite but
the server. The temporary folder is removed at the end.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

WORKFLOW = '''"""A demo workflow file (recorded by the server; runners come in a later version)."""
'''


def _cli(state_dir: Path, *args: str) -> str:
    command = [sys.executable, "-m", "pi_workflows.cli", "--state-dir", str(state_dir), *args]
    print("$ pi-workflows " + " ".join(args), flush=True)
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=60)
    output = (result.stdout + result.stderr).rstrip()
    if output:
        print(output, flush=True)
    if result.returncode != 0:
        raise SystemExit(f"demo step failed with exit code {result.returncode}")
    return result.stdout.strip()


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="pi-workflows-demo-") as temp:
        agent_dir = Path(temp) / "agent"
        state_dir = agent_dir / "workflows"
        project = Path(temp) / "project"
        (project / ".pi" / "workflows").mkdir(parents=True)
        (project / ".pi" / "workflows" / "hello.workflow.py").write_text(WORKFLOW)
        os.environ["PI_CODING_AGENT_DIR"] = str(agent_dir)
        try:
            _cli(state_dir, "server", "start")
            _cli(state_dir, "server", "status")
            run_id = _cli(
                state_dir,
                "run",
                "start",
                "hello",
                "--project",
                str(project),
                "--input-json",
                '{"greeting": "hi"}',
            )
            _cli(state_dir, "run", "pause", run_id)
            _cli(state_dir, "run", "list")
            _cli(state_dir, "server", "status", "--json")
        finally:
            _cli(state_dir, "server", "stop")
    print("demo finished: the server started, recorded a run, reported status and stopped.")


if __name__ == "__main__":
    main()
