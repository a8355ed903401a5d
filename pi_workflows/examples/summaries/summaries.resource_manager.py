# ruff: noqa: N999 - manager files are loaded by path; the stem is the manager's name
"""summaries: keep every file of a folder summarised by a headless agent step.

The spec names a folder (and optionally a glob `pattern`, default `*`). Each pass hashes
the folder's files (SHA-256 of their bytes) and, for each file whose digest has no
summary yet, ensures one `summarise` child run keyed by the file and that digest. The
status maps each file to the digest it summarises; `Ready` is true when every file's
current content is summarised. Changing a file and running `resource-manager
reconcile` starts one new run for that file alone.
"""

import hashlib
from pathlib import Path
from typing import Any

from pi_workflows.resource_managers import (
    Condition,
    ReconcileContext,
    ReconcileResult,
    condition_false,
    condition_true,
    define_resource_manager,
)

SPARE_SECONDS = 5.0
"""Stop starting work this close to the pass's deadline: requeue, and go on next pass."""


def initial_status(spec: Any) -> dict[str, Any]:
    return {"summarised": {}}


def file_digest(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def request_key(name: str, digest: str) -> str:
    # A key is 1-200 of `A-Za-z0-9._:/-`: name the file by a digest of its name. The
    # content digest is part of the key, so new content is a new child run, and the
    # same content is the same run however often a pass asks.
    return f"summary/{hashlib.sha256(name.encode()).hexdigest()[:16]}/{digest}"


def reconcile(ctx: ReconcileContext) -> ReconcileResult:
    spec = ctx.resource.spec
    folder = Path(spec["folder"])
    if not folder.is_dir():
        missing = condition_false("Ready", "FolderMissing", "the folder does not exist")
        return ctx.settled(status=ctx.resource.status, conditions=[missing])
    files = sorted(
        path
        for path in folder.glob(spec.get("pattern", "*"))
        if path.is_file() and not path.name.startswith(".")  # no editor or lock files
    )
    names = {path: path.relative_to(folder).as_posix() for path in files}
    known: dict[str, Any] = ctx.resource.status["summarised"]
    # Files that went away drop out of the status; the others keep their summary.
    summarised = {name: known[name] for name in names.values() if name in known}
    running, failed = 0, 0
    for path, name in names.items():
        digest = file_digest(path)
        if summarised.get(name, {}).get("digest") == digest:
            continue
        if ctx.time_left() < SPARE_SECONDS:
            return ctx.requeue()  # the runs ensured so far are recorded: none starts twice
        run = ctx.workflows.ensure(
            request_key=request_key(name, digest),
            workflow="summarise",
            input={"path": str(path), "digest": digest},
        )
        if run.state == "done":
            summary = run.output["summary"]
            summarised[name] = {"digest": digest, "summary": summary, "runId": run.run_id}
        elif run.finished:
            failed += 1  # failed or cancelled: new content (a new key) tries again
        else:
            running += 1  # its completion wakes this resource: no need to wait here
    status = {"summarised": summarised}
    return ctx.settled(status=status, conditions=[ready(len(files), running, failed)])


def ready(total: int, running: int, failed: int) -> Condition:
    if failed:
        return condition_false(
            "Ready", "SummaryFailed", f"{failed} of {total} files could not be summarised"
        )
    if running:
        return condition_false("Ready", "Summarising", f"{running} of {total} files in progress")
    return condition_true("Ready", "AllSummarised", f"{total} files summarised")


resource_manager = define_resource_manager(
    name="summaries",
    initial_status=initial_status,
    reconcile=reconcile,
    spec_schema={
        "type": "object",
        "properties": {
            "folder": {"type": "string", "minLength": 1},
            "pattern": {"type": "string", "minLength": 1},
        },
        "required": ["folder"],
        "additionalProperties": False,
    },
)
