"""Safe errors (issue 11, item 9): a refusal names the place and the rule, never the value.

A secret-looking marker in a `run.start` input, in a checkpoint answer or in an unknown
workflow's name must not reach the response, the stored receipt (read straight from
the SQLite file, read-only), the server's logs or the CLI's stderr; the refusal still
names the field (a JSON Pointer) and the rule. The one exception is by design: the CLI
shows the workflow name the user typed on the user's own stderr, next to the names
that exist; the server's answer and receipt never carry it.

Everything runs against a real server process (`pi-workflows server run`), its socket,
its resolver and runner children, and the CLI as a child process.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient
from tests.conftest import Processes, write_workflow
from tests.server.runs import TERMINAL, wait_for
from tests.server.test_checkpoint_answers import APPROVAL

pytestmark = pytest.mark.timeout(180)

MARKER = "MARKER-7f3a"
"""Stands for a secret: it must appear nowhere the server writes or answers."""
NAME_MARKER = "MARKER-name-51c0"
"""A secret typed as a workflow name: only the user's own CLI stderr may show it."""

TYPED = """
from pathlib import Path

from pi_workflows import compute, define_workflow

with (Path(__file__).parent / "typed.loads").open("a") as loads:
    loads.write("loaded\\n")  # one line each time a process loads this workflow

workflow = define_workflow(
    name="typed",
    start_at="echo",
    input_schema={
        "type": "object",
        "required": ["count"],
        "properties": {"count": {"type": "integer"}, "mode": {"enum": ["a", "b", "c"]}},
        "additionalProperties": False,
    },
    nodes={"echo": compute(lambda ctx: {"echo": ctx.input})},
)
"""


@dataclass
class Daemon:
    state_dir: Path
    project: Path
    child: subprocess.Popen[str]


@pytest.fixture
def daemon(processes: Processes, short_tmp: Path) -> Iterator[Daemon]:
    state_dir = short_tmp / "agent" / "workflows"
    project = short_tmp / "project"
    write_workflow(project, "typed", TYPED)
    write_workflow(project, "approval", APPROVAL)
    child = processes.spawn_cli(state_dir, "server", "run", "--idle-exit", "0")
    assert child.stdout is not None
    line = child.stdout.readline()
    assert "running" in line, f"server did not start: {line!r}"
    yield Daemon(state_dir, project, child)


def _stop(daemon: Daemon) -> str:
    """Stop the server gracefully; return what it printed (its own stdout and stderr)."""
    with WorkflowClient(daemon.state_dir, autostart=False) as client:
        client.call("server.stop", {"drainSeconds": 5})
    out, err = daemon.child.communicate(timeout=60)  # reaps it: the test is its parent
    return out + err


def _stored_rejections(state_dir: Path) -> list[dict[str, Any]]:
    """Every stored `rejected` receipt body, read from the database file (read-only)."""
    database = sqlite3.connect(f"file:{state_dir / 'state.sqlite'}?mode=ro", uri=True)
    try:
        rows = database.execute(
            "SELECT receipt FROM host_commands WHERE outcome = 'rejected'"
        ).fetchall()
    finally:
        database.close()
    return [json.loads(bytes(content)) for (content,) in rows]


def _state_bytes(state_dir: Path) -> bytes:
    """The raw database, its WAL and every log file: nothing may hold a marker."""
    files = [state_dir / "state.sqlite", state_dir / "state.sqlite-wal"]
    files += sorted((state_dir / "logs").rglob("*"))
    return b"".join(path.read_bytes() for path in files if path.is_file())


def _start_cli(processes: Processes, daemon: Daemon, name: str, value: Any) -> str:
    refused = processes.cli(
        daemon.state_dir,
        "run",
        "start",
        name,
        "--project",
        str(daemon.project),
        "--input-json",
        json.dumps(value),
    )
    assert refused.returncode != 0
    assert refused.stdout == ""
    return refused.stderr


START_CASES = [
    ({"count": MARKER}, "/count", "must be integer"),
    ({"count": 1, "mode": MARKER}, "/mode", 'must be one of 3 values: "a", "b", "c"'),
    (
        {"count": 1, MARKER: 1},
        "/ (the whole input)",
        "has 1 property the schema does not allow (allowed: count, mode)",
    ),
    ({"mode": "a"}, "/count", "is required"),
]


