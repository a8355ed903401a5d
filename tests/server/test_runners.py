"""Workflows that really run: runner processes, the runner protocol, effects, crashes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.engine.runner import RUNNER_PROCESS_NAME
from tests.conftest import write_workflow
from tests.server.runs import TERMINAL, start_run, wait_fifo, wait_for, wait_until

pytestmark = pytest.mark.timeout(120)


PIPELINE = """
from pi_workflows import action, compute, define_workflow, notify, shell

def double(ctx):
    return {{"n": ctx.input["n"] * 2}}

def charge(ctx):
    return ctx.effect(
        "payment.charge", {{"amount": ctx.outputs["double"]["n"]}},
        apply=lambda key, req: {{"charged": req["amount"], "key": key}},
    )

workflow = define_workflow(
    name="pipeline",
    start_at="double",
    nodes={{
        "double": compute(double),
        "build": shell(lambda ctx: ["sh", "-c", "echo built $0", str(ctx.outputs["double"]["n"])]),
        "charge": action(charge),
        "done": notify(lambda ctx: f"charged {{ctx.outputs['charge']['charged']}}"),
    }},
    edges=[
        {{"from": "double", "to": "build"}},
        {{"from": "build", "to": "charge"}},
        {{"from": "charge", "to": "done"}},
    ],
)
"""

# The first execution of `slow` announces itself on a FIFO and then blocks; a re-run
# (after its runner was killed) finds the counter at 2 and goes straight on.
CRASHY = """
import os, time
from pathlib import Path
from pi_workflows import compute, define_workflow

COUNTER = Path({counter!r})
FIFO = {fifo!r}

def slow(ctx):
    count = int(COUNTER.read_text()) + 1 if COUNTER.exists() else 1
    COUNTER.write_text(str(count))
    if count == 1:
        with open(FIFO, "w") as pipe:
            pipe.write("started")
        time.sleep(300)
    return {{"runs": count}}

workflow = define_workflow(
    name="crashy",
    start_at="slow",
    nodes={{"slow": compute(slow, timeout=600), "after": compute(lambda ctx: {{"ok": True}})}},
    edges=[{{"from": "slow", "to": "after"}}],
)
"""

EDITED = """
from pathlib import Path
Path({marker!r}).write_text("the edited workflow ran")
from pi_workflows import compute, define_workflow
workflow = define_workflow(
    name="crashy", start_at="slow", nodes={{"slow": compute(lambda ctx: {{}})}}
)
"""


def _wait_no_runners(client: WorkflowClient, timeout: float = 30) -> None:
    """Wait until the server reaped every runner (no event marks it: poll the status)."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while client.call("server.status")["receipt"]["activeRunners"]:
        assert time.monotonic() < deadline, "a runner was never reaped"
        pause.wait(0.02)


def _runner_pids(server: WorkflowServer) -> list[int]:
    pids = []
    for child in psutil.Process().children(recursive=True):
        # Another child (a resolver the zygote is reaping) may be gone by now.
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.name() == RUNNER_PROCESS_NAME:
                pids.append(child.pid)
    return pids


def test_a_pipeline_runs_to_completion_with_a_shell_and_an_effect(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "pipeline", PIPELINE.format())
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "pipeline", {"n": 21})
        view = wait_for(client, run_id, TERMINAL)
        assert view["display"]["status"] == "completed", view
        _wait_no_runners(client)
    database = sqlite3.connect(
        f"file:{running_server.state_dir / 'state.sqlite'}?mode=ro", uri=True
    )
    try:
        effects = database.execute(
            "SELECT effect_type, state FROM effects WHERE run_id = ? ORDER BY effect_type",
            (run_id,),
        ).fetchall()
        attempts = database.execute(
            "SELECT node_path, status FROM node_attempts WHERE run_id = ? ORDER BY started_at",
            (run_id,),
        ).fetchall()
        workers = database.execute(
            "SELECT status FROM runner_epochs WHERE run_id = ?", (run_id,)
        ).fetchall()
    finally:
        database.close()
    assert effects == [("payment.charge", "applied"), ("shell", "applied")]
    assert [node for node, _ in attempts] == ["double", "build", "charge", "done"]
    assert {status for _, status in attempts} == {"completed"}
    assert workers == [("exited",)]


