"""The session record over the real socket: `sessionEvents.record` from the coordinator,
capture status and integrity in the run view, and session-event pages with checkpoints.

A coordinator (a raw protocol connection holding the session's epoch, as the extension
does) records batches of a turn's events. A resend stores nothing twice; a gap, a count
mismatch and a conflicting resend are findings, not errors; only the active coordinator
records; a proved-lost turn fails its capture. A 2,000-event record pages under 1 MiB
and folds from any page's checkpoint to what a fold from the start gives.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.wire import protocol
from pi_workflows.wire.conversation import load_conversation, load_page
from pi_workflows.wire.session_fold import conversation, empty_state, fold, replay
from tests.conftest import Processes
from tests.server import origin
from tests.server.origin import SESSION, rows, session_snapshot, start
from tests.server.runs import wait_for
from tests.server.watchers import Watcher

pytestmark = pytest.mark.timeout(180)

running = origin.running
ask_project = origin.ask_project

MIB = 1024 * 1024


@dataclass
class Turn:
    """An interactive run's step message, sent and in an open turn, and its coordinator."""

    server: WorkflowServer
    run_id: str
    message_id: str
    turn_id: str
    coordinator: Watcher

    def record(
        self,
        events: list[dict[str, Any]],
        *,
        final: dict[str, Any] | None = None,
        watcher: Watcher | None = None,
        turn_id: str | None = None,
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "sessionId": SESSION,
            "turnId": turn_id or self.turn_id,
            "messageId": self.message_id,
            "events": events,
        }
        if final is not None:
            payload["final"] = final
        return (watcher or self.coordinator).request(
            "sessionEvents.record", payload, runId=self.run_id
        )

    def view(self) -> dict[str, Any]:
        with WorkflowClient(self.server.state_dir, autostart=False, timeout=30) as client:
            view: dict[str, Any] = client.call("run.get", run_id=self.run_id)["receipt"]
        protocol.validate("run-view.v1", view)
        return view

    def stored(self) -> list[tuple[Any, ...]]:
        return rows(
            self.server.state_dir,
            "SELECT seq, event_type FROM session_events WHERE run_id = ? ORDER BY position",
            self.run_id,
        )


@pytest.fixture
def turn(running: WorkflowServer, ask_project: Path) -> Iterator[Turn]:
    with WorkflowClient(running.state_dir, autostart=False, timeout=30) as client:
        run_id = start(client, ask_project, "ask", SESSION)["receipt"]["runId"]
        wait_for(client, run_id, {"waiting"})
    coordinator = Watcher(running.socket_path)
    try:
        coordinator.subscribe({"kind": "sessionView", "sessionId": SESSION, "coordinator": True})
        view = session_snapshot(coordinator, lambda v: v["nextMessage"] is not None, "a message")
        message_id = view["nextMessage"]["messageId"]
        sent = coordinator.request(
            "workflowMessage.reportBranch",
            {
                "sessionId": SESSION,
                "entries": [{"messageId": message_id, "entryId": "entry-step"}],
                "isIdle": False,
                "hasPendingMessages": False,
            },
        )
        assert sent["outcome"] == "accepted", sent
        started = coordinator.request(
            "workflowTurn.report",
            {"sessionId": SESSION, "messageId": message_id, "turnId": "turn-1", "phase": "started"},
            runId=run_id,
        )
        assert started["receipt"]["ownership"] == "active", started
        made = Turn(running, run_id, message_id, "turn-1", coordinator)
        yield made
        made.coordinator.close()  # a test may have replaced it (a reconnect)
    finally:
        coordinator.close()


def reply(first_seq: int, text: str, entry: str) -> list[dict[str, Any]]:
    """An assistant message streamed as start, two coalesced deltas and its end."""
    half = len(text) // 2
    return [
        {"seq": first_seq, "type": "messageStart", "role": "assistant"},
        {"seq": first_seq + 1, "type": "textDelta", "contentIndex": 0, "delta": text[:half]},
        {"seq": first_seq + 2, "type": "textDelta", "contentIndex": 0, "delta": text[half:]},
        {
            "seq": first_seq + 3,
            "type": "messageEnd",
            "entryId": entry,
            "role": "assistant",
            "stopReason": "stop",
            "message": {"role": "assistant", "content": [{"type": "text", "text": text}]},
        },
    ]


def segment(view: dict[str, Any]) -> dict[str, Any]:
    [shown] = view["sessionRecord"]["segments"]
    return dict(shown)


