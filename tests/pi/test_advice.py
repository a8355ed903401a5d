"""Every piece of advice is a working command, in the renderer that shows it (issue 24).

For every display status and every reason code a run view can show, a real server
(real runners; a crash point, a SIGKILL of a runner, of the server or of a channel
adapter, a damaged blob, a missing pi, where a state needs one) is driven into that
state. Then the advice is taken as text, the way a person reads it:

- the CLI's (`pi-workflows run show RUN_ID` and `run status RUN_ID`, which must agree):
  every `pi-workflows ...` line is run as printed, as a child process, and must exit 0
  (`state verify` may exit 5: it ran and reported what it found);
- the Pi extension's (`/workflow status RUN_ID` in a real `pi --mode rpc` with the
  extension, the text its widget shows too): every `/workflow ...` line is run in that
  pi and must be answered with an info notice, never an error.

A command that changes the run gets a run of its own (each run is in the state, and its
own advice is read and one of its commands run), so every advised command is run once.
The one word not typed as printed is the placeholder `JSON` of an answer. No internal
name (`recoverConfirm`, `human-answer`, `Stopped (…)`) may appear in either text.

It fails when the reason table (`domain/_run_view.py` `ADVICE`) has a reason no case
reaches, when a case shows advice the table did not give, and when an advised command
does not exist or is refused. One real pi at a time; every process is killed by PID.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from rich.console import Console

from pi_workflows.cli._run_watch import watch_renderable
from pi_workflows.domain._run_view import ADVICE, CONTROLS
from pi_workflows.engine._pi_child import PI_BINARY_ENV
from pi_workflows.supervision import CRASH_ENV
from pi_workflows.testing import FakeProvider, FakeTelegram, text_turn
from tests.conftest import Processes, write_workflow
from tests.crash.harness import PRELUDE, Lab, Server
from tests.pi.rigs import PiRoot
from tests.pi.test_extension_commands import Origin
from tests.server.channel_rig import CHAT_ID, TOKEN, write_profiles

pytestmark = pytest.mark.timeout(1500)

PIW = Path(sys.executable).parent / "pi-workflows"
RUN_ID = re.compile(r"\brun-[0-9a-f]{32}\b")
PLACEHOLDER = "JSON"
READ_ONLY_CLI = ("run show ", "run status ", "run logs ", "state verify")
READ_ONLY_PI = ("/workflow status ",)
INTERNAL = re.compile(
    r"recoverConfirm|recoverRetry|channelRecover|human-answer|Stopped \(|controls:"
)
BIG = 3 * 1024 * 1024

BODIES = {
    # Runs, and stays running, on every execution.
    "sleepy": """
def sleepy(ctx):
    announce(ctx.run_id, "sleepy", os.getpid())
    time.sleep(600)

workflow = define_workflow(name="sleepy", start_at="s", nodes={"s": compute(sleepy)})
""",
    # Kills its own runner on every execution, after its start was sent (progress).
    "selfkill": """
def die(ctx):
    os.kill(os.getpid(), signal.SIGKILL)

workflow = define_workflow(name="selfkill", start_at="die", nodes={"die": compute(die)})
""",
    "approval": """
workflow = define_workflow(
    name="approval",
    start_at="ask",
    nodes={
        "ask": checkpoint(summary="Ship it?", input_schema={
            "type": "object", "required": ["approved"],
            "properties": {"approved": {"type": "boolean"}}}),
        "done": compute(lambda ctx: {"shipped": ctx.outputs["ask"]["approved"]}),
    },
    edges=[{"from": "ask", "to": "done"}],
)
""",
    "decide": """
workflow = define_workflow(
    name="decide",
    start_at="ask",
    nodes={
        "ask": human_decision(
            "Deploy build 42?", choices={"approve": "Approve", "reject": "Reject"}
        ),
        "done": compute(lambda ctx: {"answer": ctx.outputs["ask"]}),
    },
    edges=[{"from": "ask", "to": "done"}],
)
""",
    # The channel case's decision: the Telegram profile serves this workflow only.
    "deploy": """
