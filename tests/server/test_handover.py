"""`run.adopt` and `run.resumeHeadless` over the real socket: the ways out for an
interactive run whose origin Pi session cannot come back (issue 24, item 1).

A run started from Pi session `pi-session-1` waits at its agent step for that session,
which never connects again. Another session adopts it: the binding, the step's request
and its pending message move there, in one transaction with the receipt, and the step is
presented there once. Or the run goes on headless: the binding loses its session, its
step messages are cancelled and the run goes back in the admission line. Every refusal
is one clear error, stored like an acceptance so a retry gets the same answer.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.domain import ActiveEpochs
from pi_workflows.domain._handover import resume_headless
from pi_workflows.domain._operations import OperationContext, StartRequest, start_run
from pi_workflows.storage import Database
from pi_workflows.wire.canonical import dumps, sha256_digest
from tests.conftest import write_workflow
from tests.server import origin
from tests.server.origin import SESSION, rows, session_snapshot, start
from tests.server.runs import wait_for
from tests.server.watchers import Watcher

pytestmark = pytest.mark.timeout(120)

running = origin.running

OTHER = "pi-session-2"

WORKFLOW = """
from pathlib import Path

from pi_workflows import agent, compute, define_workflow


def prep(ctx):
    gate = ctx.input.get("gate")
    while gate and not Path(gate).exists():  # the test opens the gate
        import time

        time.sleep(0.02)
    return {"ready": True}


workflow = define_workflow(
    name="ask",
    start_at="prep",
    nodes={
        "prep": compute(prep),
        "ask": agent(
            prompt=lambda ctx: "Summarise " + ctx.input["topic"],
            output_schema={"type": "object", "properties": {"summary": {"type": "string"}},
                           "required": ["summary"]},
            timeout=600,
        ),
        "after": compute(lambda ctx: {"seen": ctx.outputs["ask"]["summary"]}),
    },
    edges=[{"from": "prep", "to": "ask"}, {"from": "ask", "to": "after"}],
)
"""


@dataclass
class Stranded:
    """An interactive run of SESSION waiting at its step; SESSION never connects."""

    server: WorkflowServer
    project: Path
    client: WorkflowClient
    run_id: str

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        return rows(self.server.state_dir, sql, *params)

    def messages(self) -> list[tuple[Any, ...]]:
        """(message ID, target session, kind, reason, state) in creation order."""
        return self.rows(
            "SELECT message_id, target_session_id, kind, reason, state FROM workflow_messages "
            "WHERE run_id = ? ORDER BY created_at, rowid",
            self.run_id,
        )

    def binding(self) -> tuple[Any, ...]:
        [row] = self.rows(
            "SELECT execution_mode, origin_session_id, reserved FROM run_bindings WHERE run_id = ?",
            self.run_id,
        )
        return row

    def request_target(self) -> Any:
        [(target,)] = self.rows(
            "SELECT target_session_id FROM interactive_requests WHERE run_id = ? "
            "AND status = 'pending'",
            self.run_id,
        )
        return target

    def adopt(self, session: str = OTHER, *, key: str | None = None) -> dict[str, Any]:
        return dict(
            self.client.request(
                "run.adopt", {"sessionId": session}, run_id=self.run_id, idempotency_key=key
            )
        )

    def headless(self, *, key: str | None = None) -> dict[str, Any]:
        return dict(
            self.client.request("run.resumeHeadless", {}, run_id=self.run_id, idempotency_key=key)
        )


def _start(client: WorkflowClient, project: Path, session: str | None, **inputs: Any) -> str:
    answer = start(client, project, "ask", session, input={"topic": "the diff", **inputs})
    assert answer["outcome"] == "accepted", answer
    return str(answer["receipt"]["runId"])


@pytest.fixture
def stranded(running: WorkflowServer, short_tmp: Path) -> Iterator[Stranded]:
    project = short_tmp / "project"
    write_workflow(project, "ask", WORKFLOW)
    with WorkflowClient(running.state_dir, autostart=False, timeout=30) as client:
        run_id = _start(client, project, SESSION)
        wait_for(client, run_id, {"waiting"})
        yield Stranded(running, project, client, run_id)


def coordinate(server: WorkflowServer, session: str) -> tuple[Watcher, int]:
    """A coordinator connection of `session` (its active epoch)."""
    watcher = Watcher(server.socket_path)
    answer = watcher.request(
        "view.subscribe", {"kind": "sessionView", "sessionId": session, "coordinator": True}
    )
    assert answer["outcome"] == "accepted", answer
    return watcher, int(answer["receipt"]["coordinatorEpoch"])


def bystander_view(server: WorkflowServer, session: str) -> dict[str, Any]:
    watcher = Watcher(server.socket_path)
    try:
        watcher.subscribe({"kind": "sessionView", "sessionId": session})
        return session_snapshot(watcher, lambda _: True, "a session view")
    finally:
        watcher.close()


def after_close(attempt: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`attempt`'s answer once a closed coordinator's epoch has ended: the close reaches
    the server on its own, and until then its session still counts as open."""
    deadline = time.monotonic() + 30
    while True:
        answer = attempt()
        if answer.get("error", {}).get("code") != "originSessionOpen":
            return answer
        assert time.monotonic() < deadline, "the closed coordinator's epoch never ended"
        time.sleep(0.02)


