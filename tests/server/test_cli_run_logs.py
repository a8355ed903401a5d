"""`pi-workflows run logs RUN_ID [--follow]` through the real CLI, a real server and
real runners (issue 13, item 8).

A workflow with a shell node (stdout and stderr) and a compute node that prints to
stderr: the shell streams come from the stored result, the compute print from the
run's runner log, mapped from the run's runner epochs; another run's output is never
shown. `--follow` prints the shell output while the run is still running and ends
when it settles.
"""

from __future__ import annotations

import json
import os
import select
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.wire.canonical import dumps
from pi_workflows.wire.framing import MAX_FRAME_BYTES
from tests.conftest import Processes, write_workflow
from tests.server.runs import TERMINAL, start_run, wait_fifo, wait_for

pytestmark = pytest.mark.timeout(120)

LOGGED = """
import sys

from pi_workflows import compute, define_workflow, shell


def report(ctx):
    print("compute says " + ctx.input["tag"], file=sys.stderr)
    gate = ctx.input.get("gate")
    if gate:
        with open(gate["ready"], "w") as ready:
            ready.write("at compute")
        with open(gate["release"]) as release:  # blocks until the test writes
            release.read()
    print("compute done " + ctx.input["tag"], file=sys.stderr)
    return {"ok": True}


workflow = define_workflow(
    name="logged",
    start_at="build",
    nodes={
        "build": shell(lambda ctx: ["sh", "-c", "echo out-" + ctx.input["tag"] + "; echo err-"
                                     + ctx.input["tag"] + " >&2"]),
        "report": compute(report, timeout=120),
    },
    edges=[{"from": "build", "to": "report"}],
)
"""


@pytest.fixture
def project(short_tmp: Path) -> Path:
    folder = short_tmp / "project"
    write_workflow(folder, "logged", LOGGED)
    return folder


def test_logs_show_shell_streams_and_runner_stderr_of_that_run_only(
    running_server: WorkflowServer, project: Path, processes: Processes
) -> None:
    state = running_server.state_dir
    with WorkflowClient(state, autostart=False, timeout=30) as client:
        mine = start_run(client, project, "logged", {"tag": "mine"})
        other = start_run(client, project, "logged", {"tag": "theirs"})
        for run_id in (mine, other):
            assert wait_for(client, run_id, TERMINAL)["display"]["status"] == "completed"

    done = processes.cli(state, "run", "logs", mine)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "== shell build (visit 1, attempt 1): exit 0 ==" in text
    assert "[stdout]\nout-mine\n" in text and "[stderr]\nerr-mine\n" in text
    assert "== runner stderr, generation 1 [build#1, report#1]" in text
    assert "compute says mine" in text and "compute done mine" in text
    # In the order they finished: the shell result, then the runner that ran both.
    assert text.index("out-mine") < text.index("compute says mine")
    assert "theirs" not in text, "another run's output is never shown"

    as_json = processes.cli(state, "run", "logs", mine, "--json")
    assert as_json.returncode == 0, as_json.stderr
    document = json.loads(as_json.stdout)
    kinds = [(entry["kind"], entry.get("node")) for entry in document["entries"]]
    assert kinds == [("shell", "build"), ("runner", None)]
    shell, runner = document["entries"]
    assert shell["stdout"] == "out-mine\n" and shell["stderr"] == "err-mine\n"
    assert shell["exitCode"] == 0 and shell["attempt"] == 1
    assert runner["live"] is False and "compute says mine" in runner["text"]
    assert [n["node"] for n in runner["nodes"]] == ["build", "report"]


def test_logs_of_a_missing_run_say_so(running_server: WorkflowServer, processes: Processes) -> None:
    done = processes.cli(running_server.state_dir, "run", "logs", "run-does-not-exist")
    assert done.returncode == 1 and "notFound" in done.stderr and done.stdout == ""