workflow = define_workflow(
    name="deploy",
    start_at="ask",
    nodes={
        "ask": human_decision(
            "Deploy to production?", choices={"approve": "Approve", "reject": "Reject"}
        ),
        "done": compute(lambda ctx: {"answer": ctx.outputs["ask"]}),
    },
    edges=[{"from": "ask", "to": "done"}],
)
""",
    # Edited while its runs wait: their continuations find the source changed.
    "changing": """
workflow = define_workflow(
    name="changing",
    start_at="go",
    nodes={"go": checkpoint(summary="Go?"), "z": compute(lambda ctx: "v1")},
    edges=[{"from": "go", "to": "z"}],
)
""",
    "ask": """
from pi_workflows import agent

workflow = define_workflow(
    name="ask",
    start_at="ask",
    nodes={
        "ask": agent(
            prompt=lambda ctx: "Summarise the diff",
            output_schema={"type": "object", "properties": {"summary": {"type": "string"}},
                           "required": ["summary"]},
            timeout=600,
        ),
    },
)
""",
    "memory": """
def grab(ctx):
    block = bytearray(1024 * 1024 * 1024)
    return {"bytes": len(block)}

workflow = define_workflow(
    name="memory", start_at="grab", nodes={"grab": compute(grab, limits={"memory_mb": 200})}
)
""",
    # An effect with a 3 MiB result, then a wait: a resumed runner adopts the stored
    # result, and the server's reply carries it by reference.
    "bigeffect": """
def big(key, request):
    return {"text": "b" * BIG}


def bigeffect(ctx):
    ctx.effect("big.result", {"run": ctx.run_id}, apply=big, idempotent=True)
    announce(ctx.run_id, "b", os.getpid())
    time.sleep(600)

workflow = define_workflow(name="bigeffect", start_at="e", nodes={"e": action(bigeffect)})
""",
}


@dataclass(frozen=True)
class Case:
    """One state a view can show, and how many runs each renderer's commands need."""

    name: str
    status: str
    reason: str | None
    cli: int
    """The commands the CLI advises or allows that change the run (one run each)."""
    pi: int
    """The same for Pi's `/workflow` commands."""
    answer: str | None = None
    """What a person types for the placeholder `JSON`."""
    parked: bool = False

    @property
    def runs(self) -> int:
        return self.cli + self.pi


CASES = [
    Case("running", "running", None, 2, 2),
    Case("checkpoint", "waiting", "checkpoint", 3, 3, answer='{"approved": true}'),
    Case("humanDecision", "waiting", "humanDecision", 3, 3),
    Case("interaction", "waiting", "interaction", 2, 2),
    Case("paused", "paused", "paused", 2, 2),
    Case("runnerNoProgress", "queued", "runnerNoProgress", 3, 3, parked=True),
    Case("workflowSourceChanged", "queued", "workflowSourceChanged", 3, 3, parked=True),
    Case("serverCrashLoop", "queued", "serverCrashLoop", 3, 3, parked=True),
    Case("workerCrashed", "queued", "workerCrashed", 3, 3, parked=True),
    Case("contentUnavailable", "queued", "contentUnavailable", 3, 3, parked=True),
    Case("effectAmbiguous", "ambiguous", "effectAmbiguous", 3, 1),
    Case("channelAmbiguous", "ambiguous", "effectAmbiguous", 3, 1),
    Case("completed", "completed", None, 1, 1),
    Case("cancelled", "cancelled", None, 1, 1),
    Case("cancelledWithAmbiguousEffect", "cancelled", None, 1, 1),
    Case("nodeFailed", "failed", "nodeFailed", 1, 1),
    Case("resourceLimit", "failed", "resourceLimit", 1, 1),
    Case("piUnavailable", "failed", "piUnavailable", 1, 1),
    Case("nodeTimedOut", "timed_out", "nodeTimedOut", 1, 1),
    Case("agentUnproductive", "failed", "agentUnproductive", 1, 1),
    Case("queued", "queued", None, 2, 2),
]
BY_NAME = {case.name: case for case in CASES}


