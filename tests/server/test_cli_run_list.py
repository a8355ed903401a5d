"""`pi-workflows run list` through the real CLI and a real server (issue 13, item 8).

Filters (--status, --workflow, --project, --since, --limit), --json, a rich table on
a terminal and plain lines on a pipe, and one clear error for a bad --since.
"""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.cli._run_list import parse_since
from tests.conftest import Processes, write_workflow
from tests.server.runs import start_run

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def runs(server: WorkflowServer, client: WorkflowClient, short_tmp: Path) -> dict[str, object]:
    alpha, beta = short_tmp / "alpha", short_tmp / "beta"
    write_workflow(alpha, "hello")
    write_workflow(beta, "other")
    hello = [start_run(client, alpha, "hello") for _ in range(4)]
    other = [start_run(client, beta, "other") for _ in range(2)]
    client.call("run.cancel", run_id=hello[0])
    return {"hello": hello, "other": other, "alpha": alpha, "beta": beta}


def _lines(done: subprocess.CompletedProcess[str]) -> list[list[str]]:
    assert done.returncode == 0, done.stderr
    return [line.split("\t") for line in done.stdout.splitlines()]


def test_plain_lines_and_filters(
    server: WorkflowServer, runs: dict[str, object], processes: Processes
) -> None:
    state = server.state_dir
    hello, other = runs["hello"], runs["other"]
    assert isinstance(hello, list) and isinstance(other, list)
    every = _lines(processes.cli(state, "run", "list"))
    assert [line[0] for line in every] == [*reversed(other), *reversed(hello)]  # newest first
    assert all(len(line) == 5 for line in every)
    statuses = {line[0]: line[1] for line in every}
    assert statuses[hello[0]] == "cancelled" and statuses[hello[1]] == "queued"

    cancelled = _lines(processes.cli(state, "run", "list", "--status", "cancelled"))
    assert [line[0] for line in cancelled] == [hello[0]]
    both = _lines(
        processes.cli(state, "run", "list", "--status", "cancelled", "--workflow", "other")
    )
    assert both == []
    by_workflow = _lines(processes.cli(state, "run", "list", "--workflow", "other"))
    assert sorted(line[0] for line in by_workflow) == sorted(other)
    by_project = _lines(processes.cli(state, "run", "list", "--project", str(runs["alpha"])))
    assert sorted(line[0] for line in by_project) == sorted(hello)

    limited = processes.cli(state, "run", "list", "--limit", "2")
    assert [line[0] for line in _lines(limited)] == list(reversed(other))
    assert "--limit" in limited.stderr  # says more exist

    assert len(_lines(processes.cli(state, "run", "list", "--since", "1h"))) == 6
    future = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert _lines(processes.cli(state, "run", "list", "--since", future)) == []


def test_json_document(
    server: WorkflowServer, runs: dict[str, object], processes: Processes
) -> None:
    done = processes.cli(server.state_dir, "run", "list", "--json", "--status", "queued")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert set(document) == {"revision", "items", "truncated"}
    hello, other = runs["hello"], runs["other"]
    assert isinstance(hello, list) and isinstance(other, list)
    assert sorted(item["runId"] for item in document["items"]) == sorted(hello[1:] + other)
    assert all(item["display"]["status"] == "queued" for item in document["items"])
    assert document["truncated"] is False


@pytest.mark.parametrize("bad", ["yesterday", "1x", "-5m", "2026-13-45"])
def test_a_bad_since_is_one_clear_usage_error(
    server: WorkflowServer, processes: Processes, bad: str
) -> None:
    done = processes.cli(server.state_dir, "run", "list", "--since", bad)
    assert done.returncode == 2 and done.stdout == ""
    assert "--since" in done.stderr and "ISO-8601" in done.stderr
    assert "Traceback" not in done.stderr


def test_since_forms() -> None:
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    hour_ago = int((now - timedelta(hours=1)).timestamp() * 1000)
    assert parse_since("1h", now) == hour_ago
    assert parse_since("60m", now) == hour_ago
    assert parse_since("2026-12-01T11:00:00Z") == hour_ago
    assert parse_since("2026-12-01T13:00:00+02:00") == hour_ago
    local = datetime(2026, 12, 1, 11, 0).astimezone()
    assert parse_since("2026-12-01T11:00") == int(local.timestamp() * 1000)


def test_a_terminal_gets_a_table(
    server: WorkflowServer, runs: dict[str, object], processes: Processes
) -> None:
    hello = runs["hello"]
    assert isinstance(hello, list)
    leader, follower = pty.openpty()
    env = dict(os.environ, COLUMNS="200", TERM="xterm-256color")
    env.pop("NO_COLOR", None)
    argv = [sys.executable, "-m", "pi_workflows.cli", "--state-dir", str(server.state_dir)]
    child = subprocess.Popen(
        [*argv, "run", "list"],
        stdout=follower,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    processes.started.append(child)  # type: ignore[arg-type]
    os.close(follower)
    output = b""
    while True:
        readable, _, _ = select.select([leader], [], [], 60)
        assert readable, "the CLI printed nothing"
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        output += chunk
    os.close(leader)
    assert child.wait(60) == 0
    text = output.decode()
    assert "RUN ID" in text and "STATUS" in text and "WORKFLOW" in text
    assert "\x1b[" in text, "colour on a terminal"
    assert all(run_id in text for run_id in hello)
    assert "\t" not in text, "a table, not the plain lines"
