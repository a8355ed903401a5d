"""Helpers the real-pi tests share: the step contract's attempt ID, and process liveness."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import psutil

from pi_workflows import WorkflowServer

ATTEMPT_IN_PROMPT = re.compile(r"step: ask, attempt: (attempt-[0-9a-f]+)\)")
"""The attempt ID in the step contract of a step named `ask` (runner.step_prompt)."""


def attempt_of(body: Mapping[str, Any]) -> str:
    """The attempt ID the prompt of a model request names."""
    found = ATTEMPT_IN_PROMPT.search(json.dumps(body.get("messages")))
    assert found is not None, "the prompt carries the step contract"
    return found.group(1)


def alive(process: psutil.Process) -> bool:
    """Alive and not a zombie; `is_running` also checks the start time (no PID reuse)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@contextlib.contextmanager
def running_server(state_dir: Path) -> Iterator[WorkflowServer]:
    """An embedded server that runs workflows (set the environment its runners and pi
    children inherit before entering), stopped at exit."""
    instance = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=True)
    instance.start()
    try:
        yield instance
    finally:
        instance.stop("test teardown")