def test_every_reason_the_views_can_show_has_a_case_and_its_advice() -> None:
    """A reason added to the table without a case here (so without its commands run),
    or one with no words or no step, fails; so does a case whose reason is not there."""
    reached = {case.reason for case in CASES if case.reason is not None}
    assert reached == set(ADVICE), "every reason in ADVICE is driven and its advice run"
    for code, advice in ADVICE.items():
        assert advice.words and advice.action, code
        assert advice.next, f"{code} advises no step"
        assert not re.search(r"RUN_ID|--|/workflow|pi-workflows|`", advice.action), code


# --- the lab ------------------------------------------------------------------------


class AdviceLab(Lab):
    """The crash lab's servers, client and FIFO, with this test's workflows and an
    environment of its own for the servers (a crash point, pi, Telegram polling)."""

    def __init__(self, root: Path, processes: Processes) -> None:
        super().__init__(root, processes)
        self.extra: dict[str, str] = {}
        prelude = PRELUDE.replace("__LAB__", repr(str(root))).replace(
            "__EVENTS__", repr(str(self.events.path))
        )
        for name, body in BODIES.items():
            write_workflow(self.project, name, prelude + f"BIG = {BIG}\n" + body)

    def env(self) -> dict[str, str]:
        return {**super().env(), **self.extra}

    def start(
        self, workflow: str, workflow_input: dict[str, Any] | None = None, **extra: Any
    ) -> str:
        payload = {
            "workflow": workflow,
            "input": workflow_input or {},
            "projectPath": str(self.project),
            **extra,
        }
        return self.command("run.start", payload).new_run

    def starts(
        self, count: int, workflow: str, workflow_input: dict[str, Any] | None = None
    ) -> list[str]:
        return [self.start(workflow, workflow_input) for _ in range(count)]

    def display_is(self, run_id: str, check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        return self.wait_run(run_id, lambda view: check(view["display"]), timeout=120)

    def wait_code(self, run_ids: list[str], code: str) -> None:
        for run_id in run_ids:
            self.display_is(run_id, lambda d: d.get("reasonCode") == code)

    def wait_statuses(self, run_ids: list[str], *statuses: str) -> None:
        for run_id in run_ids:
            self.display_is(run_id, lambda d: d["status"] in statuses)

    def tagged(self, words: str) -> list[psutil.Process]:
        """The lab's live processes whose command line holds `words`."""
        found = []
        for process in self.lab_processes():
            with contextlib.suppress(psutil.Error):
                if words in " ".join(process.cmdline()):
                    found.append(process)
        return found


# --- reading and running the advice ------------------------------------------------------


def cli(lab: Lab, *argv: str) -> subprocess.CompletedProcess[str]:
    """`pi-workflows ARGV` as a person runs it: the installed script, no --state-dir."""
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    env["PI_CODING_AGENT_DIR"] = str(lab.state_dir.parent)
    return subprocess.run(
        [str(PIW), *argv], capture_output=True, text=True, timeout=120, check=False, env=env
    )


def cli_commands(text: str) -> list[str]:
    """Every command a CLI text prints, one a line, in order."""
    found: list[str] = []
    for line in text.splitlines():
        start = line.find("pi-workflows ")
        if start >= 0 and line[:start].strip(" :") in ("", "what to do", "allowed now"):
            command = line[start:].strip()
            if command not in found:
                found.append(command)
    return found


def pi_commands(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("/workflow ")]


def read_only(command: str, kinds: tuple[str, ...]) -> bool:
    return any(kind in command for kind in kinds)


@dataclass
class Checks:
    """What went wrong, per case; the test fails at the end with all of them."""

    problems: list[str] = field(default_factory=list)
    ran: dict[str, list[str]] = field(default_factory=dict)

    def expect(self, ok: bool, case: Case, what: str) -> bool:
        if not ok:
            self.problems.append(f"{case.name}: {what}")
        return ok

    def record(self, case: Case, command: str) -> None:
        self.ran.setdefault(case.name, []).append(command)


def check_view(checks: Checks, lab: AdviceLab, case: Case, run_id: str) -> dict[str, Any]:
    view = lab.get(run_id)
    display = view["display"]
    checks.expect(display["status"] == case.status, case, f"{run_id} is {display['status']}")
    checks.expect(display.get("reasonCode") == case.reason, case, f"reason {display}")
    checks.expect(bool(display.get("parked")) == case.parked, case, f"parked {display}")
    if case.reason is not None:
        checks.expect(display.get("next") is not None, case, "a reason without next steps")
    return view


def check_cli(checks: Checks, lab: AdviceLab, case: Case, runs: list[str]) -> None:
    """Each CLI run's advice, read from `run show` and `run status`, and run as printed."""
    mutating_seen: list[int] = []
    for index, run_id in enumerate(runs):
        view = check_view(checks, lab, case, run_id)
        shown = cli(lab, "run", "show", run_id)
        status = cli(lab, "run", "status", run_id)
        if not checks.expect(shown.returncode == status.returncode == 0, case, shown.stderr):
            continue
        for text in (shown.stdout, status.stdout):
            found = INTERNAL.search(text)
            checks.expect(found is None, case, f"an internal name shown: {found}: {text}")
        commands = cli_commands(shown.stdout)
        checks.expect(
            commands == cli_commands(status.stdout),
            case,
            f"run show and run status advise differently: {commands} / {status.stdout}",
        )
        watched = Console(record=True, width=400)
        watched.print(watch_renderable(view))  # type: ignore[arg-type]
        live = watched.export_text()
        checks.expect(all(c in live for c in commands), case, f"run watch lacks some: {live}")
        mutating = [c for c in commands if not read_only(c, READ_ONLY_CLI)]
        mutating_seen.append(len(mutating))
        if index == 0:
            for command in commands:
                if read_only(command, READ_ONLY_CLI):
                    run_cli_command(checks, lab, case, command)
        if index < len(mutating):
            run_cli_command(checks, lab, case, mutating[index])
    checks.expect(
        mutating_seen == [case.cli] * len(runs),
        case,
        f"the CLI advised {mutating_seen} commands that change the run, the case has {case.cli}",
    )


def run_cli_command(checks: Checks, lab: AdviceLab, case: Case, command: str) -> None:
    argv = shlex.split(command)
    if not checks.expect(argv[0] == "pi-workflows", case, f"not a CLI command: {command}"):
        return
    if PLACEHOLDER in argv:
        answer = case.answer
        if not checks.expect(answer is not None, case, f"no answer for {command}"):
            return
        argv = [str(answer) if part == PLACEHOLDER else part for part in argv]
    done = cli(lab, *argv[1:])
    allowed = (0, 5) if argv[1:3] == ["state", "verify"] else (0,)
    checks.expect(
        done.returncode in allowed,
        case,
        f"`{command}` exited {done.returncode}: {done.stdout} {done.stderr}",
    )
    checks.record(case, command)


def check_pi(checks: Checks, origin: Origin, lab: AdviceLab, case: Case, runs: list[str]) -> None:
    """Each Pi run's advice, read from `/workflow status`, and run in the real pi."""
    mutating_seen: list[int] = []
    for index, run_id in enumerate(runs):
        check_view(checks, lab, case, run_id)
        report = origin.notice(f"/workflow status {run_id}")
        found = INTERNAL.search(report)
        checks.expect(found is None, case, f"an internal name shown in Pi: {found}: {report}")
        checks.expect("pi-workflows run" not in report, case, f"CLI advice in Pi: {report}")
        commands = pi_commands(report)
        mutating = [c for c in commands if not read_only(c, READ_ONLY_PI)]
        mutating_seen.append(len(mutating))
        if index == 0:
            for command in commands:
                if read_only(command, READ_ONLY_PI):
                    run_pi_command(checks, origin, case, command)
        if index < len(mutating):
            run_pi_command(checks, origin, case, mutating[index])
    checks.expect(
        mutating_seen == [case.pi] * len(runs),
        case,
        f"Pi advised {mutating_seen} commands that change the run, the case has {case.pi}",
    )


def run_pi_command(checks: Checks, origin: Origin, case: Case, command: str) -> None:
    if command.endswith(f" {PLACEHOLDER}"):
        if not checks.expect(case.answer is not None, case, f"no answer for {command}"):
            return
        command = command[: -len(PLACEHOLDER)] + str(case.answer)
    origin.run(command)
    event = origin.wait_ui("notify", lambda _: True)
    level = event.get("notifyType", "info")
    checks.expect(level == "info", case, f"`{command}` answered {level}: {event.get('message')}")
    checks.record(case, command)


# --- driving the states ----------------------------------------------------------------


def drive_runner_no_progress(lab: AdviceLab, case: Case) -> list[str]:
    """Every runner of this server dies before `runner.ready`: the runs park."""
    lab.extra[CRASH_ENV] = "runner.ready.before_send"
    server = lab.start_server()
    runs = lab.starts(case.runs, "pure")
    lab.wait_code(runs, "runnerNoProgress")
    lab.stop_server(server)
    del lab.extra[CRASH_ENV]
    return runs


def drive_server_crash_loop(
    lab: AdviceLab, case: Case, phase: Callable[[], Server]
) -> tuple[list[str], Server]:
    """The server dies three times while the runs are in flight; the next start parks them."""
    server = phase()
    runs = lab.starts(case.runs, "sleepy")
    for _ in range(3):
        for run_id in runs:
            lab.events.wait(run_id, "sleepy")
        lab.kill_server(server)
        server = phase()
    lab.wait_code(runs, "serverCrashLoop")
    return runs, server


def drive_content_unavailable(
    lab: AdviceLab, case: Case, server: Server, phase: Callable[[], Server]
) -> tuple[list[str], Server]:
    """A resumed runner adopts its effect's 3 MiB result, sent to it by reference; that
    stored reply is then damaged (fault injection on the stopped server's file), so the
    next runner cannot read it."""
    runs = lab.starts(case.runs, "bigeffect")
    for resumed in (False, True):
        for run_id in runs:
            lab.events.wait(run_id, "b")
            lab.command("run.pause", run_id=run_id)
        lab.wait_statuses(runs, "paused")
        if not resumed:
            for run_id in runs:
                lab.command("run.resume", run_id=run_id)
    lab.stop_server(server)
    assert damage_replies(lab) == len(runs), "each adopted result was sent by reference"
    server = phase()
    for run_id in runs:
        lab.command("run.resume", run_id=run_id)
    lab.wait_code(runs, "contentUnavailable")
    return runs, server


def damage_replies(lab: Lab) -> int:
    """Flip one byte of every stored effect-reservation reply that went by reference
    (same length, so only its digest tells); returns how many."""
    db = sqlite3.connect(lab.state_dir / "state.sqlite")
    try:
        rows = [
            (digest, content)
            for digest, content in db.execute(
                "SELECT digest, content FROM blobs WHERE byte_length > ?", (BIG,)
            )
            if bytes(content).startswith(b'{"attemptNumber":')
        ]
        for digest, content in rows:
            data = bytearray(content)
            at = data.index(b"bbbb")
            data[at] = ord("c")
            db.execute("UPDATE blobs SET content = ? WHERE digest = ?", (bytes(data), digest))
        db.commit()
        return len(rows)
    finally:
        db.close()


def drive_parked_and_waiting(lab: AdviceLab) -> dict[str, list[str]]:
    runs: dict[str, list[str]] = {}
    runs["running"] = lab.starts(BY_NAME["running"].runs, "sleepy")
    runs["checkpoint"] = lab.starts(BY_NAME["checkpoint"].runs, "approval")
    runs["humanDecision"] = lab.starts(BY_NAME["humanDecision"].runs, "decide")
    runs["interaction"] = [
        lab.start("ask", originSessionId=f"advice-session-{i}")
        for i in range(BY_NAME["interaction"].runs)
    ]
    runs["paused"] = lab.starts(BY_NAME["paused"].runs, "sleepy")
    waiting = lab.starts(BY_NAME["workflowSourceChanged"].runs, "changing")
    runs["workerCrashed"] = lab.starts(BY_NAME["workerCrashed"].runs, "selfkill")
    runs["effectAmbiguous"] = lab.starts(
        BY_NAME["effectAmbiguous"].runs, "charge", {"block": "charge", "readBack": False}
    )
    runs["cancelledWithAmbiguousEffect"] = lab.starts(
        BY_NAME["cancelledWithAmbiguousEffect"].runs,
        "charge",
        {"block": "charge", "readBack": False},
    )
    runs["completed"] = lab.starts(BY_NAME["completed"].runs, "pure")
    runs["cancelled"] = lab.starts(BY_NAME["cancelled"].runs, "sleepy")
    runs["nodeFailed"] = lab.starts(BY_NAME["nodeFailed"].runs, "fails")
    runs["resourceLimit"] = lab.starts(BY_NAME["resourceLimit"].runs, "memory")
    runs["piUnavailable"] = lab.starts(BY_NAME["piUnavailable"].runs, "ask")
    runs["nodeTimedOut"] = lab.starts(BY_NAME["nodeTimedOut"].runs, "late", {"block": "late"})

    for run_id in runs["running"] + runs["paused"] + runs["cancelled"]:
        lab.events.wait(run_id, "sleepy")
    for run_id in runs["paused"]:
        lab.command("run.pause", run_id=run_id)
    for run_id in runs["cancelled"]:
        lab.command("run.cancel", run_id=run_id)
    for run_id in runs["effectAmbiguous"]:
        os.kill(lab.events.wait(run_id, "applying"), signal.SIGKILL)  # its runner
    for run_id in runs["cancelledWithAmbiguousEffect"]:
        lab.events.wait(run_id, "applying")
        lab.command("run.cancel", run_id=run_id)  # the applying effect becomes ambiguous

    lab.wait_statuses(waiting, "waiting")
    write_workflow(
        lab.project,
        "changing",
        (lab.project / ".pi" / "workflows" / "changing.workflow.py")
        .read_text()
        .replace('"v1"', '"v2"'),
    )
    runs["workflowSourceChanged"] = [
        lab.command("run.answer", {"answer": {}}, run_id=run_id).new_run for run_id in waiting
    ]

    lab.wait_statuses(runs["running"], "running")
    lab.wait_statuses(runs["paused"], "paused")
    lab.wait_code(runs["checkpoint"], "checkpoint")
    lab.wait_code(runs["humanDecision"], "humanDecision")
    lab.wait_code(runs["interaction"], "interaction")
    lab.wait_code(runs["workflowSourceChanged"], "workflowSourceChanged")
    lab.wait_code(runs["workerCrashed"], "workerCrashed")
    for run_id in runs["effectAmbiguous"]:
        lab.wait_recoverable(run_id)
    for run_id in runs["cancelledWithAmbiguousEffect"]:
        lab.display_is(run_id, lambda d: "review" in d["controls"])
    lab.wait_statuses(runs["completed"], "completed")
    lab.wait_statuses(runs["cancelled"], "cancelled")
    lab.wait_code(runs["nodeFailed"], "nodeFailed")
    lab.wait_code(runs["resourceLimit"], "resourceLimit")
    lab.wait_code(runs["piUnavailable"], "piUnavailable")
    lab.wait_code(runs["nodeTimedOut"], "nodeTimedOut")
    return runs


def drive_channel_ambiguous(lab: AdviceLab, telegram: FakeTelegram, case: Case) -> list[str]:
    """A Telegram delivery in flight when its adapter child is SIGKILLed is ambiguous."""
    runs = []
    for _ in range(case.runs):
        hang = telegram.hang_next("sendMessage", deliver=True)
        run_id = lab.start("deploy")
        hang.wait_entered(120)
        for adapter in lab.tagged("channel_adapter"):
            with contextlib.suppress(psutil.Error):
                adapter.kill()
        lab.display_is(run_id, lambda d: "channelRecoverConfirm" in d["controls"])
        runs.append(run_id)
    return runs


def drive_agent_unproductive(lab: AdviceLab, origin: Origin, case: Case) -> list[str]:
    """Runs started from the real pi, whose model ends three turns without a submission."""
    runs = []
    for _ in range(case.runs):
        notice = origin.notice("/workflow start ask")
        found = RUN_ID.search(notice)
        assert found is not None, notice
        runs.append(found.group(0))
        lab.wait_code([found.group(0)], "agentUnproductive")
    return runs


def cancel_restarts_in(lab: AdviceLab, runs: list[str]) -> None:
    """A restart of a run of the test's Pi session runs there: end it, so the session is
    free for the next one (one unfinished run per session)."""
    for run_id in runs:
        for new in lab.get(run_id)["lineage"].get("restartedBy", []):
            if lab.get(new)["display"]["status"] not in ("completed", "failed", "cancelled"):
                lab.command("run.cancel", run_id=new)
            lab.wait_statuses([new], "completed", "failed", "cancelled", "timed_out")


def cancel_everything(lab: AdviceLab) -> None:
    items = lab.call("run.list", {"limit": 256})["items"]
    for item in items:
        if item["display"]["status"] not in ("completed", "failed", "cancelled", "timed_out"):
            with contextlib.suppress(AssertionError):
                lab.command("run.cancel", run_id=item["runId"])


# --- the test ------------------------------------------------------------------------------


@pytest.fixture
def telegram() -> Iterator[FakeTelegram]:
    with FakeTelegram(token=TOKEN, chat_id=CHAT_ID) as fake:
        yield fake


def test_every_advised_command_is_accepted_in_the_renderer_that_shows_it(
    pi_binary: Path,
    provider: FakeProvider,
    pi_slot: None,
    short_tmp: Path,
    processes: Processes,
    telegram: FakeTelegram,
) -> None:
    lab = AdviceLab(short_tmp, processes)
    (short_tmp / "tmp").mkdir()
    provider.write_agent_dir(short_tmp / "agent")
    rig = PiRoot(short_tmp, provider, pi_binary, [])
    write_profiles(lab.state_dir, telegram.api_base, workflows=("deploy",))
    # Headless agent steps find no pi (piUnavailable); Telegram polls every second.
    lab.extra.update(
        {PI_BINARY_ENV: str(short_tmp / "no-such-pi"), "PI_WORKFLOWS_TELEGRAM_POLL_SECONDS": "1"}
    )
    checks = Checks()
    runs: dict[str, list[str]] = {}

    def phase() -> Server:
        return lab.start_server(max_workers=48)

    try:
        runs["runnerNoProgress"] = drive_runner_no_progress(lab, BY_NAME["runnerNoProgress"])
        runs["serverCrashLoop"], server = drive_server_crash_loop(
            lab, BY_NAME["serverCrashLoop"], phase
        )
        runs["contentUnavailable"], server = drive_content_unavailable(
            lab, BY_NAME["contentUnavailable"], server, phase
        )
        runs.update(drive_parked_and_waiting(lab))
        runs["channelAmbiguous"] = drive_channel_ambiguous(
            lab, telegram, BY_NAME["channelAmbiguous"]
        )
        provider.script(*[text_turn("I will not submit anything.") for _ in range(40)])
        origin = Origin(rig.spawn_extension())
        runs["agentUnproductive"] = drive_agent_unproductive(
            lab, origin, BY_NAME["agentUnproductive"]
        )

        for case in CASES:
            if case.name == "queued":
                continue
            check_cli(checks, lab, case, runs[case.name][: case.cli])
            if case.name == "agentUnproductive":
                cancel_restarts_in(lab, runs[case.name])
        for case in CASES:
            if case.name == "queued":
                continue
            check_pi(checks, origin, lab, case, runs[case.name][case.cli :])
            if case.name == "agentUnproductive":
                cancel_restarts_in(lab, runs[case.name])

        # Admitted work that has not started: one worker, held by a run that stays.
        cancel_everything(lab)
        lab.stop_server(server)
        server = lab.start_server(max_workers=1)
        blocker = lab.start("sleepy")
        lab.events.wait(blocker, "sleepy")
        case = BY_NAME["queued"]
        runs["queued"] = lab.starts(case.runs, "pure")
        check_cli(checks, lab, case, runs["queued"][: case.cli])
        check_pi(checks, origin, lab, case, runs["queued"][case.cli :])
    finally:
        for child in rig.children:
            child.stop()
        lab.close()
    assert not checks.problems, "\n".join(checks.problems)
    for case in CASES:
        assert checks.ran.get(case.name), f"{case.name}: no command was run"
    advised = {step for case_code in ADVICE.values() for step in case_code.next}
    assert advised <= set(CONTROLS) | {"show", "logs", "verify"}
    print(json.dumps({name: len(ran) for name, ran in checks.ran.items()}))