def test_a_resent_batch_adds_no_duplicates_and_the_final_count_completes_the_capture(
    turn: Turn,
) -> None:
    first = turn.record(reply(0, "Here is the plan.", "entry-a"))
    assert first["outcome"] == "accepted", first
    assert (first["receipt"]["stored"], first["receipt"]["duplicates"]) == (4, 0)
    # A reconnect re-sends the unacknowledged batch with the next events.
    again = turn.record(reply(0, "Here is the plan.", "entry-a") + reply(4, "Done.", "entry-b"))
    assert (again["receipt"]["stored"], again["receipt"]["duplicates"]) == (4, 4), again
    assert [seq for seq, _ in turn.stored()] == list(range(8))
    shown = segment(turn.view())
    assert shown["status"] == "recording" and shown["eventCount"] == 8
    assert shown["findings"] == [] and shown["node"] == "ask"
    assert shown["turnId"] == "turn-1" and shown["messageId"] == turn.message_id
    done = turn.record([], final={"count": 8})
    assert done["receipt"]["segment"]["status"] == "complete", done
    assert segment(turn.view())["findings"] == []
    # The verbatim entries are kept with the segment.
    entries = rows(
        turn.server.state_dir,
        "SELECT entry_id, role, content_hash IS NOT NULL FROM session_entries ORDER BY position",
    )
    assert entries == [("entry-a", "assistant", 1), ("entry-b", "assistant", 1)]


def test_a_gap_a_count_mismatch_and_a_conflicting_resend_are_findings_not_errors(
    turn: Turn,
) -> None:
    events = reply(0, "abcdef", "entry-a")
    assert turn.record(events[:2])["outcome"] == "accepted"
    # Seqs 2 and 3 never arrive: the next batch is stored anyway, the gap is found.
    later = reply(4, "ghij", "entry-b")
    gap = turn.record(later)
    assert gap["outcome"] == "accepted" and gap["receipt"]["stored"] == 4, gap
    # A resend with other content keeps the first and is counted.
    changed = dict(events[1], delta="other")
    conflict = turn.record([changed])
    assert conflict["receipt"]["duplicates"] == 1
    final = turn.record([], final={"count": 8})
    assert final["outcome"] == "accepted"
    findings = {f["code"]: f for f in segment(turn.view())["findings"]}
    assert findings["sequenceGap"] == {"code": "sequenceGap", "gaps": 1, "missing": 2}
    assert findings["countMismatch"] == {"code": "countMismatch", "expected": 8, "recorded": 6}
    assert findings["conflictingResend"]["count"] == 1
    # The late events fill the gap: the missing count goes back to zero.
    filled = turn.record(events[2:4])
    assert filled["receipt"]["stored"] == 2
    codes = {f["code"] for f in segment(turn.view())["findings"]}
    assert "countMismatch" not in codes
    assert (
        next(f for f in segment(turn.view())["findings"] if f["code"] == "sequenceGap")["missing"]
        == 0
    )


def test_only_the_coordinator_records_and_only_for_a_saved_turn(turn: Turn) -> None:
    bystander = Watcher(turn.server.socket_path)
    try:
        refused = turn.record(reply(0, "hi", "entry-a"), watcher=bystander)
        assert refused["outcome"] == "claimLost", refused
        assert refused["error"]["code"] == "coordinatorFenced"
    finally:
        bystander.close()
    unknown = turn.record(reply(0, "hi", "entry-a"), turn_id="turn-unknown")
    assert unknown["outcome"] == "notFound" and unknown["error"]["code"] == "turnNotFound"
    bad = turn.record([{"seq": 0, "type": "somethingElse"}])
    assert bad["outcome"] == "rejected" and bad["error"]["code"] == "eventTypeInvalid"
    # Errors name no recorded content.
    secret = turn.record(
        [{"seq": 1, "type": "textDelta", "delta": "SECRET"}, {"seq": 0, "type": "x"}]
    )
    assert "SECRET" not in json.dumps(secret)
    assert turn.stored() == []


def test_a_proved_lost_turn_fails_its_capture(turn: Turn) -> None:
    assert turn.record(reply(0, "partial", "entry-a")[:2])["outcome"] == "accepted"
    # An idle branch report without the turn's end proves the turn lost.
    closed = turn.coordinator.request(
        "workflowMessage.reportBranch",
        {
            "sessionId": SESSION,
            "entries": [{"messageId": turn.message_id, "entryId": "entry-step"}],
            "isIdle": True,
            "hasPendingMessages": False,
        },
    )
    assert closed["receipt"]["closedTurns"] == ["turn-1"], closed
    shown = segment(turn.view())
    assert shown["status"] == "failed" and shown["failure"] == "turnLost"
    assert {"code": "captureFailed", "reason": "turnLost"} in shown["findings"]
    # What the extension still had is kept; the capture stays failed.
    late = turn.record(reply(0, "partial", "entry-a")[2:], final={"count": 4})
    assert late["receipt"]["stored"] == 2 and late["receipt"]["segment"]["status"] == "failed"


