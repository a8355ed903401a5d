"""`interaction.submit` and `interaction.update` through a real server (issue 12, item 5).

The agent step's request is a real one: a real runner commits it under its claim and
stays in the step. Here the step's `pi` is a stand-in that never answers (it keeps the
step pending for the runner's 60 s ready wait), so the submissions come from this test
as the bridge would send them; `tests/pi/test_agent_submit.py` does the same with the
real pi. The `validate` of the workflow announces itself on a FIFO and, when the output
asks it to, blocks on a second FIFO, so the test can kill its child, or the server,
while a submission is validating.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.engine.validate import VALIDATOR_PROCESS_NAME
from pi_workflows.wire.framing import encode_frame
from pi_workflows.wire.protocol import CLIENT_SCHEMA
from tests.conftest import Processes, write_workflow
from tests.server.runs import TERMINAL, start_run, wait_fifo, wait_for

pytestmark = pytest.mark.timeout(90)

AGENT = """
import os
import pathlib

from pi_workflows import agent, compute, define_workflow


def check(output, ctx):
    gate = pathlib.Path(os.environ["PIW_TEST_GATE"])
    if output.get("hold") and not (gate / "released").exists():
        with open(gate / "announce", "w") as pipe:
            pipe.write(str(os.getpid()))
        with open(gate / "gate") as pipe:  # blocks until the test writes (or kills us)
            pipe.read()
    if output["n"] < 0:
        raise ValueError("n must not be negative")
    return {"n": output["n"], "prep": ctx.outputs["prep"]}


workflow = define_workflow(
    name="ask",
    start_at="prep",
    nodes={
        "prep": compute(lambda ctx: {"ready": ctx.input["tag"]}),
        "ask": agent(
            prompt="Give n",
            output_schema={"type": "object", "properties": {"n": {"type": "integer"}},
                           "required": ["n"]},
            validate=check,
            provider="fake",
            model="fake-model",
            timeout=120,
        ),
    },
    edges=[{"from": "prep", "to": "ask"}],
)
"""


def _stand_in_pi(folder: Path) -> Path:
    """A `pi` that never answers: the runner's step stays pending (honestly) meanwhile."""
    path = folder / "silent-pi"
    path.write_text("#!/bin/sh\nexec sleep 300\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def gate(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = short_tmp / "gate"
    folder.mkdir()
    os.mkfifo(folder / "announce")
    os.mkfifo(folder / "gate")
    # Set before the server starts: its zygote and children inherit the environment.
    monkeypatch.setenv("PIW_TEST_GATE", str(folder))
    monkeypatch.setenv("PI_WORKFLOWS_PI", str(_stand_in_pi(short_tmp)))
    return folder


@pytest.fixture
def server(state_dir: Path, gate: Path) -> Iterator[WorkflowServer]:
    instance = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=True)
    instance.start()
    try:
        yield instance
    finally:
        instance.stop("test teardown", 0)


def _database(state_dir: Path) -> Path:
    (database,) = Path(state_dir).rglob("*.sqlite")
    return database


def _rows(state_dir: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(_database(state_dir))) as conn:
        return conn.execute(sql, args).fetchall()


def pending_request(state_dir: Path, run_id: str, timeout: float = 30) -> str:
    """Wait until the run's agent step committed its request; return its ID."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(sqlite3.OperationalError, ValueError):  # not created yet
            rows = _rows(
                state_dir,
                "SELECT request_id FROM interactive_requests WHERE run_id = ? "
                "AND status = 'pending'",
                run_id,
            )
            if rows:
                return str(rows[0][0])
        time.sleep(0.05)
    raise AssertionError("the agent step never committed its request")


def submit(
    client: WorkflowClient, run_id: str, request_id: str, value: Any, key: str
) -> dict[str, Any]:
    payload = {
        "interactionId": request_id,
        "submissionId": f"sub-{uuid.uuid4().hex}",
        "value": value,
    }
    return dict(client.request("interaction.submit", payload, run_id=run_id, idempotency_key=key))


def send_and_hang_up(state_dir: Path, run_id: str, request_id: str, value: Any, key: str) -> None:
    """Send one submit, then close the connection without reading its answer."""
    client = WorkflowClient(state_dir, autostart=False)
    frame = {
        "schema": CLIENT_SCHEMA,
        "type": "request",
        "requestId": f"r-{uuid.uuid4().hex}",
        "clientId": "bridge-test",
        "operation": "interaction.submit",
        "idempotencyKey": key,
        "runId": run_id,
        "payload": {"interactionId": request_id, "submissionId": "sub-first", "value": value},
    }
    client.send_raw(encode_frame(frame))
    client.close()


def accepted_rows(state_dir: Path, request_id: str) -> list[tuple[Any, ...]]:
    return _rows(
        state_dir,
        "SELECT submission_id FROM interactive_submissions WHERE request_id = ? "
        "AND outcome = 'accepted'",
        request_id,
    )


def stored_value(state_dir: Path, request_id: str) -> Any:
    """What the step's runner reads back (`interaction.requested`): the accepted value."""
    (receipt,) = _rows(
        state_dir,
        "SELECT b.content FROM interactive_requests r JOIN interactive_submissions s "
        "ON s.submission_id = r.accepted_submission_id JOIN blobs b ON b.digest = s.receipt_hash "
        "WHERE r.request_id = ? AND r.status = 'settled'",
        request_id,
    )[0]
    return json.loads(receipt)["value"]