def test_a_failing_node_fails_the_run_with_its_reason(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    source = (
        "from pi_workflows import compute, define_workflow\n"
        "def boom(ctx):\n    raise RuntimeError('kaboom')\n"
        "workflow = define_workflow(name='boom', start_at='b', nodes={'b': compute(boom)})\n"
    )
    write_workflow(project, "boom", source)
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "boom", {})
        view = wait_for(client, run_id, TERMINAL)
    assert view["display"]["status"] == "failed"
    assert "kaboom" in view["failureReason"]


def test_an_invalid_definition_is_rejected_and_commits_no_run(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "broken", "raise SystemExit('no')\n")
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        answer = client.request("run.start", {"workflow": "broken", "projectPath": str(project)})
        assert answer["outcome"] == "rejected"
        assert answer["error"]["code"] == "definitionInvalid"
        assert client.call("run.list")["receipt"]["items"] == []


def test_a_killed_runner_is_replaced_and_the_pure_node_runs_again(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    counter, fifo = short_tmp / "counter", short_tmp / "started.fifo"
    os.mkfifo(fifo)
    write_workflow(project, "crashy", CRASHY.format(counter=str(counter), fifo=str(fifo)))
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "crashy", {})
        wait_fifo(fifo)
        (pid,) = _runner_pids(running_server)
        os.killpg(pid, signal.SIGKILL)
        view = wait_for(client, run_id, TERMINAL)
    assert view["display"]["status"] == "completed"
    assert counter.read_text() == "2", "the interrupted compute node ran exactly once more"


def test_an_edited_workflow_never_runs_and_the_run_parks(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    counter, fifo = short_tmp / "counter", short_tmp / "started.fifo"
    marker = short_tmp / "edited-ran"
    os.mkfifo(fifo)
    path = write_workflow(project, "crashy", CRASHY.format(counter=str(counter), fifo=str(fifo)))
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "crashy", {})
        wait_fifo(fifo)
        path.write_text(EDITED.format(marker=str(marker)))
        (pid,) = _runner_pids(running_server)
        os.killpg(pid, signal.SIGKILL)
        wait_until(
            client, run_id, lambda item: item["display"].get("reason") == "workflowSourceChanged"
        )
        # A parked run with that reason is not claimed again on its own.
        _wait_no_runners(client)
        view = client.call("run.get", run_id=run_id)["receipt"]
        assert view["display"].get("reason") == "workflowSourceChanged"
        assert client.call("server.status")["receipt"]["activeRunners"] == 0
    assert not marker.exists(), "changed code must never execute"


def test_cancel_stops_a_live_runner_and_its_group(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    fifo = short_tmp / "started.fifo"
    os.mkfifo(fifo)
    write_workflow(project, "crashy", CRASHY.format(counter=str(short_tmp / "c"), fifo=str(fifo)))
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "crashy", {})
        wait_fifo(fifo)
        (pid,) = _runner_pids(running_server)
        runner = psutil.Process(pid)
        client.call("run.cancel", run_id=run_id)
        gone, _ = psutil.wait_procs([runner], timeout=30)
        assert gone, "the fenced runner was stopped"
        view = client.call("run.get", run_id=run_id)["receipt"]
    assert view["display"]["status"] == "cancelled"


# The first execution hands the runner's end of its channel to a process outside the
# server's tree (the test's own child, over SCM_RIGHTS), so neither a group kill nor the
# zygote's orphan stop reaches it; then the runner dies.
LEAKED_CHANNEL = """
import os, socket, stat
from pathlib import Path
from pi_workflows import compute, define_workflow

COUNTER = Path({counter!r})
HOLDER = {holder!r}

def sockets():
    # The runner took its channel's descriptor number out of the environment; its one
    # socket is that channel.
    fds = [int(name) for name in os.listdir("/proc/self/fd")]
    return tuple(fd for fd in fds if _is_socket(fd))

def _is_socket(fd):
    try:
        return stat.S_ISSOCK(os.fstat(fd).st_mode)
    except OSError:
        return False

def leak(ctx):
    count = int(COUNTER.read_text()) + 1 if COUNTER.exists() else 1
    COUNTER.write_text(str(count))
    if count == 1:
        fds = sockets()
        assert fds, "the runner's channel"
        with socket.socket(socket.AF_UNIX) as holder:
            holder.connect(HOLDER)
            socket.send_fds(holder, [b"fd"], list(fds))
            holder.recv(1)  # it holds the end now
        os._exit(1)
    return {{"runs": count}}

workflow = define_workflow(name="leaky", start_at="leak", nodes={{"leak": compute(leak)}})
"""

