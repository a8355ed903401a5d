"""Effects that can be retried and effects that can be recovered, with real runners.

Every command and effect here records each execution by appending a line (its effect
key) to a file, so the tests count executions on the real external side.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from pathlib import Path
from typing import Any

import psutil
import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.engine.runner import RUNNER_PROCESS_NAME
from tests.conftest import Processes, write_workflow
from tests.server.runs import TERMINAL, start_run, wait_fifo, wait_for

pytestmark = pytest.mark.timeout(120)

# The first execution of the command announces itself on the FIFO and blocks, so the
# test can pause the run mid-command; every later execution goes straight through.
SHELL_STEP = """
from pi_workflows import compute, define_workflow, shell
from pi_workflows.engine import NOT_APPLIED

LOG, FIFO, MARKER = {log!r}, {fifo!r}, {marker!r}
SCRIPT = (
    'echo "$PI_WORKFLOWS_EFFECT_KEY" >> "$0"; '
    'if [ "$(wc -l < "$0")" -eq 1 ]; then {before_block}echo go > "$1"; sleep 300; fi; '
    'touch "$2"; echo deployed'
)

def read_back(key, request):
    import os
    return {{"proof": "marker"}} if os.path.exists(MARKER) else NOT_APPLIED

workflow = define_workflow(
    name="deploy",
    start_at="deploy",
    nodes={{
        "deploy": shell(lambda ctx: ["sh", "-c", SCRIPT, LOG, FIFO, MARKER], {options}),
        "after": compute(lambda ctx: {{"deployed": ctx.outputs["deploy"]}}),
    }},
    edges=[{{"from": "deploy", "to": "after"}}],
)
"""


def _shell_workflow(project: Path, tmp: Path, options: str = "", before_block: str = "") -> Path:
    """Write the `deploy` workflow; return the execution log."""
    log, fifo, marker = tmp / "executions.log", tmp / "go.fifo", tmp / "took-effect"
    os.mkfifo(fifo)
    source = SHELL_STEP.format(
        log=str(log),
        fifo=str(fifo),
        marker=str(marker),
        options=options,
        before_block=before_block,
    )
    write_workflow(project, "deploy", source)
    return log


def _executions(log: Path) -> list[str]:
    return log.read_text().splitlines()


def _pause_mid_command_and_resume(client: WorkflowClient, run_id: str, fifo: Path) -> None:
    wait_fifo(fifo)  # the command is running (and blocked)
    client.call("run.pause", run_id=run_id)
    wait_for(client, run_id, {"paused"})
    client.call("run.resume", run_id=run_id)


def _verify_clean(client: WorkflowClient) -> None:
    report = client.call("state.verify")["receipt"]
    assert report["consistent"], report["findings"]


def _read_db(server: WorkflowServer, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    database = sqlite3.connect(f"file:{server.state_dir / 'state.sqlite'}?mode=ro", uri=True)
    try:
        return [tuple(row) for row in database.execute(sql, params).fetchall()]
    finally:
        database.close()


def _effect_attempts(server: WorkflowServer, run_id: str) -> list[tuple[Any, ...]]:
    return _read_db(
        server,
        "SELECT a.attempt_number, a.state, a.recovery FROM effect_attempts AS a"
        " JOIN effects AS e ON e.effect_id = a.effect_id WHERE e.run_id = ?"
        " ORDER BY a.attempt_number",
        run_id,
    )


def _recovered_events(server: WorkflowServer, run_id: str) -> list[tuple[dict[str, Any], int]]:
    rows = _read_db(
        server,
        "SELECT payload, recorded_at FROM events WHERE run_id = ? AND event_type = ?"
        " ORDER BY revision",
        run_id,
        "effect_recovered",
    )
    return [(json.loads(payload), recorded_at) for payload, recorded_at in rows]


def _park_ambiguous(server: WorkflowServer, short_tmp: Path) -> tuple[str, Path]:
    """Start the default (not idempotent) deploy, pause it mid-command, resume: ambiguous."""
    project = short_tmp / "project"
    log = _shell_workflow(project, short_tmp)
    with WorkflowClient(server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "deploy", {})
        _pause_mid_command_and_resume(client, run_id, short_tmp / "go.fifo")
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
        assert view["display"]["status"] == "ambiguous", view
        assert view["display"]["reason"] == "effectAmbiguous"
        _verify_clean(client)
    assert len(_executions(log)) == 1, "the command never ran a second time by itself"
    return run_id, log


# --- Idempotent shell and ctx.effect ------------------------------------------------------


def test_pause_and_resume_during_an_idempotent_shell_step_runs_it_again(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    log = _shell_workflow(project, short_tmp, options="idempotent=True")
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "deploy", {})
        _pause_mid_command_and_resume(client, run_id, short_tmp / "go.fifo")
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
        assert view["display"]["status"] == "completed", view
        _verify_clean(client)
    first, second = _executions(log)
    assert first == second and first.startswith("sha256:"), "the same key both times"
    assert _effect_attempts(running_server, run_id) == [
        (1, "interrupted", None),
        (2, "applied", None),
    ]


def test_a_graceful_stop_during_an_idempotent_shell_step_runs_it_again_on_the_next_server(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    log = _shell_workflow(project, short_tmp, options="idempotent=True")
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "deploy", {})
        wait_fifo(short_tmp / "go.fifo")
    running_server.stop("test", drain_s=0)  # hands the run back at once; its command is stopped
    successor = WorkflowServer(
        running_server.state_dir, idle_exit_s=None, tick_s=0.05, execute_runs=True
    )
    successor.start()
    try:
        with WorkflowClient(successor.state_dir, autostart=False) as client:
            view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
            assert view["display"]["status"] == "completed", view
            _verify_clean(client)
    finally:
        successor.stop("test teardown")
    first, second = _executions(log)
    assert first == second
    assert _effect_attempts(running_server, run_id) == [
        (1, "interrupted", None),
        (2, "applied", None),
    ]


EFFECT_KILLED = """
import time
from pathlib import Path
from pi_workflows import action, define_workflow