def at_node(client: WorkflowClient, run_id: str, node: str) -> None:
    """Wait until the run's view says a runner executes `node`."""
    deadline = time.monotonic() + 30
    while client.call("run.get", run_id=run_id)["receipt"]["display"].get("currentNode") != node:
        assert time.monotonic() < deadline, f"the run never ran {node}"
        time.sleep(0.02)


def _submit(watcher: Watcher, epoch: int, run_id: str, request_id: str) -> dict[str, Any]:
    return watcher.request(
        "interaction.submit",
        {
            "interactionId": request_id,
            "submissionId": f"submission-{uuid.uuid4().hex[:8]}",
            "value": {"summary": "done"},
            "sessionId": OTHER,
            "coordinatorEpoch": epoch,
        },
        runId=run_id,
    )


# --- run.adopt ---------------------------------------------------------------------------


def test_adopt_moves_the_never_presented_step_to_the_adopting_session_once(
    stranded: Stranded,
) -> None:
    [(step, target, kind, reason, state)] = stranded.messages()
    assert (target, kind, reason, state) == (SESSION, "step", "initial", "pending")

    key = f"adopt-{uuid.uuid4().hex[:8]}"
    answer = stranded.adopt(key=key)
    assert answer["outcome"] == "accepted", answer
    assert answer["receipt"] == {"runId": stranded.run_id, "operation": "adopt"}
    # One transaction moved the binding (with its reservation), the request and the
    # message; the step is presented once, in the new session.
    assert stranded.binding() == ("interactive", OTHER, 1)
    assert stranded.request_target() == OTHER
    assert stranded.messages() == [(step, OTHER, "step", "initial", "pending")]
    [(event,)] = stranded.rows(
        "SELECT event_type FROM events WHERE run_id = ? ORDER BY revision DESC LIMIT 1",
        stranded.run_id,
    )
    assert event == "run_adopted"
    # A retry of the same command adopts its receipt and changes nothing.
    again = stranded.adopt(key=key)
    assert again["outcome"] == "adopted" and again["receipt"] == answer["receipt"]
    assert len(stranded.messages()) == 1

    assert bystander_view(stranded.server, SESSION)["activeRun"] is None
    watcher, epoch = coordinate(stranded.server, OTHER)
    try:
        view = session_snapshot(
            watcher, lambda v: v.get("nextMessage") is not None, "the step as the next message"
        )
        assert view["activeRun"]["runId"] == stranded.run_id
        assert view["nextMessage"]["messageId"] == step
        [(request_id,)] = stranded.rows(
            "SELECT request_id FROM interactive_requests WHERE run_id = ?", stranded.run_id
        )
        submitted = _submit(watcher, epoch, stranded.run_id, request_id)
        assert submitted["outcome"] == "accepted", submitted
    finally:
        watcher.close()
    done = wait_for(stranded.client, stranded.run_id, {"completed", "failed"})
    assert done["display"]["status"] == "completed", done


