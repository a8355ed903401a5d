"""One active coordinator per origin session; a new connection fences the old one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pi_workflows.actors._base import wait_reply
from pi_workflows.actors._coordinator_epoch import (
    CheckCoordinator,
    ClaimCoordinator,
    CoordinatorEpochActor,
    ReleaseConnection,
)
from pi_workflows.domain import CoordinatorGrant

pytestmark = pytest.mark.timeout(10)


@pytest.fixture
def actor() -> Iterator[Any]:
    failures: list[str] = []
    ref = CoordinatorEpochActor.start(lambda name, exc: failures.append(name))
    try:
        yield ref
    finally:
        ref.stop(block=True, timeout=5)
    assert not failures


def _claim(actor: Any, session: str, connection: str) -> CoordinatorGrant:
    grant: CoordinatorGrant = wait_reply(
        lambda box: actor.tell(ClaimCoordinator(session, connection, box)), 5
    )
    return grant


def _active(actor: Any, grant: CoordinatorGrant) -> bool:
    result: bool = wait_reply(
        lambda box: actor.tell(
            CheckCoordinator(grant.session_id, grant.connection_id, grant.epoch, box)
        ),
        5,
    )
    return result


def test_a_new_connection_fences_the_old_one(actor: Any) -> None:
    old = _claim(actor, "session-1", "connection-1")
    assert _active(actor, old)
    new = _claim(actor, "session-1", "connection-2")
    assert new.epoch > old.epoch
    assert _active(actor, new)
    assert not _active(actor, old)


def test_sessions_are_independent(actor: Any) -> None:
    first = _claim(actor, "session-1", "connection-1")
    second = _claim(actor, "session-2", "connection-2")
    assert _active(actor, first) and _active(actor, second)


def test_disconnect_ends_the_epoch_and_it_never_returns(actor: Any) -> None:
    grant = _claim(actor, "session-1", "connection-1")
    actor.tell(ReleaseConnection("connection-1"))
    assert not _active(actor, grant)
    again = _claim(actor, "session-1", "connection-1")
    assert again.epoch > grant.epoch
    assert not _active(actor, grant)