def _started(state_dir: Path, project: Path) -> tuple[str, str]:
    write_workflow(project, "ask", AGENT)
    with WorkflowClient(state_dir, autostart=False) as client:
        run_id = start_run(client, project, "ask", {"tag": "t1"})
    return run_id, pending_request(state_dir, run_id)


def test_an_invalid_output_is_rejected_with_the_schema_error_then_a_corrected_one_accepted(
    server: WorkflowServer, short_tmp: Path
) -> None:
    state_dir = server.state_dir
    run_id, request_id = _started(state_dir, short_tmp / "project")
    with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
        wrong_type = submit(client, run_id, request_id, {"n": "three"}, "call-1")
        negative = submit(client, run_id, request_id, {"n": -1}, "call-2")
        repeat = submit(client, run_id, request_id, {"n": "three"}, "call-1")
        good = submit(client, run_id, request_id, {"n": 3}, "call-3")
        again = submit(client, run_id, request_id, {"n": 3}, "call-3")
        late = submit(client, run_id, request_id, {"n": 4}, "call-4")
    assert wrong_type["outcome"] == "rejected", wrong_type
    assert wrong_type["error"]["code"] == "submissionRejected"
    assert "output_schema" in wrong_type["error"]["message"]
    assert "is not of type 'integer'" in wrong_type["error"]["message"]
    assert negative["outcome"] == "rejected"
    assert "n must not be negative" in negative["error"]["message"]
    assert repeat["error"] == wrong_type["error"], "a repeat returns the stored rejection"
    assert good["outcome"] == "accepted", good
    assert good["receipt"]["status"] == "accepted"
    assert again["outcome"] == "adopted"
    assert again["receipt"] == good["receipt"]
    assert late["outcome"] == "claimLost", "a settled request takes nothing more"
    assert len(accepted_rows(state_dir, request_id)) == 1
    # validate's value, built from the run's committed state, is the step's output.
    assert stored_value(state_dir, request_id) == {"n": 3, "prep": {"ready": "t1"}}


def test_same_key_after_a_reconnect_waits_and_adopts_another_payload_conflicts(
    server: WorkflowServer, short_tmp: Path, gate: Path
) -> None:
    state_dir = server.state_dir
    run_id, request_id = _started(state_dir, short_tmp / "project")
    held = {"n": 5, "hold": True}
    send_and_hang_up(state_dir, run_id, request_id, held, "call-1")
    pid = int(wait_fifo(gate / "announce"))  # validating now, its first connection gone
    assert psutil.Process(pid).name() == VALIDATOR_PROCESS_NAME
    answers: list[dict[str, Any]] = []

    def retry() -> None:
        with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
            answers.append(submit(client, run_id, request_id, held, "call-1"))

    waiting = threading.Thread(target=retry)
    waiting.start()
    with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
        other = submit(client, run_id, request_id, {"n": 6}, "call-1")
        busy = submit(client, run_id, request_id, {"n": 7}, "call-2")
    assert other["outcome"] == "conflict", other
    assert busy["outcome"] == "rejected", "one candidate validates at a time"
    assert waiting.is_alive(), "the retry is held until the durable outcome"
    with open(gate / "gate", "w") as pipe:
        pipe.write("go")
    waiting.join(60)
    assert [a["outcome"] for a in answers] == ["adopted"], answers
    assert answers[0]["receipt"] == {"submissionId": "sub-first", "status": "accepted"}
    assert [row[0] for row in accepted_rows(state_dir, request_id)] == ["sub-first"]


