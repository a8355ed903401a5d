"""How a node's failure is reported: its code, its whole message and its traceback.

Implements workflow-server.md § Failure classification, runner side: each exception maps
to one code (`nodeFailed`, `resourceLimit`, `outputTooLarge` ...); the message and the
workflow's own traceback frames are sent whole (by reference when large, `_values.py`).
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path
from typing import Final

from pi_workflows.engine._limits import RESOURCE_LIMIT_CODE, ResourceLimitExceeded
from pi_workflows.engine._pi_child import PiUnavailable
from pi_workflows.engine._values import MAX_ERROR_TEXT, ValueTooLarge
from pi_workflows.wire.runner import RunnerError

__all__ = [
    "AgentUnproductive",
    "exception_text",
    "failure_code",
    "node_error",
    "run_failure",
    "short_text",
    "traceback_text",
]


class AgentUnproductive(RuntimeError):  # noqa: N818 - the failure code
    """An agent step's model ended more than `MAX_REMINDERS` + 1 turns without an accepted
    submission, as the server counted them (the message names no output)."""

    code = "agentUnproductive"


def failure_code(exc: BaseException) -> str:
    """The `node.failed` error code of a node's exception."""
    if isinstance(exc, ResourceLimitExceeded | MemoryError):
        return RESOURCE_LIMIT_CODE
    if isinstance(exc, PiUnavailable | AgentUnproductive | ValueTooLarge):
        return exc.code
    return "nodeFailed"


def exception_text(exc: BaseException) -> str:
    """`Type: message`, whole (a node's error is sent by reference when it is large)."""
    return f"{type(exc).__name__}: {exc}"


def short_text(exc: BaseException) -> str:
    """`Type: message`, bounded: for a park detail or a routing failure."""
    return exception_text(exc)[:MAX_ERROR_TEXT] or type(exc).__name__


def node_error(exc: BaseException) -> RunnerError:
    """The whole `node.failed` error of a node's exception, with its traceback."""
    return RunnerError(
        code=failure_code(exc), message=exception_text(exc), traceback=traceback_text(exc)
    )


def run_failure(path: str, exc: BaseException) -> RunnerError:
    """The run's error when node `path` failed with no route: the node's own failure code
    (piUnavailable, agentUnproductive …) is named in the reason; a plain exception is
    named by its type. Whole, like the node's."""
    code = failure_code(exc)
    run_code = code if code == RESOURCE_LIMIT_CODE else "nodeFailed"
    why = exception_text(exc) if code == "nodeFailed" else f"{code}: {exc}"
    return RunnerError(code=run_code, message=f"{path}: {why}")


_ENGINE_DIR: Final = str(Path(__file__).resolve().parent.parent) + os.sep
_CHAINED: Final = 8


def traceback_text(exc: BaseException) -> str:
    """The traceback of a failed node: the workflow's frames, not the engine's."""
    shown = traceback.TracebackException.from_exception(exc)
    for part in (shown, *_chained(shown)):
        part.stack = traceback.StackSummary.from_list(
            [frame for frame in part.stack if not frame.filename.startswith(_ENGINE_DIR)]
        )
    return "".join(shown.format())


def _chained(shown: traceback.TracebackException) -> list[traceback.TracebackException]:
    found: list[traceback.TracebackException] = []
    current = shown.__cause__ or shown.__context__
    while current is not None and len(found) < _CHAINED:
        found.append(current)
        current = current.__cause__ or current.__context__
    return found