HOLDER = """
import socket, sys, time
with socket.socket(socket.AF_UNIX) as server:
    server.bind(sys.argv[1])
    server.listen(1)
    print("listening", flush=True)
    peer, _ = server.accept()
    _, fds, _, _ = socket.recv_fds(peer, 16, 8)
    peer.sendall(b"k")
    time.sleep(300)
"""


def test_a_dead_runner_is_handled_although_another_process_holds_its_channel(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    """The exit waits for the channel's last message, never for every holder of its end."""
    project = short_tmp / "project"
    counter, address = short_tmp / "counter", short_tmp / "holder.sock"
    write_workflow(
        project, "leaky", LEAKED_CHANNEL.format(counter=str(counter), holder=str(address))
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(address)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "listening\n"
        with WorkflowClient(running_server.state_dir, autostart=False) as client:
            run_id = start_run(client, project, "leaky", {})
            view = wait_for(client, run_id, TERMINAL)
        assert holder.poll() is None, "it still holds the end"
        assert view["display"]["status"] == "completed"
        assert view["generation"] == 2 and counter.read_text() == "2"
    finally:
        holder.kill()
        holder.wait(10)


EFFECT_CRASH = """
import time
from pathlib import Path
from pi_workflows import action, define_workflow
from pi_workflows.engine import NOT_APPLIED

APPLIED = Path({applied!r})
FIFO = {fifo!r}

def apply(key, request):
    count = int(APPLIED.read_text()) + 1 if APPLIED.exists() else 1
    APPLIED.write_text(str(count))  # the external system changed: the effect happened
    if count == 1:
        with open(FIFO, "w") as pipe:
            pipe.write("applying")
        time.sleep(300)  # the runner dies here, before it can settle
    return {{"charged": request["amount"]}}

def read_back(key, request):
    if not APPLIED.exists():
        return NOT_APPLIED  # provably not applied: the runner applies it now
    return {{"charged": request["amount"], "proof": "read-back"}}

def charge(ctx):
    return ctx.effect("payment.charge", {{"amount": 5}}, apply=apply, read_back={read_back})

workflow = define_workflow(name="pay", start_at="charge", nodes={{"charge": action(charge)}})
"""


@pytest.mark.parametrize("with_read_back", [True, False], ids=["read-back", "no-read-back"])
def test_an_effect_interrupted_while_applying_is_proved_or_marked_ambiguous(
    running_server: WorkflowServer, short_tmp: Path, with_read_back: bool
) -> None:
    project = short_tmp / "project"
    applied, fifo = short_tmp / "applied", short_tmp / "applying.fifo"
    os.mkfifo(fifo)
    source = EFFECT_CRASH.format(
        applied=str(applied), fifo=str(fifo), read_back="read_back" if with_read_back else "None"
    )
    write_workflow(project, "pay", source)
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "pay", {})
        wait_fifo(fifo)
        (pid,) = _runner_pids(running_server)
        os.killpg(pid, signal.SIGKILL)
        view = wait_for(client, run_id, TERMINAL | {"ambiguous"})
        status = client.call("server.status")["receipt"]
    assert applied.read_text() == "1", "the effect was never applied a second time"
    if with_read_back:
        assert view["display"]["status"] == "completed"
        assert status["ambiguousEffects"] == 0
    else:
        assert view["display"]["status"] == "ambiguous"
        assert status["ambiguousEffects"] == 1


def test_cli_run_wait_and_workflows_list(processes: Any, state_dir: Path, short_tmp: Path) -> None:
    project = short_tmp / "project"
    write_workflow(project, "pipeline", PIPELINE.format())
    listed = processes.cli(state_dir, "workflows", "list", "--project", str(project), "--json")
    names = {row["name"]: row["origin"] for row in json.loads(listed.stdout)}
    assert names["pipeline"] == "project" and names["hello"] == "builtin"
    started = processes.cli(
        state_dir, "run", "start", "pipeline", "--project", str(project), "--input-json", '{"n": 2}'
    )
    assert started.returncode == 0, started.stderr
    processes.adopt(int((state_dir / "host" / "server.lock").read_text().strip()))
    run_id = started.stdout.strip()
    waited = processes.cli(state_dir, "run", "wait", run_id, "--timeout", "60", "--json")
    assert waited.returncode == 0, waited.stderr
    assert json.loads(waited.stdout)["display"]["status"] == "completed"
    hello = processes.cli(state_dir, "run", "start", "hello", "--project", str(project))
    assert processes.cli(state_dir, "run", "wait", hello.stdout.strip()).returncode == 0
    failing = processes.cli(
        state_dir,
        "run",
        "start",
        "pipeline",
        "--project",
        str(project),
        "--input-json",
        "{}",
    )
    assert failing.returncode == 0, failing.stderr
    result = processes.cli(state_dir, "run", "wait", failing.stdout.strip(), "--json")
    assert result.returncode == 1, result.stdout
    assert json.loads(result.stdout)["display"]["status"] == "failed"
    processes.cli(state_dir, "server", "stop")


TIMEOUTS = """
import time
from pi_workflows import compute, define_workflow

edges = {edges}
workflow = define_workflow(
    name="late",
    start_at="slow",
    nodes={{
        "slow": compute(lambda ctx: time.sleep(300) or {{}}, timeout=1),
        "recover": compute(lambda ctx: {{"recovered": True}}),
    }},
    edges=edges,
)
"""
ROUTE_TIMEOUT = (
    '[{"from": "slow", "switch": {"on": "$result.outcome", '
    '"cases": {"timed_out": "recover"}, "default": "recover"}}]'
)


@pytest.mark.parametrize("routed", [True, False], ids=["routed", "unrouted"])
def test_a_node_past_its_deadline_is_stopped_and_timed_out(
    running_server: WorkflowServer, short_tmp: Path, routed: bool
) -> None:
    project = short_tmp / "project"
    source = TIMEOUTS.format(edges=ROUTE_TIMEOUT)
    if not routed:  # the same slow node alone, with no edge for its outcome
        source = source.replace(
            '        "recover": compute(lambda ctx: {"recovered": True}),\n', ""
        ).replace("edges=edges,", "edges=[],")
    write_workflow(project, "late", source)
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "late", {})
        view = wait_for(client, run_id, TERMINAL)
    steps = [(step["node"], step["status"]) for step in view["steps"]]
    if routed:
        assert view["display"]["status"] == "completed"
        assert steps == [("slow", "timed_out"), ("recover", "completed")]
    else:
        assert view["display"]["status"] == "timed_out"
        assert steps == [("slow", "timed_out")]