def _cancel(turn: Turn) -> None:
    with WorkflowClient(turn.server.state_dir, autostart=False, timeout=30) as client:
        client.call("run.cancel", run_id=turn.run_id)
        wait_for(client, turn.run_id, {"cancelled"})


def _idle_report(turn: Turn) -> dict[str, Any]:
    return turn.coordinator.request(
        "workflowMessage.reportBranch",
        {"sessionId": SESSION, "entries": [], "isIdle": True, "hasPendingMessages": False},
    )


def test_a_run_ending_under_an_open_turn_leaves_its_capture_open_until_the_turn_ends(
    turn: Turn,
) -> None:
    """Bullet 40: the run's end closes its open turns `lost` (no later ownership), but
    that is no proved interruption of the Pi turn: the capture goes on recording, and
    the turn's last batch and final complete it."""
    assert turn.record(reply(0, "partial", "entry-a")[:2])["outcome"] == "accepted"
    _cancel(turn)
    [(status,)] = rows(
        turn.server.state_dir, "SELECT status FROM workflow_turns WHERE turn_id = 'turn-1'"
    )
    assert status == "lost"
    assert segment(turn.view())["status"] == "recording"
    done = turn.record(reply(0, "partial", "entry-a")[2:], final={"count": 4})
    assert done["receipt"]["segment"]["status"] == "complete", done
    assert segment(turn.view())["findings"] == []


def test_an_idle_report_fails_a_capture_whose_turn_ended_without_its_final(turn: Turn) -> None:
    """The run ended under the turn, then the Pi reports idle (a new Pi: the old one died
    before its last batch): the capture still recording is proved orphaned."""
    assert turn.record(reply(0, "partial", "entry-a")[:2])["outcome"] == "accepted"
    _cancel(turn)
    assert segment(turn.view())["status"] == "recording"
    assert _idle_report(turn)["outcome"] == "accepted"
    shown = segment(turn.view())
    assert (shown["status"], shown["failure"]) == ("failed", "turnLost")


# --- pages and checkpoints ---------------------------------------------------------------


def conversation_events(count: int) -> list[dict[str, Any]]:
    """`count` events of a long conversation: replies with thinking and text, tool calls
    built in deltas and run with results, and every other reply a 60 KiB delta (about
    5 MiB in all: pages are cut by bytes as well as by count, and checkpoints grow past
    the inline size)."""
    events: list[dict[str, Any]] = []
    seq = 0

    def add(event: dict[str, Any]) -> None:
        nonlocal seq
        if len(events) < count:
            events.append({"seq": seq, **event})
            seq += 1

    round_ = 0
    while len(events) < count:
        round_ += 1
        call = f"call-{round_}"
        add({"type": "messageStart", "role": "assistant"})
        add({"type": "thinkingDelta", "contentIndex": 0, "delta": f"think {round_} "})
        big = "x" * (60 * 1024) if round_ % 2 == 0 else f"text {round_} "
        add({"type": "textDelta", "contentIndex": 1, "delta": big})
        add({"type": "textDelta", "contentIndex": 1, "delta": "more"})
        add({"type": "toolCallDelta", "contentIndex": 2, "toolCallId": call, "delta": '{"c'})
        add({"type": "toolCallDelta", "contentIndex": 2, "delta": '":1}'})
        add(
            {
                "type": "toolCallEnd",
                "contentIndex": 2,
                "toolCallId": call,
                "name": "bash",
                "arguments": {"c": 1},
            }
        )
        add({"type": "messageEnd", "entryId": f"entry-{round_}", "role": "assistant"})
        add({"type": "toolStart", "toolCallId": call, "name": "bash"})
        add({"type": "toolEnd", "toolCallId": call, "isError": round_ % 7 == 0, "result": round_})
        add({"type": "messageStart", "role": "toolResult"})
        add({"type": "messageEnd", "entryId": f"result-{round_}", "role": "toolResult"})
    return events


def checkpoint_state(client: WorkflowClient, run_id: str, page: dict[str, Any]) -> Any:
    checkpoint = page["checkpoint"]
    assert checkpoint["position"] == page["first"]
    if "state" in checkpoint:
        return checkpoint["state"]
    return json.loads(client.run_content(run_id, checkpoint["stateContent"]))