def test_follow_prints_as_attempts_finish_and_ends_when_the_run_settles(
    running_server: WorkflowServer, project: Path, processes: Processes, short_tmp: Path
) -> None:
    state = running_server.state_dir
    ready, release = short_tmp / "ready.fifo", short_tmp / "release.fifo"
    os.mkfifo(ready)
    os.mkfifo(release)
    gate = {"ready": str(ready), "release": str(release)}
    with WorkflowClient(state, autostart=False, timeout=30) as client:
        run_id = start_run(client, project, "logged", {"tag": "live", "gate": gate})
        assert wait_fifo(ready) == "at compute"  # the shell node finished; compute waits
        follower = processes.spawn_cli(state, "run", "logs", run_id, "--follow")
        assert follower.stdout is not None
        seen = _read_until(follower.stdout.fileno(), b"compute says live")
        assert b"out-live" in seen, "the shell output is printed while the run runs"
        assert follower.poll() is None, "still following"
        with open(release, "w") as gate_file:
            gate_file.write("go")
        rest = _read_until(follower.stdout.fileno(), None)
        assert follower.wait(60) == 0
        assert wait_for(client, run_id, TERMINAL)["display"]["status"] == "completed"
    everything = (seen + rest).decode()
    assert everything.count("out-live") == 1 and everything.count("compute says live") == 1
    assert "compute done live" in everything
    assert everything.count("== runner stderr") == 1, "one header for a log printed in parts"


def _read_until(fd: int, marker: bytes | None, timeout: float = 60) -> bytes:
    """Read the follower's stdout until `marker` appears (None: until it closes)."""
    data = b""
    while marker is None or marker not in data:
        readable, _, _ = select.select([fd], [], [], timeout)
        assert readable, f"no output; so far: {data!r}"
        chunk = os.read(fd, 65536)
        if not chunk:
            assert marker is None, f"closed before {marker!r}; got {data!r}"
            return data
        data += chunk
    return data


LOUD = """
import sys

from pi_workflows import compute, define_workflow, shell


def shout(ctx):
    for i in range(4000):
        print(f"line {i:05} " + "x" * 240, file=sys.stderr)
    print("the end", file=sys.stderr)
    return {}


workflow = define_workflow(
    name="loud",
    start_at="noise",
    nodes={
        "noise": shell(
            lambda ctx: ["sh", "-c", "head -c 300000 /dev/zero | tr '\\\\0' '\\\\1'; echo tail"],
            max_output_bytes=400000,
        ),
        "shout": compute(shout),
    },
    edges=[{"from": "noise", "to": "shout"}],
)
"""


def test_large_logs_come_in_frames_under_the_limit_and_assemble_whole(
    running_server: WorkflowServer, short_tmp: Path, processes: Processes
) -> None:
    """A 1 MB runner log and a shell stdout that escapes to 1.8 MB of JSON: every
    `run.logs` response stays under one frame, the runner log is assembled whole
    (byte for byte the file), and the shell stream's cut is announced."""
    project = short_tmp / "loud"
    write_workflow(project, "loud", LOUD)
    state = running_server.state_dir
    with WorkflowClient(state, autostart=False, timeout=30) as client:
        run_id = start_run(client, project, "loud")
        assert wait_for(client, run_id, TERMINAL)["display"]["status"] == "completed"
        epochs: list[dict[str, Any]] = []
        while not epochs or epochs[-1].get("live", True):
            epochs = [
                e
                for e in client.call("run.logs", {}, run_id=run_id)["receipt"]["entries"]
                if e["kind"] == "runner"
            ]
        sizes = []
        cursor: dict[str, object] = {}
        runner_text = ""
        shell = None
        while True:
            answer = client.call("run.logs", cursor, run_id=run_id)
            sizes.append(len(dumps(answer)))
            for entry in answer["receipt"]["entries"]:
                if entry["kind"] == "shell":
                    shell = entry
                else:
                    runner_text += entry["text"]
                if entry.get("nextOffset") is not None:
                    cursor["offsets"] = {entry["runnerEpoch"]: entry["nextOffset"]}
                else:
                    cursor = {"since": entry["at"], "afterKey": entry["key"]}
            if not answer["receipt"]["more"]:
                break
    assert max(sizes) < MAX_FRAME_BYTES and len(sizes) > 2
    log = state / "logs" / "runners" / f"{epochs[0]['runnerEpoch']}.log"
    assert runner_text == log.read_text("utf-8") and "line 03999" in runner_text
    assert shell is not None and shell["stdout"].startswith("\x01") and shell["stdoutOmittedBytes"]
    assert len(shell["stdout"]) + shell["stdoutOmittedBytes"] == 300000 + len("tail\n")
    done = processes.cli(state, "run", "logs", run_id)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("line 0") == 4000 and "the end" in done.stdout
    assert "more bytes not shown" in done.stdout