def test_a_killed_validation_child_rejects_the_submission_and_a_retry_succeeds(
    server: WorkflowServer, short_tmp: Path, gate: Path
) -> None:
    state_dir = server.state_dir
    run_id, request_id = _started(state_dir, short_tmp / "project")
    answers: list[dict[str, Any]] = []

    def first() -> None:
        with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
            answers.append(submit(client, run_id, request_id, {"n": 1, "hold": True}, "call-1"))

    waiting = threading.Thread(target=first)
    waiting.start()
    pid = int(wait_fifo(gate / "announce"))
    assert psutil.Process(pid).name() == VALIDATOR_PROCESS_NAME
    os.kill(pid, signal.SIGKILL)
    waiting.join(60)
    assert [a["outcome"] for a in answers] == ["rejected"], answers
    assert "stopped before it reported" in answers[0]["error"]["message"]
    (status,) = _rows(
        state_dir, "SELECT status FROM interactive_requests WHERE request_id = ?", request_id
    )[0]
    assert status == "pending", "the request stays ready for a corrected retry"
    with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
        retried = submit(client, run_id, request_id, {"n": 1}, "call-2")
    assert retried["outcome"] == "accepted", retried
    assert len(accepted_rows(state_dir, request_id)) == 1


def test_unknown_and_stale_requests_are_refused_and_updates_are_recorded(
    server: WorkflowServer, short_tmp: Path
) -> None:
    state_dir = server.state_dir
    run_id, request_id = _started(state_dir, short_tmp / "project")
    with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
        unknown = submit(client, run_id, "request-attempt-nope", {"n": 1}, "call-1")
        other_run = submit(client, "run-other", request_id, {"n": 1}, "call-2")
        update = {
            "interactionId": request_id,
            "update": {"type": "progress", "key": "k", "data": {"p": 1}},
        }
        first = client.request("interaction.update", update, run_id=run_id, idempotency_key="u-1")
        repeat = client.request("interaction.update", update, run_id=run_id, idempotency_key="u-1")
        accepted = submit(client, run_id, request_id, {"n": 2}, "call-3")
        stale_update = client.request(
            "interaction.update", update, run_id=run_id, idempotency_key="u-2"
        )
    assert unknown["outcome"] == "notFound", unknown
    assert other_run["outcome"] == "notFound", other_run
    assert first["outcome"] == "accepted", first
    assert repeat["outcome"] == "adopted"
    assert accepted["outcome"] == "accepted"
    assert stale_update["outcome"] == "claimLost", stale_update
    events = _rows(
        state_dir,
        "SELECT payload FROM events WHERE run_id = ? AND event_type = 'interaction_update'",
        run_id,
    )
    assert [json.loads(p)["data"] for (p,) in events] == [{"p": 1}], "recorded once"