def test_adopt_of_a_step_shown_in_the_lost_session_presents_it_once_more_as_resumed(
    stranded: Stranded,
) -> None:
    [(step, *_)] = stranded.messages()
    # SESSION's Pi showed the step and its model turn started; then that Pi died.
    watcher, _epoch = coordinate(stranded.server, SESSION)
    try:
        report = watcher.request(
            "workflowMessage.reportBranch",
            {
                "sessionId": SESSION,
                "entries": [{"messageId": step, "entryId": "entry-1"}],
                "isIdle": False,
                "hasPendingMessages": False,
            },
        )
        assert report["outcome"] == "accepted", report
        turn = watcher.request(
            "workflowTurn.report",
            {"sessionId": SESSION, "messageId": step, "turnId": "turn-1", "phase": "started"},
            runId=stranded.run_id,
        )
        assert turn["receipt"]["ownership"] == "active", turn
    finally:
        watcher.close()

    answer = after_close(stranded.adopt)
    assert answer["outcome"] == "accepted", answer
    messages = stranded.messages()
    assert messages[0] == (step, SESSION, "step", "initial", "sent")
    assert [m[1:] for m in messages[1:]] == [(OTHER, "step", "resumed", "pending")]
    assert stranded.rows("SELECT status FROM workflow_turns WHERE turn_id = 'turn-1'") == [
        ("lost",)
    ], "the lost session's open turn ended"
    # The old session no longer lists the step as open: it belongs to the new one.
    assert bystander_view(stranded.server, SESSION)["messages"]["count"] == 0
    assert bystander_view(stranded.server, OTHER)["messages"]["count"] == 1


def test_adopt_is_refused_with_one_clear_error_each_time_it_is_not_allowed(
    stranded: Stranded,
) -> None:
    def refused(answer: dict[str, Any], outcome: str, code: str) -> str:
        assert (answer["outcome"], answer["error"]["code"]) == (outcome, code), answer
        return str(answer["error"]["message"])

    # The origin session is open in a Pi: it keeps its run (one coordinator).
    watcher, _ = coordinate(stranded.server, SESSION)
    try:
        message = refused(stranded.adopt(), "rejected", "originSessionOpen")
        assert stranded.run_id in message and "close that Pi" in message
    finally:
        watcher.close()
    # The adopting session already has an unfinished run of its own.
    other = _start(stranded.client, stranded.project, OTHER)
    message = refused(after_close(stranded.adopt), "rejected", "sessionReserved")
    assert other in message
    stranded.client.call("run.cancel", run_id=other)
    # Its own origin session, a missing session ID, an unknown run.
    refused(stranded.adopt(SESSION), "rejected", "alreadyOrigin")
    no_session = stranded.client.request("run.adopt", {}, run_id=stranded.run_id)
    refused(dict(no_session), "rejected", "sessionIdInvalid")
    unknown = stranded.client.request("run.adopt", {"sessionId": OTHER}, run_id="run-nope")
    refused(dict(unknown), "notFound", "runNotFound")
    # A headless run has no origin session to move.
    headless = _start(stranded.client, stranded.project, None, gate="/nonexistent/gate")
    refused(
        dict(stranded.client.request("run.adopt", {"sessionId": OTHER}, run_id=headless)),
        "rejected",
        "notInteractive",
    )
    stranded.client.call("run.cancel", run_id=headless)
    # None of the refusals changed the stranded run.
    assert stranded.binding() == ("interactive", SESSION, 1)
    # A finished run is not handed over.
    stranded.client.call("run.cancel", run_id=stranded.run_id)
    refused(stranded.adopt(), "rejected", "runFinished")


def test_a_run_adopted_while_its_runner_runs_presents_its_step_in_the_new_session(
    running: WorkflowServer, short_tmp: Path
) -> None:
    project = short_tmp / "project"
    write_workflow(project, "ask", WORKFLOW)
    gate = short_tmp / "gate"
    with WorkflowClient(running.state_dir, autostart=False, timeout=30) as client:
        run_id = _start(client, project, SESSION, gate=str(gate))
        at_node(client, run_id, "prep")
        answer = client.request("run.adopt", {"sessionId": OTHER}, run_id=run_id)
        assert answer["outcome"] == "accepted", answer
        # A runner holds the run: turning it headless now is refused, clearly.
        refused = client.request("run.resumeHeadless", {}, run_id=run_id)
        assert (refused["outcome"], refused["error"]["code"]) == ("rejected", "runnerActive")
        assert f"pi-workflows run pause {run_id}" in refused["error"]["message"]
        gate.touch()
        wait_for(client, run_id, {"waiting"})
    assert rows(
        running.state_dir,
        "SELECT target_session_id, kind, state FROM workflow_messages WHERE run_id = ?",
        run_id,
    ) == [(OTHER, "step", "pending")]


# --- run.resumeHeadless -------------------------------------------------------------------