RELEASE = """
from pi_workflows import action, checkpoint, compute, define_workflow, shell

def publish(ctx):
    return ctx.effect("release.publish", {{"v": ctx.outputs["plan"]["v"]}},
                      apply=lambda key, req: {{"published": req["v"]}})

workflow = define_workflow(
    name="release",
    start_at="plan",
    nodes={{
        "plan": compute(lambda ctx: {{"v": ctx.input["v"]}}),
        "build": shell(lambda ctx: ["sh", "-c", "echo build"]),
        "publish": action(publish),
        "approve": checkpoint(summary="Ship it?"),
        "done": compute(lambda ctx: {{"shipped": ctx.outputs["approve"]["ok"],
                                       "v": ctx.outputs["publish"]["published"]}}),
    }},
    edges=[
        {{"from": "plan", "to": "build"}}, {{"from": "build", "to": "publish"}},
        {{"from": "publish", "to": "approve"}}, {{"from": "approve", "to": "done"}},
    ],
)
"""


def test_a_checkpoint_waits_and_its_answer_continues_the_run_to_completion(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "release", RELEASE.format())
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "release", {"v": "1.2"})
        waiting = wait_for(client, run_id, {"waiting"} | TERMINAL)
        assert waiting["display"]["status"] == "waiting"
        assert waiting["display"]["waitingOn"] == "approve"
        _wait_no_runners(client)
        key = "answer-once"
        first = client.call(
            "run.answer", {"answer": {"ok": True}}, run_id=run_id, idempotency_key=key
        )
        again = client.call(
            "run.answer", {"answer": {"ok": True}}, run_id=run_id, idempotency_key=key
        )
        assert again["outcome"] == "adopted"
        continuation = first["receipt"]["continuationRunId"]
        assert again["receipt"]["continuationRunId"] == continuation
        late = client.request("run.answer", {"answer": {"ok": False}}, run_id=run_id)
        assert late["outcome"] == "rejected", "one answer only"
        done = wait_for(client, continuation, TERMINAL)
        parent = client.call("run.get", run_id=run_id)["receipt"]
    assert done["display"]["status"] == "completed"
    assert [s["node"] for s in done["steps"]] == ["done"]
    assert parent["display"]["status"] == "completed"
    database = sqlite3.connect(
        f"file:{running_server.state_dir / 'state.sqlite'}?mode=ro", uri=True
    )
    try:
        (output,) = database.execute(
            "SELECT b.content FROM node_attempts AS a JOIN blobs AS b ON b.digest = a.output_hash "
            "WHERE a.run_id = ? AND a.node_path = 'done'",
            (continuation,),
        ).fetchone()
        effects = database.execute("SELECT count(*) FROM effects").fetchone()[0]
    finally:
        database.close()
    assert json.loads(output) == {"shipped": True, "v": "1.2"}
    assert effects == 2, "the continuation did not apply the earlier effects again"