def test_two_thousand_events_page_under_a_mib_and_every_checkpoint_folds_equal(
    turn: Turn,
) -> None:
    events = conversation_events(2000)
    for first in range(0, len(events), 250):
        answer = turn.record(events[first : first + 250])
        assert answer["outcome"] == "accepted", answer["error"]
    with WorkflowClient(turn.server.state_dir, autostart=False, timeout=60) as client:
        view = client.call("run.get", run_id=turn.run_id)["receipt"]
        assert view["sessionRecord"]["eventCount"] == 2000
        pages: list[tuple[dict[str, Any], Any]] = []
        cursor: str | None = None
        while True:  # newest page first, then older ones
            receipt = client.call(
                "view.page",
                {"list": "sessionEvents", "revision": view["revision"], "cursor": cursor},
                run_id=turn.run_id,
            )
            page = dict(receipt["receipt"])
            protocol.validate("run-page.v1", page)
            assert len(json.dumps(receipt).encode()) < MIB
            assert page["count"] == 2000 and page["cursor"] == cursor
            pages.append((page, checkpoint_state(client, turn.run_id, page)))
            cursor = page.get("nextCursor")
            if cursor is None:
                break
    pages.reverse()
    assert len(pages) > 2000 // 256 + 1  # some pages were cut by their bytes
    assert any(len(page["items"]) < 256 for page, _ in pages[:-1])
    # A checkpoint holds what still streams or runs: it stays small in a 5 MiB record.
    assert all(len(json.dumps(state)) < 16 * 1024 for _, state in pages)
    items = [item for page, _ in pages for item in page["items"]]
    assert [item["position"] for item in items] == list(range(2000))
    assert [item["seq"] for item in items] == list(range(2000))
    whole = fold(empty_state(), items)
    assert replay([(state, page["items"]) for page, state in pages]) == whole
    for number, (page, state) in enumerate(pages):
        # To positions inside this page: the pages before it, then this one cut short.
        before = [(earlier_state, earlier["items"]) for earlier, earlier_state in pages[:number]]
        for cut in (0, len(page["items"]) // 2, len(page["items"])):
            to_position = fold(empty_state(), items[: page["first"] + cut])
            assert replay([*before, (state, page["items"][:cut])]) == to_position
    shown = conversation(whole)
    assert shown[0]["content"][2]["execution"] == {"name": "bash", "status": "done", "result": 1}
    assert len([m for m in shown if m["role"] == "assistant"]) == len(
        [e for e in events if e["type"] == "messageStart" and e["role"] == "assistant"]
    )


def test_a_long_streaming_message_carries_on_in_a_checkpoint_by_reference(turn: Turn) -> None:
    """One reply streamed over 600 deltas: the pages after the first begin inside it, so
    their checkpoints hold its text so far, past the inline size: a content reference."""
    events = [{"seq": 0, "type": "messageStart", "role": "assistant"}]
    events += [
        {"seq": seq, "type": "textDelta", "contentIndex": 0, "delta": f"{seq:04d}" * 256}
        for seq in range(1, 600)
    ]
    events.append({"seq": 600, "type": "messageEnd", "entryId": "entry-long"})
    for first in range(0, len(events), 200):
        assert turn.record(events[first : first + 200])["outcome"] == "accepted"
    with WorkflowClient(turn.server.state_dir, autostart=False, timeout=60) as client:
        revision = client.call("run.get", run_id=turn.run_id)["receipt"]["revision"]
        pages = []
        cursor: str | None = "sessionEvents>0"
        while cursor is not None:  # oldest first, then newer ones
            page = client.call(
                "view.page",
                {"list": "sessionEvents", "revision": revision, "cursor": cursor},
                run_id=turn.run_id,
            )["receipt"]
            protocol.validate("run-page.v1", page)
            pages.append((checkpoint_state(client, turn.run_id, page), page["items"]))
            cursor = page.get("previousCursor")
        assert "stateContent" in page["checkpoint"]
    items = [item for _, page_items in pages for item in page_items]
    whole = fold(empty_state(), items)
    assert replay(pages) == whole
    [message] = conversation(whole)
    assert message["settled"] and message["entryId"] == "entry-long"
    assert len(message["content"][0]["text"]) == 599 * 1024


# --- run show ------------------------------------------------------------------------------


def test_a_settled_message_names_its_verbatim_entry_readable_only_by_its_run(
    turn: Turn, ask_project: Path
) -> None:
    big = "verbatim " * 4000  # 36 KB: past the inline size, still read in place
    events = reply(0, "Short.", "entry-a")
    events[3]["message"] = {"role": "assistant", "content": [{"type": "text", "text": big}]}
    assert turn.record(events)["outcome"] == "accepted"
    with WorkflowClient(turn.server.state_dir, autostart=False, timeout=30) as client:
        revision = client.call("run.get", run_id=turn.run_id)["receipt"]["revision"]
        page = client.call(
            "view.page",
            {"list": "sessionEvents", "revision": revision, "cursor": None},
            run_id=turn.run_id,
        )["receipt"]
        protocol.validate("run-page.v1", page)
        [end] = [item for item in page["items"] if item["type"] == "messageEnd"]
        ref = end["entryContent"]
        assert ref["mediaType"] == "application/json" and ref["byteCount"] > 36_000
        assert json.loads(client.run_content(turn.run_id, ref)) == events[3]["message"]
        other = start(client, ask_project, "ask", "another-session")["receipt"]["runId"]
        refused = client.request(
            "view.content", {"digest": ref["digest"], "mediaType": ref["mediaType"]}, run_id=other
        )
    assert refused["outcome"] != "accepted", "another run cannot read the entry"
    [started] = [item for item in page["items"] if item["type"] == "messageStart"]
    assert "entryContent" not in started
    # Clients show the settled message from its entry, not from the folded deltas.
    with WorkflowClient(turn.server.state_dir, autostart=False, timeout=30) as client:
        [message] = load_conversation(client, turn.view())
    assert message["verbatim"] is True
    assert [block["text"] for block in message["content"]] == [big]
    # An entry the caller holds already (a growing newest page) is not read again.
    with WorkflowClient(turn.server.state_dir, autostart=False, timeout=30) as client:
        held = {ref["digest"]: {"role": "assistant", "content": "held"}}
        again = load_page(client, turn.run_id, revision, None, held)
    assert again.entries == held


def test_run_show_prints_the_conversation_of_the_step_bounded_unless_full(
    turn: Turn, processes: Processes
) -> None:
    long_text = "word " * 2000  # 10,000 characters: longer than run show's head
    events = reply(0, "Here is the plan.", "entry-a")
    events += [
        {"seq": 4, "type": "messageStart", "role": "assistant"},
        {"seq": 5, "type": "thinkingDelta", "contentIndex": 0, "delta": "Look first."},
        {
            "seq": 6,
            "type": "toolCallEnd",
            "contentIndex": 1,
            "toolCallId": "call-1",
            "name": "bash",
            "arguments": {"command": "ls"},
        },
        {"seq": 7, "type": "messageEnd", "entryId": "entry-b", "role": "assistant"},
        {"seq": 8, "type": "toolStart", "toolCallId": "call-1", "name": "bash"},
        {"seq": 9, "type": "toolEnd", "toolCallId": "call-1", "isError": False, "result": "a.txt"},
        {"seq": 10, "type": "messageStart", "role": "assistant"},
        {"seq": 11, "type": "textDelta", "contentIndex": 0, "delta": long_text},
    ]
    assert turn.record(events)["outcome"] == "accepted"
    shown = processes.cli(turn.server.state_dir, "run", "show", turn.run_id)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "conversation: 1 recorded turns" in out
    assert "step ask, turn turn-1: capture recording" in out
    assert "assistant:  Here is the plan." in out
    assert "thinking: Look first." in out
    assert 'tool call bash {"command": "ls"}' in out
    assert "→ done: a.txt" in out
    assert long_text.strip() not in out and "--full prints everything" in out
    full = processes.cli(turn.server.state_dir, "run", "show", turn.run_id, "--full")
    assert long_text.strip() in full.stdout


def test_a_reconnected_coordinator_resends_without_duplicates_and_nothing_is_logged(
    turn: Turn, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    secret = reply(0, "PRIVATE-REPLY-TEXT", "entry-a")
    assert turn.record(secret[:3])["receipt"]["stored"] == 3
    # The extension reconnects: a new connection takes the epoch and re-sends all it has.
    turn.coordinator.close()
    again = Watcher(turn.server.socket_path)
    turn.coordinator = again
    again.subscribe({"kind": "sessionView", "sessionId": SESSION, "coordinator": True})
    resent = turn.record(secret, final={"count": 4})
    assert (resent["receipt"]["stored"], resent["receipt"]["duplicates"]) == (1, 3), resent
    assert [seq for seq, _ in turn.stored()] == [0, 1, 2, 3]
    assert segment(turn.view())["status"] == "complete"
    with WorkflowClient(turn.server.state_dir, autostart=False, timeout=30) as client:
        status = client.call("server.status")
    assert "PRIVATE" not in json.dumps(status)
    assert "PRIVATE" not in caplog.text