def test_resume_headless_releases_the_session_and_puts_the_step_back_in_line(
    stranded: Stranded, short_tmp: Path
) -> None:
    # Runs stay where they are after the commit: no runner is launched here, so the
    # test sees the committed state (the real-pi tests run the headless step itself).
    stranded.client.close()
    stranded.server.stop("inspect the committed state")
    still = WorkflowServer(stranded.server.state_dir, idle_exit_s=None, execute_runs=False)
    still.start()
    try:
        with WorkflowClient(still.state_dir, autostart=False, timeout=30) as client:
            stranded.client = client
            key = f"headless-{uuid.uuid4().hex[:8]}"
            answer = stranded.headless(key=key)
            assert answer["outcome"] == "accepted", answer
            assert answer["receipt"] == {
                "runId": stranded.run_id,
                "state": "queued",
                "operation": "resume",
            }
            assert stranded.binding() == ("headless", None, 0)
            assert stranded.request_target() is None
            assert [m[4] for m in stranded.messages()] == ["cancelled"]
            again = stranded.headless(key=key)
            assert again["outcome"] == "adopted" and again["receipt"] == answer["receipt"]
            # The session is free: it starts a new run at once.
            other = _start(client, stranded.project, SESSION, gate="/nonexistent/gate")
            assert other != stranded.run_id
            # Now headless: neither way out applies any more.
            refused = stranded.headless()
            assert refused["error"]["code"] == "notInteractive", refused
            assert stranded.adopt()["error"]["code"] == "notInteractive"
    finally:
        still.stop("test teardown")


def test_resume_headless_is_refused_while_the_origin_session_is_open_or_after_the_end(
    stranded: Stranded,
) -> None:
    watcher, _ = coordinate(stranded.server, SESSION)
    try:
        refused = stranded.headless()
        assert (refused["outcome"], refused["error"]["code"]) == ("rejected", "originSessionOpen")
    finally:
        watcher.close()
    assert stranded.binding() == ("interactive", SESSION, 1)
    stranded.client.call("run.cancel", run_id=stranded.run_id)
    refused = after_close(stranded.headless)
    assert (refused["outcome"], refused["error"]["code"]) == ("rejected", "runFinished")
    missing = stranded.client.request("run.resumeHeadless", {}, run_id="run-nope")
    assert (missing["outcome"], missing["error"]["code"]) == ("notFound", "runNotFound")


# --- a workflow whose step needs a Pi session cannot go on headless ----------------------

VISIBLE = """
from pi_workflows import agent, compute, define_workflow

workflow = define_workflow(
    name="ask",
    start_at="prep",
    nodes={
        "prep": compute(lambda ctx: {}),
        "ask": agent(prompt="Say hi", output_schema={"type": "object"}),
    },
    edges=[{"from": "prep", "to": "ask"}],
)
"""


def _request(operation: str, key: str, payload: dict[str, Any], **envelope: Any) -> Any:
    return {
        "schema": "pi-workflows.client.v1",
        "type": "request",
        "requestId": f"req-{uuid.uuid4().hex}",
        "clientId": "handover-test",
        "operation": operation,
        "idempotencyKey": key,
        "payload": payload,
        **envelope,
    }


def test_resume_headless_is_refused_when_a_step_of_the_workflow_needs_a_pi_session(
    db: Database, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    write_workflow(project, "ask", VISIBLE)
    # What the resolver child answers (run as the server runs it), with step `ask` marked
    # the way a snapshot with a visible assistant-message step would say.
    answer = subprocess.run(
        [sys.executable, "-m", "pi_workflows.engine.resolve"],
        input=dumps(
            {"workflow": "ask", "projectPath": str(project), "agentDir": str(tmp_path), "input": {}}
        ),
        capture_output=True,
        timeout=30,
        check=True,
    )
    resolved = json.loads(answer.stdout)
    resolved["definition"]["nodes"]["ask"]["visible"] = True
    resolved["definitionDigest"] = sha256_digest(resolved["definition"])
    ctx = OperationContext(epoch=1, owner_id="server-1", agent_dir=tmp_path)
    payload = {"workflow": "ask", "input": {}, "projectPath": str(project)}
    start = StartRequest("ask", str(project), {}, origin_session_id=SESSION)
    started = start_run(db, _request("run.start", "start-1", payload), ctx, start, resolved)
    assert started["outcome"] == "accepted", started
    run_id = started["receipt"]["runId"]

    refused = resume_headless(
        db, _request("run.resumeHeadless", "headless-1", {}, runId=run_id), ctx, ActiveEpochs()
    )
    assert (refused["outcome"], refused["error"]["code"]) == ("rejected", "headlessForbidden")
    assert f"/workflow adopt {run_id}" in refused["error"]["message"]
    mode = db.fetch_value(
        "SELECT execution_mode FROM run_bindings WHERE run_id = :run_id", {"run_id": run_id}
    )
    assert mode == "interactive", "nothing changed"