STUBBORN = """
import signal, subprocess, time
from pathlib import Path
from pi_workflows import compute, define_workflow

def stubborn(ctx):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # A grandchild whose parent exits at once, but which stays in the runner's group.
    subprocess.run(["sh", "-c", "sleep 300 & echo $! > {grandchild}"], check=True)
    with open({fifo!r}, "w") as pipe:
        pipe.write("ready")
    time.sleep(300)
    return {{}}

workflow = define_workflow(name="stubborn", start_at="s", nodes={{"s": compute(stubborn)}})
"""


def test_a_runner_ignoring_sigterm_is_killed_with_its_whole_group(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    fifo, grandchild_file = short_tmp / "ready.fifo", short_tmp / "grandchild.pid"
    os.mkfifo(fifo)
    write_workflow(
        project, "stubborn", STUBBORN.format(grandchild=str(grandchild_file), fifo=str(fifo))
    )
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "stubborn", {})
        wait_fifo(fifo)
        (pid,) = _runner_pids(running_server)
        grandchild = psutil.Process(int(grandchild_file.read_text().strip()))
        # Its parent `sh` exited: the runner, a subreaper, adopted it; it stays in the group.
        assert grandchild.ppid() == pid and os.getpgid(grandchild.pid) == pid
        runner = psutil.Process(pid)
        client.call("run.cancel", run_id=run_id)
        _gone, alive = psutil.wait_procs([runner, grandchild], timeout=30)
        assert not alive, "SIGKILL after the grace reached the runner and its grandchild"
        assert client.call("run.get", run_id=run_id)["receipt"]["display"]["status"] == "cancelled"


SHELL_THEN_SLOW = """
import time
from pathlib import Path
from pi_workflows import compute, define_workflow, shell

def slow(ctx):
    runs = Path({counter!r})
    count = int(runs.read_text()) + 1 if runs.exists() else 1
    runs.write_text(str(count))
    with open({fifo!r}, "w") as pipe:
        pipe.write("after shell")
    if count == 1:  # a crash rerun keeps the visit number, so count executions here
        time.sleep(300)
    return {{"done": True}}

workflow = define_workflow(
    name="once",
    start_at="build",
    nodes={{
        "build": shell(lambda ctx: ["sh", "-c", "echo ran >> {log}"]),
        "slow": compute(slow),
    }},
    edges=[{{"from": "build", "to": "slow"}}],
)
"""


def test_a_finished_shell_command_is_not_run_again_after_a_crash(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    fifo, log = short_tmp / "after.fifo", short_tmp / "shell.log"
    os.mkfifo(fifo)
    source = SHELL_THEN_SLOW.format(fifo=str(fifo), log=str(log), counter=str(short_tmp / "n"))
    write_workflow(project, "once", source)
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "once", {})
        wait_fifo(fifo)
        (pid,) = _runner_pids(running_server)
        os.killpg(pid, signal.SIGKILL)
        wait_fifo(fifo)  # the replacement runner reached `slow` again
        view = wait_for(client, run_id, TERMINAL)
    assert view["display"]["status"] == "completed"
    assert log.read_text() == "ran\n", "the shell command ran exactly once"


def test_a_run_started_without_a_project_runs_in_the_agent_directory(
    running_server: WorkflowServer,
) -> None:
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        answer = client.call("run.start", {"workflow": "hello", "input": {"name": "Ada"}})
        run_id = answer["receipt"]["runId"]
        view = wait_for(client, run_id, TERMINAL)
    assert view["display"]["status"] == "completed"
    assert [step["node"] for step in view["steps"]] == ["greet", "shout", "count"]


def test_a_node_whose_output_is_not_json_fails_the_run_instead_of_the_runner(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    source = (
        "from pi_workflows import compute, define_workflow\n"
        "workflow = define_workflow(name='odd', start_at='o',\n"
        "    nodes={'o': compute(lambda ctx: {'when': object()})})\n"
    )
    write_workflow(project, "odd", source)
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "odd", {})
        view = wait_for(client, run_id, TERMINAL)
    assert view["display"]["status"] == "failed"
    assert view["generation"] == 1, "no runner crashed on the way"