@pytest.fixture
def impatient_server(
    state_dir: Path, gate: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[WorkflowServer]:
    monkeypatch.setenv("PI_WORKFLOWS_VALIDATE_TIMEOUT_S", "1")
    instance = WorkflowServer(state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=True)
    instance.start()
    try:
        yield instance
    finally:
        instance.stop("test teardown", 0)


def test_a_validation_child_over_its_timeout_is_killed_and_the_submission_rejected(
    impatient_server: WorkflowServer, short_tmp: Path, gate: Path
) -> None:
    state_dir = impatient_server.state_dir
    run_id, request_id = _started(state_dir, short_tmp / "project")
    answers: list[dict[str, Any]] = []

    def first() -> None:
        with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
            answers.append(submit(client, run_id, request_id, {"n": 1, "hold": True}, "call-1"))

    waiting = threading.Thread(target=first)
    waiting.start()
    validator = psutil.Process(int(wait_fifo(gate / "announce")))  # it blocks, never reports
    waiting.join(60)
    assert [a["outcome"] for a in answers] == ["rejected"], answers
    assert "took longer than 1 s" in answers[0]["error"]["message"]
    validator.wait(30)  # killed, not left running
    with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
        assert submit(client, run_id, request_id, {"n": 1}, "call-2")["outcome"] == "accepted"


# --- a server SIGKILLed while a submission validates ---------------------------------------


def _serve(processes: Processes, state_dir: Path) -> subprocess.Popen[str]:
    server = processes.spawn_cli(state_dir, "server", "run", "--idle-exit", "0")
    assert server.stdout is not None
    line = server.stdout.readline()
    assert "running" in line, line
    return server


def test_a_submission_validating_when_the_server_died_is_validated_again_and_adopted(
    processes: Processes, state_dir: Path, short_tmp: Path, gate: Path
) -> None:
    server = _serve(processes, state_dir)
    run_id, request_id = _started(state_dir, short_tmp / "project")
    held = {"n": 8, "hold": True}
    send_and_hang_up(state_dir, run_id, request_id, held, "call-1")
    pid = int(wait_fifo(gate / "announce"))
    validator = psutil.Process(pid)
    assert validator.name() == VALIDATOR_PROCESS_NAME
    os.kill(server.pid, signal.SIGKILL)
    server.wait(30)
    validator.wait(30)  # the zygote ends its children when the server is gone
    (outcome,) = _rows(
        state_dir, "SELECT outcome FROM interactive_submissions WHERE request_id = ?", request_id
    )[0]
    assert outcome == "validating"
    (gate / "released").touch()  # the next validation of it does not block
    _serve(processes, state_dir)
    with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
        retried = submit(client, run_id, request_id, held, "call-1")
    assert retried["outcome"] == "adopted", retried
    assert retried["receipt"] == {"submissionId": "sub-first", "status": "accepted"}
    assert [row[0] for row in accepted_rows(state_dir, request_id)] == ["sub-first"]
    assert stored_value(state_dir, request_id) == {"n": 8, "prep": {"ready": "t1"}}
    # The restarted run's new attempt of the step adopted that output: it asked nothing.
    with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
    assert view["display"]["status"] == "completed", view
    assert _ask_outputs(state_dir, run_id) == [{"n": 8, "prep": {"ready": "t1"}}]
    assert _request_count(state_dir, run_id) == 1, "the step was not asked for again"


def _ask_outputs(state_dir: Path, run_id: str) -> list[Any]:
    rows = _rows(
        state_dir,
        "SELECT b.content FROM node_attempts a JOIN blobs b ON b.digest = a.output_hash "
        "WHERE a.run_id = ? AND a.node_path = 'ask' AND a.status = 'completed'",
        run_id,
    )
    return [json.loads(content) for (content,) in rows]


def _request_count(state_dir: Path, run_id: str) -> int:
    (count,) = _rows(
        state_dir, "SELECT count(*) FROM interactive_requests WHERE run_id = ?", run_id
    )[0]
    return int(count)


def _runner_of(project: Path) -> psutil.Process:
    for process in psutil.process_iter(["name", "cwd"]):
        if process.info["name"] == "piw-runner" and process.info["cwd"] == str(project):
            return process
    raise AssertionError("no runner serves the project")


def _attempts_of_ask(state_dir: Path, run_id: str) -> list[str]:
    rows = _rows(
        state_dir,
        "SELECT status FROM node_attempts WHERE run_id = ? AND node_path = 'ask' "
        "ORDER BY started_at, rowid",
        run_id,
    )
    return [status for (status,) in rows]


def test_a_runner_lost_while_its_output_validates_leaves_the_next_attempt_to_adopt_it(
    server: WorkflowServer, short_tmp: Path, gate: Path
) -> None:
    # The runner dies while the step's output validates. The next attempt of the step
    # must neither ask again (a second output could then be accepted) nor lose the
    # output: it waits for the outcome, then adopts the accepted value.
    state_dir = server.state_dir
    project = short_tmp / "project"
    run_id, request_id = _started(state_dir, project)
    answers: list[dict[str, Any]] = []

    def held() -> None:
        with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
            answers.append(submit(client, run_id, request_id, {"n": 5, "hold": True}, "call-1"))

    waiting = threading.Thread(target=held)
    waiting.start()
    wait_fifo(gate / "announce")  # validating now
    runner = _runner_of(project)
    runner.kill()
    runner.wait(30)
    deadline = time.monotonic() + 60
    while (
        _attempts_of_ask(state_dir, run_id)[-1:] != ["running"]
        or len(_attempts_of_ask(state_dir, run_id)) < 2
    ):
        assert time.monotonic() < deadline, _attempts_of_ask(state_dir, run_id)
        time.sleep(0.05)  # a state in SQLite has no event to wait on
    assert _request_count(state_dir, run_id) == 1, "no new request while it validates"
    with open(gate / "gate", "w") as pipe:  # let the validation finish
        pipe.write("go")
    waiting.join(60)
    assert [a["outcome"] for a in answers] == ["accepted"], answers
    with WorkflowClient(state_dir, autostart=False, timeout=60) as client:
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
    assert view["display"]["status"] == "completed", view
    assert _ask_outputs(state_dir, run_id) == [{"n": 5, "prep": {"ready": "t1"}}]
    assert _request_count(state_dir, run_id) == 1, "the step was not asked for again"
    assert [row[0] for row in accepted_rows(state_dir, request_id)] != []
