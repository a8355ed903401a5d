"""Start-time source resolution in a short-lived child: the server never imports workflows.

Implements the source-resolver part of workflow-server.md § Process model and issue 5's
"source identity": `run.start` hands the reference to `python -m pi_workflows.engine.resolve`
in its own process group, bounded in time and output, and commits the run only with
what the child reported.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from pi_workflows.wire.canonical import CanonicalJSONError, dumps, loads

__all__ = ["RESOLVE_TIMEOUT_S", "resolve_start"]

RESOLVE_TIMEOUT_S = 30.0
MAX_RESOLVER_OUTPUT = 4 * 1024 * 1024


def resolve_start(
    workflow: str, project_path: str | None, agent_dir: Path, workflow_input: Any
) -> dict[str, Any]:
    """Run the resolver child and return its one response object.

    Never raises for a bad workflow: failures come back as `{"ok": false, ...}`. Runs on
    a resolver worker thread, never on an actor.
    """
    request = dumps(
        {
            "workflow": workflow,
            "projectPath": project_path,
            "agentDir": str(agent_dir),
            "input": workflow_input,
        }
    )
    child = subprocess.Popen(
        [sys.executable, "-m", "pi_workflows.engine.resolve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        cwd=project_path if project_path and Path(project_path).is_dir() else None,
    )
    try:
        out, _ = child.communicate(request + b"\n", timeout=RESOLVE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        return _failure("definitionInvalid", "loading the workflow took too long")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)  # nothing the workflow started outlives it
    line = out[:MAX_RESOLVER_OUTPUT].split(b"\n", 1)[0]
    try:
        answer = loads(line)
    except CanonicalJSONError:
        return _failure("definitionInvalid", "the workflow could not be loaded")
    if not isinstance(answer, dict) or "ok" not in answer:
        return _failure("definitionInvalid", "the workflow could not be loaded")
    return answer


def _failure(code: str, message: str) -> dict[str, Any]:
    return {"ok": False, "code": code, "message": message}