def test_a_run_whose_runner_keeps_crashing_parks_for_review(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    source = (
        "import os\n"
        "from pi_workflows import compute, define_workflow\n"
        "workflow = define_workflow(name='crash', start_at='c',\n"
        "    nodes={'c': compute(lambda ctx: os._exit(1))})\n"
    )
    write_workflow(project, "crash", source)
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "crash", {})
        view = wait_until(
            client, run_id, lambda item: item["display"].get("reason") == "workerCrashed"
        )
        _wait_no_runners(client)
        settled = client.call("run.get", run_id=run_id)["receipt"]
    assert view["generation"] == 3, "three runners crashed, then the loop stopped"
    assert settled["display"].get("reason") == "workerCrashed"
    assert settled["generation"] == 3


LONG_SHELL = """
from pi_workflows import define_workflow, shell

SCRIPT = "echo $$ > {pidfile}; echo go > {fifo}; sleep 300"
workflow = define_workflow(
    name="long", start_at="wait", nodes={{"wait": shell(lambda ctx: ["sh", "-c", SCRIPT])}}
)
"""


@pytest.mark.parametrize("how", ["cancel", "kill-runner"])
def test_a_shell_command_never_outlives_its_runner(
    running_server: WorkflowServer, short_tmp: Path, how: str
) -> None:
    project = short_tmp / "project"
    fifo, pidfile = short_tmp / "go.fifo", short_tmp / "shell.pid"
    os.mkfifo(fifo)
    write_workflow(project, "long", LONG_SHELL.format(pidfile=str(pidfile), fifo=str(fifo)))
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "long", {})
        wait_fifo(fifo)
        command = psutil.Process(int(pidfile.read_text().strip()))
        (runner_pid,) = _runner_pids(running_server)
        assert os.getpgid(command.pid) != runner_pid, "the command has a group of its own"
        if how == "cancel":
            client.call("run.cancel", run_id=run_id)
        else:
            os.killpg(runner_pid, signal.SIGKILL)
        _gone, alive = psutil.wait_procs([command], timeout=30)
        assert not alive, "the server stopped the registered command group"


def test_a_graceful_stop_requeues_the_run_and_stops_its_shell_command(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    fifo, pidfile = short_tmp / "go.fifo", short_tmp / "shell.pid"
    os.mkfifo(fifo)
    write_workflow(project, "long", LONG_SHELL.format(pidfile=str(pidfile), fifo=str(fifo)))
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "long", {})
        wait_fifo(fifo)
    command = psutil.Process(int(pidfile.read_text().strip()))
    running_server.stop("test", drain_s=0)  # no drain: the command cannot finish first
    _gone, alive = psutil.wait_procs([command], timeout=30)
    assert not alive, "the stopping server stopped the registered command group"
    database = sqlite3.connect(
        f"file:{running_server.state_dir / 'state.sqlite'}?mode=ro", uri=True
    )
    try:
        (state,) = database.execute(
            "SELECT state FROM run_queue WHERE run_id = ?", (run_id,)
        ).fetchone()
    finally:
        database.close()
    assert state == "queued", "the next server resumes the handed-back run"


def test_losing_the_zygote_stops_its_runners_and_the_run_resumes_on_a_new_one(
    running_server: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    fifo, log = short_tmp / "after.fifo", short_tmp / "shell.log"
    os.mkfifo(fifo)
    source = SHELL_THEN_SLOW.format(fifo=str(fifo), log=str(log), counter=str(short_tmp / "n"))
    write_workflow(project, "once", source)
    with WorkflowClient(running_server.state_dir, autostart=False) as client:
        run_id = start_run(client, project, "once", {})
        wait_fifo(fifo)
        (pid,) = _runner_pids(running_server)
        runner = psutil.Process(pid)
        zygote = psutil.Process(runner.ppid())
        assert zygote.name() == "piw-zygote", "the runner was forked warm"
        zygote.kill()
        wait_fifo(fifo)  # a replacement runner, forked by a new zygote, reached `slow`
        view = wait_for(client, run_id, TERMINAL)
    _gone, alive = psutil.wait_procs([runner], timeout=30)
    assert not alive, "the orphaned runner was stopped by its exact identity"
    assert view["display"]["status"] == "completed"
    assert view["generation"] == 2
    assert log.read_text() == "ran\n", "the shell command ran exactly once"
