"""The source resolver child: `python -m pi_workflows.engine.resolve` (see `main`).

Implements workflow-server.md § Runner lifecycle (start-time source resolution) and
python-port.md decision 4: the server never imports workflow code, so this short-lived
child discovers and loads the workflow, checks the input and reports one JSON line.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pi_workflows.engine._compile import validate_input
from pi_workflows.engine._context import TitleContext
from pi_workflows.engine._definition import WorkflowDefinition
from pi_workflows.engine._discovery import find_workflow
from pi_workflows.engine._errors import (
    InputInvalidError,
    WorkflowDefinitionError,
    WorkflowLoadError,
    WorkflowNotFoundError,
)
from pi_workflows.engine._loader import load_workflow
from pi_workflows.engine._resource_manager_source import apply_answer
from pi_workflows.supervision import set_process_name
from pi_workflows.wire.canonical import CanonicalJSONError, dumps, loads, sha256_digest

__all__ = [
    "MAX_MESSAGE_CHARS",
    "MAX_REQUEST_BYTES",
    "MAX_TITLE_CHARS",
    "RequestError",
    "input_invalid_message",
    "main",
    "not_found_message",
    "parse_request",
    "resolve_request",
    "safe_message",
]

MAX_REQUEST_BYTES = 2 * 1024 * 1024
"""Longest request line read from stdin (run input is at most 1 MiB)."""

MAX_MESSAGE_CHARS = 1000
"""Longest error message in a response."""

MAX_TITLE_CHARS = 200
"""Longest run title; a longer one is cut."""

MAX_REUSE_MODULES = 64
MAX_REUSE_MODULE_BYTES = 4 * 1024 * 1024
"""A workflow that imports more modules (or bigger ones) than this while it loads is
not offered for reuse: checking them all on every `run.start` would cost too much."""

_REQUEST_KEYS = frozenset({"workflow", "projectPath", "agentDir", "input"})
_APPLY_KEYS = frozenset({"resourceManager", "projectPath", "agentDir", "spec"})
"""A `resourceManager.apply` request names a manager and a spec instead of a workflow."""
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


class RequestError(ValueError):
    """The request line is malformed (a server bug, not a user error). Internal."""


def safe_message(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """Return `text` without control characters (newlines and tabs kept), at most `limit` long."""
    clean = _UNSAFE.sub(" ", text).strip()
    return clean if len(clean) <= limit else clean[: limit - 1] + "…"


def parse_request(line: bytes) -> dict[str, Any]:
    """Parse and check one request line."""
    if len(line) > MAX_REQUEST_BYTES:
        raise RequestError(f"the request is longer than {MAX_REQUEST_BYTES} bytes")
    try:
        request = loads(line.rstrip(b"\n"))
    except CanonicalJSONError as exc:
        raise RequestError(f"the request is not one canonical JSON line: {exc}") from None
    if not isinstance(request, dict):
        raise RequestError("the request must be a JSON object")
    apply = "resourceManager" in request
    extra = set(request) - (_APPLY_KEYS if apply else _REQUEST_KEYS)
    if extra:
        raise RequestError(f"unknown request keys {sorted(extra)}")
    subject = "resourceManager" if apply else "workflow"
    if not isinstance(request.get(subject), str) or not request[subject]:
        raise RequestError(f"'{subject}' must be a non-empty string")
    project = request.get("projectPath")
    if project is not None and (not isinstance(project, str) or not Path(project).is_absolute()):
        raise RequestError("'projectPath' must be an absolute path or null")
    agent = request.get("agentDir")
    if not isinstance(agent, str) or not Path(agent).is_absolute():
        raise RequestError("'agentDir' must be an absolute path")
    request.setdefault("spec" if apply else "input", None)
    request.setdefault("projectPath", None)
    return request


def not_found_message(available: list[str]) -> str:
    """The `workflowNotFound` message: it lists the names that exist, never the one asked
    for (the client chose it; it would be stored in the receipt). The CLI shows the
    user's own name beside it."""
    shown = ", ".join(available[:50]) + (", …" if len(available) > 50 else "")
    return (
        f"no workflow has this name; available: {shown or '(none)'}. Add "
        "'<name>.workflow.py' to <project>/.pi/workflows/ or <agent dir>/workflows/."
    )


def input_invalid_message(name: str, refusal: InputInvalidError) -> str:
    """The `inputInvalid` message: the workflow (found, so not the client's secret), the
    failing place and the rule; never the value (see `pi_workflows.wire.schema_errors`)."""
    if refusal.violation is not None:
        return (
            f"input of workflow {name!r} is invalid {refusal.violation.describe('the whole input')}"
        )
    return f"input of workflow {name!r} is invalid: {refusal}"


def _failure(code: str, message: str) -> dict[str, Any]:
    return {"ok": False, "code": code, "message": safe_message(message)}