def _check_start_refusals(processes: Processes, daemon: Daemon, expected: list[str]) -> None:
    """Each input case through the CLI and through a client: the same safe refusal."""
    for value, pointer, rule in START_CASES:
        says = f"input of workflow 'typed' is invalid at {pointer}: {rule}"
        stderr = _start_cli(processes, daemon, "typed", value)
        assert says in stderr, stderr
        assert MARKER not in stderr
        with WorkflowClient(daemon.state_dir, autostart=False) as client:
            direct = client.request(
                "run.start",
                {"workflow": "typed", "input": value, "projectPath": str(daemon.project)},
            )
        assert direct["outcome"] == "rejected"
        assert direct["error"]["code"] == "inputInvalid"
        assert says in direct["error"]["message"]
        assert MARKER not in json.dumps(direct)
        expected.append(says)


def test_refusals_name_the_field_and_the_rule_and_never_carry_the_value(
    processes: Processes, daemon: Daemon
) -> None:
    expected: list[str] = []
    _check_start_refusals(processes, daemon, expected)  # answered by resolver children
    with WorkflowClient(daemon.state_dir, autostart=False) as client:
        valid = {"workflow": "typed", "input": {"count": 1}, "projectPath": str(daemon.project)}
        run_id = client.call("run.start", valid)["receipt"]["runId"]
        assert wait_for(client, run_id, TERMINAL)["display"]["status"] == "completed"
    loads = daemon.project / ".pi" / "workflows" / "typed.loads"
    loaded = loads.read_text().count("loaded")
    _check_start_refusals(processes, daemon, expected)  # answered by the definition cache
    assert loads.read_text().count("loaded") == loaded, "the cache, not a resolver, refused"

    # An unknown name: the server names what exists, not what was asked for.
    stderr = _start_cli(processes, daemon, NAME_MARKER, {"note": MARKER})
    assert "no workflow has this name; available: approval, " in stderr, stderr
    assert f"workflow '{NAME_MARKER}'" in stderr, "the user's own name, on their own stderr"
    assert MARKER not in stderr, "the input is never shown"
    with WorkflowClient(daemon.state_dir, autostart=False) as client:
        missing = client.request(
            "run.start",
            {
                "workflow": NAME_MARKER,
                "input": {"note": MARKER},
                "projectPath": str(daemon.project),
            },
        )
    assert missing["outcome"] == "rejected"
    assert missing["error"]["code"] == "workflowNotFound"
    assert "MARKER" not in json.dumps(missing)

    # A checkpoint answer, checked by the server against the stored snapshot.
    with WorkflowClient(daemon.state_dir, autostart=False) as client:
        started = client.call(
            "run.start", {"workflow": "approval", "projectPath": str(daemon.project)}
        )
        run_id = started["receipt"]["runId"]
        waiting = wait_for(client, run_id, {"waiting"} | TERMINAL)
    assert waiting["display"]["status"] == "waiting", waiting
    for answer, where in (
        ({"approved": MARKER}, "at /approved: must be boolean"),
        ({"approved": True, "notes": ["ok", {"k": MARKER}]}, "at /notes/1: must be string"),
        ({"approved": True, MARKER: True}, "has 1 property the schema does not allow"),
    ):
        refused = processes.cli(
            daemon.state_dir, "run", "answer", run_id, "--input-json", json.dumps(answer)
        )
        assert refused.returncode != 0
        assert where in refused.stderr, refused.stderr
        assert MARKER not in refused.stderr
        with WorkflowClient(daemon.state_dir, autostart=False) as client:
            direct = client.request("run.answer", {"answer": answer}, run_id=run_id)
        assert direct["outcome"] == "rejected"
        assert direct["error"]["code"] == "answerInvalid"
        assert where in direct["error"]["message"]
        assert MARKER not in json.dumps(direct)
        expected.append(where)

    stored = _stored_rejections(daemon.state_dir)
    codes = sorted({receipt["code"] for receipt in stored})
    assert codes == ["answerInvalid", "inputInvalid", "workflowNotFound"]
    for says in expected:
        assert any(says in receipt["message"] for receipt in stored), says
    assert "MARKER" not in json.dumps(stored)

    output = _stop(daemon)
    assert "MARKER" not in output, "the server's own output"
    assert b"MARKER" not in _state_bytes(daemon.state_dir), "database, WAL or a log file"
