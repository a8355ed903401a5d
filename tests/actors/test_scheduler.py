"""Admission planning: capacity, priority order within a kind, alternation between kinds."""

from __future__ import annotations

import pytest

from pi_workflows.actors._scheduler import plan_admissions
from pi_workflows.storage import QueueKind, QueueRow

pytestmark = pytest.mark.timeout(10)


def _row(run_id: str, kind: QueueKind) -> QueueRow:
    return QueueRow(
        run_id=run_id,
        state="queued",
        kind=kind.value,
        priority=0,
        enqueued_at=0,
        park_reason=None,
        updated_at=0,
    )


def test_full_capacity_admits_nothing() -> None:
    waiting = {QueueKind.WORKFLOW: [_row("a", QueueKind.WORKFLOW)]}
    assert plan_admissions(0, waiting, None) == []


def test_admissions_stop_at_capacity_in_queue_order() -> None:
    rows = [_row(name, QueueKind.WORKFLOW) for name in "abcd"]
    chosen = plan_admissions(2, {QueueKind.WORKFLOW: rows}, None)
    assert [row.run_id for row in chosen] == ["a", "b"]


def test_kinds_alternate_when_both_wait() -> None:
    waiting = {
        QueueKind.WORKFLOW: [_row(f"w{i}", QueueKind.WORKFLOW) for i in range(3)],
        QueueKind.RESOURCE: [_row(f"r{i}", QueueKind.RESOURCE) for i in range(3)],
    }
    chosen = plan_admissions(4, waiting, None)
    assert [row.run_id for row in chosen] == ["w0", "r0", "w1", "r1"]


def test_the_kind_admitted_last_goes_second() -> None:
    waiting = {
        QueueKind.WORKFLOW: [_row("w0", QueueKind.WORKFLOW)],
        QueueKind.RESOURCE: [_row("r0", QueueKind.RESOURCE)],
    }
    assert [r.run_id for r in plan_admissions(1, waiting, QueueKind.WORKFLOW)] == ["r0"]
    assert [r.run_id for r in plan_admissions(1, waiting, QueueKind.RESOURCE)] == ["w0"]


def test_one_kind_alone_uses_every_slot() -> None:
    waiting = {QueueKind.RESOURCE: [_row(f"r{i}", QueueKind.RESOURCE) for i in range(5)]}
    assert len(plan_admissions(3, waiting, QueueKind.RESOURCE)) == 3
