"""pi_workflows.wire.channel: the typed channel.v1 records and the envelope rules."""

from __future__ import annotations

import pytest

from pi_workflows.wire import channel
from pi_workflows.wire.protocol import ProtocolViolation


def _stamp() -> channel.ChannelStamp:
    return channel.ChannelStamp(adapter_epoch="epoch-1", profile="ops")


def test_an_adapter_result_round_trips_and_a_server_command_does_too() -> None:
    stamp = _stamp()
    result: channel.PresentResult = {
        **stamp.envelope(),  # type: ignore[typeddict-item]
        "kind": "channel.present",
        "attemptId": "attempt-1",
        "channelRevision": 3,
        "result": {"status": "applied", "messageIds": [9]},
    }
    assert channel.decode_from_adapter(channel.encode_from_adapter(result)) == result
    command: channel.SettleCommand = {
        **stamp.envelope(),  # type: ignore[typeddict-item]
        "kind": "channel.settle",
        "attemptId": "attempt-2",
        "channelRevision": 4,
        "messageIds": [9],
        "text": "Approved.",
    }
    assert channel.decode_from_server(channel.encode_from_server(command)) == command


def test_the_stamp_numbers_each_envelope_from_one() -> None:
    stamp = _stamp()
    assert [stamp.envelope()["sequence"] for _ in range(3)] == [1, 2, 3]


@pytest.mark.parametrize(
    ("change", "keyword"),
    [
        ({"adapterEpoch": "epoch-0"}, "adapterEpoch"),
        ({"profile": "other"}, "profile"),
        ({"sequence": 3}, "sequence"),
        ({"sequence": 1}, "sequence"),
    ],
)
def test_the_sequence_check_refuses_a_stale_epoch_another_profile_or_a_gap(
    change: dict[str, object], keyword: str
) -> None:
    check = channel.ChannelSequenceCheck(adapter_epoch="epoch-1", profile="ops")
    check.check(
        {
            "schema": channel.CHANNEL_SCHEMA,
            "adapterEpoch": "epoch-1",
            "profile": "ops",
            "sequence": 1,
        }
    )
    message = {
        "schema": channel.CHANNEL_SCHEMA,
        "adapterEpoch": "epoch-1",
        "profile": "ops",
        "sequence": 2,
    }
    with pytest.raises(ProtocolViolation) as caught:
        check.check({**message, **change})  # type: ignore[typeddict-item]
    assert caught.value.keyword == keyword
    check.check(message)  # type: ignore[arg-type]
    assert check.last == 2


def test_an_answer_carries_no_identity() -> None:
    answer = {
        "schema": channel.CHANNEL_SCHEMA,
        "kind": "channel.answer",
        "adapterEpoch": "epoch-1",
        "profile": "ops",
        "sequence": 1,
        "eventId": channel.event_id(42),
        "answer": {"callbackData": "d:1:approve"},
    }
    assert channel.check_message(answer, sender="adapter")["eventId"] == "telegram:42"
    with pytest.raises(ProtocolViolation):
        channel.check_message({**answer, "fromUserId": 7}, sender="adapter")