LOG, FIFO = Path({log!r}), {fifo!r}

def apply(key, request):
    with LOG.open("a") as log:
        log.write(key + "\\n")  # the external system saw the key
    if len(LOG.read_text().splitlines()) == 1:
        with open(FIFO, "w") as pipe:
            pipe.write("applying")
        time.sleep(300)  # the runner is killed here, before it can settle
    return {{"charged": request["amount"], "key": key}}

def charge(ctx):
    return ctx.effect("payment.charge", {{"amount": 5}}, apply=apply, idempotent=True)

workflow = define_workflow(name="pay", start_at="charge", nodes={{"charge": action(charge)}})
"""


def test_an_idempotent_effect_is_applied_again_with_its_key_after_a_runner_sigkill(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    log, fifo = short_tmp / "charges.log", short_tmp / "applying.fifo"
    os.mkfifo(fifo)
    write_workflow(project, "pay", EFFECT_KILLED.format(log=str(log), fifo=str(fifo)))
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "pay", {})
        wait_fifo(fifo)
        (pid,) = [
            child.pid
            for child in psutil.Process().children(recursive=True)
            if child.name() == RUNNER_PROCESS_NAME
        ]
        os.killpg(pid, signal.SIGKILL)
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
        assert view["display"]["status"] == "completed", view
        assert client.call("server.status")["receipt"]["ambiguousEffects"] == 0
        _verify_clean(client)
    first, second = _executions(log)
    assert first == second, "applied again with the same idempotency key"
    assert _effect_attempts(running_server, run_id) == [
        (1, "interrupted", None),
        (2, "applied", None),
    ]


# --- Shell read-back ------------------------------------------------------------------


@pytest.mark.parametrize("took_effect", [True, False], ids=["applied", "not-applied"])
def test_a_shell_read_back_proves_whether_an_interrupted_command_took_effect(
    running_server: WorkflowServer, short_tmp: Path, took_effect: bool
) -> None:
    project = short_tmp / "project"
    # "applied": the first execution leaves its mark before it blocks, so read-back
    # proves it took effect; otherwise read-back proves it did not and it runs again.
    log = _shell_workflow(
        project,
        short_tmp,
        options="read_back=read_back",
        before_block='touch "$2"; ' if took_effect else "",
    )
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "deploy", {})
        _pause_mid_command_and_resume(client, run_id, short_tmp / "go.fifo")
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
        assert view["display"]["status"] == "completed", view
        _verify_clean(client)
    output = _read_db(
        running_server,
        "SELECT state FROM effects WHERE run_id = ? AND effect_type = 'shell'",
        run_id,
    )
    assert output == [("applied",)]
    if took_effect:
        assert len(_executions(log)) == 1, "proven applied: the command did not run again"
        assert _effect_attempts(running_server, run_id) == [(1, "applied", None)]
    else:
        assert len(_executions(log)) == 2, "proven not applied: the command ran again"
        assert _effect_attempts(running_server, run_id) == [
            (1, "cancelled", None),
            (2, "applied", None),
        ]


# --- Operator recovery ------------------------------------------------------------------


def test_recover_confirm_lets_an_ambiguous_run_complete_without_running_the_command_again(
    running_server: WorkflowServer, short_tmp: Path, processes: Processes
) -> None:
    run_id, log = _park_ambiguous(running_server, short_tmp)
    state_dir = running_server.state_dir
    status = processes.cli(state_dir, "run", "status", run_id)
    assert status.returncode == 0, status.stderr
    assert "ambiguous effect: shell at node deploy" in status.stdout
    assert f"pi-workflows run recover {run_id} confirm" in status.stdout
    assert f"pi-workflows run recover {run_id} retry" in status.stdout
    confirmed = processes.cli(
        state_dir, "run", "recover", run_id, "confirm", "--result-json", '{"exitCode": 0}'
    )
    assert confirmed.returncode == 0, confirmed.stderr
    assert "recorded as applied" in confirmed.stdout
    assert "continues" in confirmed.stdout
    with WorkflowClient(state_dir, autostart=False) as client:
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
        assert view["display"]["status"] == "completed", view
        assert "ambiguousEffects" not in view
        _verify_clean(client)
    assert len(_executions(log)) == 1, "confirm never ran the command again"
    assert _effect_attempts(running_server, run_id) == [(1, "applied", "confirmed")]
    ((event, recorded_at),) = _recovered_events(running_server, run_id)
    assert event["action"] == "confirm"
    assert event["effectType"] == "shell" and event["nodePath"] == "deploy"
    assert event["actor"]["kind"] == "operator"
    assert event["actor"]["clientId"].startswith("cli-")
    assert recorded_at > 0


def test_recover_retry_runs_the_command_exactly_once_more_and_warns(
    running_server: WorkflowServer, short_tmp: Path, processes: Processes
) -> None:
    run_id, log = _park_ambiguous(running_server, short_tmp)
    retried = processes.cli(running_server.state_dir, "run", "recover", run_id, "retry")
    assert retried.returncode == 0, retried.stderr
    assert "warning:" in retried.stderr and "twice" in retried.stderr
    assert "attempt 2" in retried.stdout
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
        assert view["display"]["status"] == "completed", view
        _verify_clean(client)
    first, second = _executions(log)
    assert first == second, "the retry used the same effect key"
    assert _effect_attempts(running_server, run_id) == [
        (1, "ambiguous", "retried"),
        (2, "applied", None),
    ]
    ((event, _),) = _recovered_events(running_server, run_id)
    assert (event["action"], event["nextAttemptNumber"]) == ("retry", 2)


def test_recover_commands_adopt_their_receipt_and_refuse_a_run_that_is_not_ambiguous(
    running_server: WorkflowServer, short_tmp: Path, processes: Processes
) -> None:
    run_id, log = _park_ambiguous(running_server, short_tmp)
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        first = client.request(
            "run.recover", {"action": "confirm"}, run_id=run_id, idempotency_key="recover-1"
        )
        again = client.request(
            "run.recover", {"action": "confirm"}, run_id=run_id, idempotency_key="recover-1"
        )
        assert first["outcome"] == "accepted", first
        assert again["outcome"] == "adopted", again
        assert again["receipt"] == first["receipt"]
        assert again["revision"] == first["revision"]
        # The same key with another payload is a conflict, not a second recovery.
        other = client.request(
            "run.recover", {"action": "retry"}, run_id=run_id, idempotency_key="recover-1"
        )
        assert (other["outcome"], other["error"]["code"]) == ("conflict", "idempotencyConflict")
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
        assert view["display"]["status"] == "completed"
        # A new recovery of the completed run is refused clearly, and that refusal is a
        # receipt too: its retry gets the same answer.
        refused = client.request(
            "run.recover", {"action": "retry"}, run_id=run_id, idempotency_key="recover-2"
        )
        assert refused["outcome"] == "rejected"
        assert refused["error"]["code"] == "runNotAmbiguous"
        repeated = client.request(
            "run.recover", {"action": "retry"}, run_id=run_id, idempotency_key="recover-2"
        )
        assert repeated["error"] == refused["error"]
        missing = client.request("run.recover", {"action": "confirm"}, run_id="run-absent")
        assert (missing["outcome"], missing["error"]["code"]) == ("notFound", "runNotFound")
        _verify_clean(client)
    assert len(_executions(log)) == 1
    assert len(_recovered_events(running_server, run_id)) == 1, "recorded once"
    state_dir = running_server.state_dir
    not_ambiguous = processes.cli(state_dir, "run", "recover", run_id, "confirm")
    assert not_ambiguous.returncode == 1
    assert "not parked on an ambiguous effect" in not_ambiguous.stderr
    unknown = processes.cli(state_dir, "run", "recover", "run-absent", "retry")
    assert unknown.returncode == 1 and "no run run-absent" in unknown.stderr
    bad_json = processes.cli(
        state_dir, "run", "recover", run_id, "confirm", "--result-json", "{nope"
    )
    assert bad_json.returncode == 2 and "not valid JSON" in bad_json.stderr


def test_recover_refuses_a_parked_run_without_an_ambiguous_effect(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    _shell_workflow(project, short_tmp, options="idempotent=True")
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "deploy", {})
        wait_fifo(short_tmp / "go.fifo")
        client.call("run.pause", run_id=run_id)
        wait_for(client, run_id, {"paused"})
        answer = client.request("run.recover", {"action": "confirm"}, run_id=run_id)
        assert (answer["outcome"], answer["error"]["code"]) == ("rejected", "noAmbiguousEffect")
        client.call("run.cancel", run_id=run_id)
        _verify_clean(client)