def resolve_request(request: Mapping[str, Any]) -> dict[str, Any]:
    """Resolve one checked request to its response (see the module docstring).

    Runs workflow code (module import, `input`, `title`), or for a `resourceManager`
    request manager code (`apply_answer`): call it only in a child process.
    """
    project = Path(request["projectPath"]) if request["projectPath"] is not None else None
    agent_dir = Path(request["agentDir"])
    if "resourceManager" in request:
        return apply_answer(project, agent_dir, request["resourceManager"], request["spec"])
    name: str = request["workflow"]
    try:
        source = find_workflow(name, project, agent_dir)
    except WorkflowNotFoundError as exc:
        return _failure(exc.code, not_found_message(exc.available))
    modules_before = set(sys.modules)
    try:
        loaded = load_workflow(source.path, project=project, agent_dir=agent_dir)
    except (WorkflowLoadError, WorkflowDefinitionError) as exc:
        _log_cause(exc)
        return _failure("definitionInvalid", str(exc))
    definition = loaded.definition
    try:
        normalised = validate_input(definition, request["input"])
    except InputInvalidError as exc:
        # No traceback of the cause: its text may quote the input (the stderr of a
        # resolver reaches the zygote's log).
        return _failure(exc.code, input_invalid_message(name, exc))
    return {
        "ok": True,
        "workflow": name,
        "workflowName": definition.name,
        "sourceIdentity": loaded.identity.to_wire(),
        "definition": loaded.snapshot,
        "definitionDigest": loaded.digest,
        "input": normalised,
        "inputHash": sha256_digest(normalised),
        "title": _title(definition.title, normalised, definition.name),
        "reuse": _reuse(
            definition,
            [(name, str(source.path)), *loaded.discovered],
            set(sys.modules) - modules_before,
        ),
    }


def _reuse(
    definition: WorkflowDefinition, discovered: list[tuple[str, str]], new_modules: set[str]
) -> dict[str, Any]:
    """What the server needs to answer a later `run.start` of this source itself.

    `cacheable` is false when starting runs workflow code that depends on the input (an
    `input` or a `title` callable), or when loading imported too much to re-check.
    `discovered` lists every name lookup (the root, then includes by name) and the file it
    found; `modules` every module file first imported while the workflow loaded, with its
    hash (the source identity covers only workflow files).
    """
    modules: list[dict[str, str]] = []
    size = 0
    cacheable = definition.input_fn is None and not callable(definition.title)
    for module_name in sorted(new_modules):
        path = getattr(sys.modules.get(module_name), "__file__", None)
        if not cacheable or not isinstance(path, str):
            continue
        try:
            data = Path(path).read_bytes()
        except OSError:
            cacheable = False
            continue
        size += len(data)
        modules.append({"path": str(Path(path).resolve()), "hash": _sha256(data)})
    if len(modules) > MAX_REUSE_MODULES or size > MAX_REUSE_MODULE_BYTES:
        cacheable = False
    return {
        "cacheable": cacheable,
        "discovered": [{"name": n, "path": p} for n, p in discovered] if cacheable else [],
        "modules": modules if cacheable else [],
    }


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _title(title: Any, value: Any, workflow_name: str) -> str | None:
    if title is None:
        return None
    text: Any = title
    if callable(title):
        try:
            text = title(TitleContext(input=value, workflow_name=workflow_name))
        except Exception:  # noqa: BLE001 - a failing title never refuses a start
            sys.stderr.write("pi-workflows resolver: title callback raised; run has no title\n")
            traceback.print_exc(file=sys.stderr)
            return None
    if not isinstance(text, str) or not safe_message(text):
        return None
    return safe_message(" ".join(text.split()), MAX_TITLE_CHARS)


def _log_cause(exc: BaseException) -> None:
    cause = exc.__cause__
    if cause is not None:
        traceback.print_exception(cause, file=sys.stderr)


def main() -> int:
    """Run the resolver on stdin/stdout; return the exit status.

    **Input:** one canonical JSON line on stdin::

        {"workflow": NAME, "projectPath": PATH | null, "agentDir": PATH, "input": JSON}
        {"resourceManager": NAME, "projectPath": PATH | null, "agentDir": PATH, "spec": JSON}

    **Output:** one canonical JSON line on stdout, and nothing else (workflow code that
    prints at import writes to stderr)::

        {"ok": true, "workflow": NAME, "workflowName": definition name,
         "sourceIdentity": {"root": {...}, "mounted": [...]}, "definition": snapshot,
         "definitionDigest": "sha256:…", "input": normalised input,
         "inputHash": "sha256:…", "title": text | null,
         "reuse": {"cacheable": bool, "discovered": [{"name", "path"}],
                   "modules": [{"path", "hash"}]}}
        {"ok": false, "code": "workflowNotFound" | "definitionInvalid" | "inputInvalid",
         "message": bounded safe text (≤ 1000 characters, no stack trace)}

    A `resourceManager` request is answered by `apply_answer` (its proposal, or
    `resourceManagerNotFound`, `definitionInvalid`, `specInvalid`, `initialStatusInvalid`).

    **Exit status:** 0 whenever a response was written; 2 for a malformed request (a server
    bug; nothing on stdout); 1 if the resolver itself crashed.
    """
    set_process_name("piw-resolver")
    # Workflow code may print at import: only the response may reach the real stdout.
    sys.stdout.flush()
    response_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        request = parse_request(sys.stdin.buffer.readline(MAX_REQUEST_BYTES + 1))
    except RequestError as exc:
        sys.stderr.write(f"pi-workflows resolver: {exc}\n")
        return 2
    response = dumps(resolve_request(request)) + b"\n"
    view = memoryview(response)
    while view:
        written = os.write(response_fd, view)
        view = view[written:]
    os.close(response_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
