"""Channel delivery as managed effects: the fences and the attempt numbering.

workflow-server.md § Supervised channel adapters: before a child sends or edits, the
server records an effect with numbered attempts; a stale adapter epoch, attempt or
channel revision cannot settle newer work; a known rejection starts a bounded new
attempt; an interrupted attempt is ambiguous and never sent again automatically; the
operator's confirm or retry (through `channel.recover`, the `run.recover` mechanism).

These run the storage units on a real server's database actor, against a run really
waiting at a protected decision (no profile is configured, so no child competes).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pi_workflows import WorkflowClient, WorkflowServer
from pi_workflows.domain._channel_work import (
    WorkItem,
    interrupt_adapter,
    record_result,
    reserve_work,
)
from pi_workflows.storage import Database
from pi_workflows.storage._channels import (
    DELIVER,
    MAX_CHANNEL_ATTEMPTS,
    SETTLE,
    ChannelAttempt,
    ChannelResult,
)
from pi_workflows.storage._decisions import answer_protected_decision
from pi_workflows.testing import CallUnit
from tests.server.channel_rig import attempts, channel_row, rows, waiting_run

pytestmark = pytest.mark.timeout(120)

CHANNEL = "telegram:ops"
APPLIED = ChannelResult("applied", message_ids=(77,))


@pytest.fixture
def waiting(running_server: WorkflowServer, short_tmp: Path) -> Iterator[tuple[str, str]]:
    """(run ID, decision ID) of a run waiting at its protected decision."""
    with WorkflowClient(running_server.state_dir, autostart=False, timeout=30) as client:
        run_id = waiting_run(client, short_tmp / "project")
    (decision_id,) = rows(
        running_server.state_dir,
        "SELECT decision_id FROM human_decisions WHERE run_id = ?",
        (run_id,),
    )[0]
    yield run_id, decision_id


def _consistent(server: WorkflowServer) -> None:
    with WorkflowClient(server.state_dir, autostart=False, timeout=30) as client:
        report = client.call("state.verify")["receipt"]
    assert report["consistent"], report["findings"]


def _call(server: WorkflowServer, work: Any) -> Any:
    return server.call_database(CallUnit(work))


def _reserve(server: WorkflowServer, decision_id: str, epoch: str) -> ChannelAttempt | None:
    item = WorkItem(DELIVER, CHANNEL, decision_id)
    return _call(server, functools.partial(reserve_work, item=item, adapter_epoch=epoch))  # type: ignore[no-any-return]


def _settle(
    server: WorkflowServer, attempt: ChannelAttempt, epoch: str, result: ChannelResult, **over: Any
) -> Any:
    fields: dict[str, Any] = {
        "channel": CHANNEL,
        "adapter_epoch": epoch,
        "attempt_id": attempt.attempt_id,
        "channel_revision": attempt.channel_revision,
        "result": result,
        **over,
    }
    return _call(server, functools.partial(record_result, **fields))


def test_a_delivery_is_reserved_before_it_is_sent_and_only_its_own_epoch_and_revision_settle_it(
    running_server: WorkflowServer, waiting: tuple[str, str]
) -> None:
    state_dir = running_server.state_dir
    _, decision_id = waiting
    attempt = _reserve(running_server, decision_id, "adapter-a")
    assert attempt is not None and attempt.attempt_number == 1
    assert attempt.request["presentation"]["buttons"][0]["label"] == "Approve"
    assert "Deploy build 42" in attempt.request["presentation"]["text"]
    assert attempts(state_dir) == [(1, "applying", None)]
    assert channel_row(state_dir) == (CHANNEL, 2, "presenting", "none")
    assert _reserve(running_server, decision_id, "adapter-a") is None, "one attempt in flight"

    # A stale adapter (another epoch) and a stale revision are refused; nothing changes.
    assert _settle(running_server, attempt, "adapter-old", APPLIED) is None
    assert _settle(running_server, attempt, "adapter-a", APPLIED, channel_revision=1) is None
    assert _settle(running_server, attempt, "adapter-a", APPLIED, attempt_id="effect-x/1") is None
    assert attempts(state_dir) == [(1, "applying", None)]

    settled = _settle(running_server, attempt, "adapter-a", APPLIED)
    assert settled is not None and settled.state == "applied" and settled.decision_open
    assert attempts(state_dir) == [(1, "applied", None)]
    assert channel_row(state_dir) == (CHANNEL, 2, "presented", "none")
    (result_hash,) = rows(state_dir, "SELECT result_hash FROM effects")[0]
    (stored,) = rows(state_dir, "SELECT content FROM blobs WHERE digest = ?", (result_hash,))[0]
    assert b'"messageIds":[77]' in stored, "the Telegram message IDs are the effect's result"
    # The same result again is stale: the attempt is no longer in flight.
    assert _settle(running_server, attempt, "adapter-a", APPLIED) is None
    _consistent(running_server)


def test_a_known_rejection_starts_a_bounded_new_attempt_with_a_new_revision(
    running_server: WorkflowServer, waiting: tuple[str, str]
) -> None:
    state_dir = running_server.state_dir
    _, decision_id = waiting
    rejected = ChannelResult("rejected", http_status=400, reason="Bad Request")
    revisions = []
    for number in range(1, MAX_CHANNEL_ATTEMPTS + 1):
        attempt = _reserve(running_server, decision_id, "adapter-a")
        assert attempt is not None and attempt.attempt_number == number
        revisions.append(attempt.channel_revision)
        # An old attempt's result is stale once a new attempt exists.
        settled = _settle(running_server, attempt, "adapter-a", rejected)
        assert settled is not None
    assert revisions == sorted(set(revisions)), "each attempt has a new channel revision"
    assert attempts(state_dir) == [(n, "rejected", None) for n in (1, 2, 3)]
    assert channel_row(state_dir)[2] == "failed"  # type: ignore[index]
    assert rows(state_dir, "SELECT state FROM effects") == [("rejected",)]
    assert _reserve(running_server, decision_id, "adapter-a") is None, "bounded"
    _consistent(running_server)


def test_an_interrupted_attempt_is_ambiguous_never_resent_and_retry_opens_attempt_two(
    running_server: WorkflowServer, waiting: tuple[str, str]
) -> None:
    state_dir = running_server.state_dir
    run_id, decision_id = waiting
    first = _reserve(running_server, decision_id, "adapter-a")
    assert first is not None
    count = _call(
        running_server,
        functools.partial(interrupt_adapter, channel=CHANNEL, adapter_epoch="adapter-a"),
    )
    assert count == 1
    assert attempts(state_dir) == [(1, "ambiguous", None)]
    assert channel_row(state_dir)[2] == "ambiguous"  # type: ignore[index]
    assert _reserve(running_server, decision_id, "adapter-b") is None, "never sent again"
    assert _settle(running_server, first, "adapter-a", APPLIED) is None, "too late"

    with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
        view = client.call("run.get", run_id=run_id)["receipt"]
        assert view["display"]["status"] == "ambiguous"
        answer = client.call("channel.recover", {"action": "retry"}, run_id=run_id)
        assert answer["receipt"]["nextAttemptNumber"] == 2
        assert "twice" in answer["receipt"]["warning"]
        again = client.request("channel.recover", {"action": "retry"}, run_id=run_id)
        assert again["outcome"] == "rejected", "nothing is ambiguous any more"
    assert attempts(state_dir) == [(1, "ambiguous", "retried")]
    second = _reserve(running_server, decision_id, "adapter-b")
    assert second is not None and second.attempt_number == 2
    assert second.request == first.request, "a retry sends what was reserved"
    assert attempts(state_dir) == [(1, "ambiguous", "retried"), (2, "applying", None)]
    events = rows(state_dir, "SELECT event_type FROM events WHERE run_id = ?", (run_id,))
    assert ("effect_recovered",) in events
    _consistent(running_server)


def test_confirm_records_the_delivery_and_a_settled_decision_gets_no_new_delivery(
    running_server: WorkflowServer, waiting: tuple[str, str]
) -> None:
    state_dir = running_server.state_dir
    run_id, decision_id = waiting
    assert _reserve(running_server, decision_id, "adapter-a") is not None
    _call(
        running_server,
        functools.partial(interrupt_adapter, channel=CHANNEL, adapter_epoch="adapter-a"),
    )
    with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
        answer = client.call(
            "channel.recover", {"action": "confirm", "messageIds": [77]}, run_id=run_id
        )
    assert answer["receipt"]["action"] == "confirm"
    assert attempts(state_dir) == [(1, "applied", "confirmed")]
    assert channel_row(state_dir)[2] == "presented"  # type: ignore[index]

    def answer_it(db: Database) -> Any:
        with db.write() as tx:
            return answer_protected_decision(
                tx, decision_id, {"choice": "approve"}, source_channel="cli", idempotency_key="k1"
            )

    assert _call(running_server, answer_it).outcome == "accepted"
    assert _reserve(running_server, decision_id, "adapter-a") is None
    deliveries = "SELECT count(*) FROM effects WHERE effect_type = 'channel.deliver'"
    assert rows(state_dir, deliveries) == [(1,)]
    # The settled decision's message is edited: an effect in flight on the ended run.
    item = WorkItem(SETTLE, CHANNEL, decision_id)
    edit = _call(running_server, functools.partial(reserve_work, item=item, adapter_epoch="a"))
    assert edit is not None and edit.request["messageIds"] == [77]
    assert "Answered elsewhere: Approve." in edit.request["text"]
    assert rows(state_dir, "SELECT status FROM runs WHERE run_id = ?", (run_id,)) == [
        ("completed",)
    ]
    _consistent(running_server)
    assert _settle(running_server, edit, "a", APPLIED) is not None
    assert channel_row(state_dir)[3] == "settled"  # type: ignore[index]
    _consistent(running_server)


def test_a_not_sent_attempt_waits_for_its_retry_at_then_goes_again_under_the_same_effect(
    running_server: WorkflowServer, waiting: tuple[str, str]
) -> None:
    state_dir = running_server.state_dir
    run_id, decision_id = waiting
    first = _reserve(running_server, decision_id, "adapter-a")
    assert first is not None
    limited = ChannelResult("notSent", reason="rateLimited", retry_after_ms=60_000)
    settled = _settle(running_server, first, "adapter-a", limited)
    assert settled is not None and settled.state == "pending"
    assert settled.retry_at is not None
    assert attempts(state_dir) == [(1, "cancelled", None)]
    assert channel_row(state_dir)[2] == "pending"  # type: ignore[index]
    ((retry_at, since, reason),) = rows(
        state_dir, "SELECT retry_at, retry_since, retry_reason FROM channel_messages"
    )
    assert retry_at - since >= 60_000 and reason == "rateLimited"
    assert _reserve(running_server, decision_id, "adapter-a") is None, "the 429 holds it back"
    with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
        view = client.call("run.get", run_id=run_id)["receipt"]
    [delivery] = view["channelDeliveries"]
    assert (delivery["state"], delivery["reason"]) == ("retrying", "rateLimited")
    assert delivery["retryAt"] == retry_at
    # The wait is over (as if its time came): the next attempt goes, same effect key.
    _call(running_server, _expire_retry)
    second = _reserve(running_server, decision_id, "adapter-a")
    assert second is not None and second.attempt_number == 2
    assert second.effect_id == first.effect_id and second.request == first.request
    assert _settle(running_server, second, "adapter-a", APPLIED).state == "applied"
    assert rows(state_dir, "SELECT retry_at, retry_since FROM channel_messages") == [(None, None)]
    _consistent(running_server)


def _expire_retry(db: Database) -> None:
    with db.write() as tx:
        tx.execute("UPDATE channel_messages SET retry_at = :now", {"now": tx.now})


def test_not_sent_past_the_retry_bound_is_failed_and_recover_retry_sends_it_again(
    running_server: WorkflowServer, waiting: tuple[str, str]
) -> None:
    state_dir = running_server.state_dir
    run_id, decision_id = waiting
    first = _reserve(running_server, decision_id, "adapter-a")
    assert first is not None
    server_error = ChannelResult("notSent", reason="serverError")
    settled = _settle(running_server, first, "adapter-a", server_error, retry_bound_ms=0)
    assert settled is not None and settled.state == "rejected" and settled.retry_at is None
    assert channel_row(state_dir)[2] == "failed"  # type: ignore[index]
    assert rows(state_dir, "SELECT state, error FROM effects") == [
        ("rejected", "not sent within the retry bound (serverError)")
    ]
    assert _reserve(running_server, decision_id, "adapter-a") is None, "never silently resent"
    with WorkflowClient(state_dir, autostart=False, timeout=30) as client:
        view = client.call("run.get", run_id=run_id)["receipt"]
        assert view["channelDeliveries"][0]["state"] == "failed"
        refused = client.request("channel.recover", {"action": "confirm"}, run_id=run_id)
        assert refused["outcome"] == "rejected", "a failed delivery was not sent: no confirm"
        answer = client.call("channel.recover", {"action": "retry"}, run_id=run_id)
        assert answer["receipt"]["nextAttemptNumber"] == 2
        view = client.call("run.get", run_id=run_id)["receipt"]
        assert "channelDeliveries" not in view
    second = _reserve(running_server, decision_id, "adapter-b")
    assert second is not None and second.attempt_number == 2
    assert second.effect_id == first.effect_id
    assert attempts(state_dir) == [(1, "cancelled", None), (2, "applying", None)]
    _consistent(running_server)
