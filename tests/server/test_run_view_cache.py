"""The reader actor's run view cache: a view is built once per revision, served only
while that revision is the run's current one, and bounded (views and bytes, LRU).

Real SQLite through the storage transitions; every served view is compared with a
fresh `build_run_view` of the same snapshot, so a stale answer fails the test.
"""

from __future__ import annotations

from typing import Any

import pytest

from pi_workflows.domain import RunViewCache, with_run_views
from pi_workflows.domain._operations import OperationContext, handle_operation
from pi_workflows.domain._run_view import build_run_view
from pi_workflows.domain._units import ClientOperation, ReadView
from pi_workflows.domain._view_subscriptions import run_view_read
from pi_workflows.domain._view_types import ViewSnapshot, ViewSpec
from pi_workflows.storage import (
    Claim,
    Database,
    cancel_run,
    finish_node_attempt,
    pause_run,
    resume_run,
    run_view_revision,
    start_node_attempt,
)
from pi_workflows.wire.canonical import dumps
from tests.server.test_view_revisions import CHANGES, _setup
from tests.storage.storage_helpers import enqueue, running

pytestmark = pytest.mark.timeout(60)


def _served(cache: RunViewCache, db: Database, run_id: str = "run-1") -> dict[str, Any]:
    """Serve the view twice: the first equals a fresh build, the second is a hit."""
    builds, hits = cache.counts.builds, cache.counts.hits
    view = cache.view(db, run_id)
    assert view is not None
    assert view == build_run_view(db, run_id), "the cached view is the fresh one"
    assert view["revision"] == run_view_revision(db, run_id)
    again = cache.view(db, run_id)
    assert again is view, "the same revision is served from the cache"
    assert cache.counts.builds - builds <= 1 and cache.counts.hits - hits >= 1
    return view


def test_a_view_is_built_once_per_revision_and_equals_a_fresh_build(db: Database) -> None:
    running(db)
    cache = RunViewCache()
    _served(cache, db)
    for _ in range(5):
        cache.view(db, "run-1")
    assert cache.counts.builds == 1 and cache.counts.hits == 6


def test_every_state_change_of_a_run_moves_it_to_a_fresh_view(db: Database) -> None:
    """Pause, resume, a node's start and completion, cancel: each serves the new view."""
    claim = running(db)
    cache = RunViewCache()
    seen = [_served(cache, db)]

    def step(change: Any) -> None:
        with db.write() as tx:
            change(tx)
        view = _served(cache, db)
        assert view["revision"] > seen[-1]["revision"]
        seen.append(view)

    step(
        lambda tx: start_node_attempt(
            tx, claim, attempt_id="a1", node_path="work", node_type="compute"
        )
    )
    assert seen[-1]["display"].get("currentNode") == "work"
    step(lambda tx: finish_node_attempt(tx, claim, attempt_id="a1", output={"n": 1}))
    assert seen[-1]["trace"]["items"][-1]["outcome"] == "completed"
    step(lambda tx: pause_run(tx, "run-1", claim=claim))
    assert seen[-1]["paused"] is True
    step(lambda tx: resume_run(tx, "run-1"))
    assert seen[-1]["paused"] is False
    step(lambda tx: cancel_run(tx, "run-1"))
    assert seen[-1]["display"]["status"] == "cancelled"
    assert cache.counts.builds == len(seen)


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_change_without_an_event_is_never_served_stale(db: Database, change: str) -> None:
    """Every kind of view change the revision counts (runner epochs, queue moves,
    effects, requests, decisions, content, restarts, the claim generation)."""
    phase, apply = CHANGES[change]
    claim: Claim | None = _setup(db, phase)
    cache = RunViewCache()
    before = _served(cache, db)
    apply(db, claim)
    after = _served(cache, db)
    assert after["revision"] > before["revision"]


def test_a_pruned_run_is_not_found_and_leaves_the_cache(db: Database) -> None:
    enqueue(db, "run-1")
    cache = RunViewCache()
    _served(cache, db)
    assert len(cache) == 1
    with db.write() as tx:
        tx.execute("DELETE FROM runs WHERE run_id = 'run-1'", {})
    assert cache.view(db, "run-1") is None
    assert len(cache) == 0 and cache.size_bytes == 0
    assert cache.view(db, "run-none") is None


def test_the_view_bound_drops_the_least_recently_served(db: Database) -> None:
    for run_id in ("a", "b", "c", "d"):
        enqueue(db, run_id)
    cache = RunViewCache(max_views=2)
    cache.view(db, "a")
    cache.view(db, "b")
    cache.view(db, "a")  # a is now the most recent
    cache.view(db, "c")  # drops b
    assert len(cache) == 2 and cache.counts.evictions == 1
    builds = cache.counts.builds
    cache.view(db, "a")
    cache.view(db, "c")
    assert cache.counts.builds == builds, "a and c stayed"
    cache.view(db, "b")
    assert cache.counts.builds == builds + 1, "b was dropped and is built again"


def test_the_byte_bound_holds_and_a_view_larger_than_it_is_not_kept(db: Database) -> None:
    for run_id in ("a", "b", "c"):
        enqueue(db, run_id)
    one = len(dumps(build_run_view(db, "a")))
    cache = RunViewCache(max_bytes=2 * one + one // 2)
    for run_id in ("a", "b", "c"):
        cache.view(db, run_id)
        assert cache.size_bytes <= cache.max_bytes
    assert len(cache) == 2 and cache.size_bytes == sum(
        len(dumps(build_run_view(db, run_id))) for run_id in ("b", "c")
    )
    small = RunViewCache(max_bytes=one // 2)
    assert small.view(db, "a") == build_run_view(db, "a"), "served, though not kept"
    assert len(small) == 0 and small.size_bytes == 0


def test_a_run_subscription_read_shares_the_cache(db: Database) -> None:
    running(db)
    cache = RunViewCache()
    view = _served(cache, db)
    hits = cache.counts.hits
    snapshot = run_view_read(db, "run-1", -1, cache)
    assert isinstance(snapshot, ViewSnapshot) and snapshot.payload is view
    assert cache.counts.hits == hits + 1
    assert run_view_read(db, "run-1", view["revision"], cache) is None, "unchanged"


def test_the_reader_serves_run_get_and_run_reads_from_its_cache(db: Database) -> None:
    enqueue(db, "run-1")
    cache = RunViewCache()
    request: Any = {
        "schema": "pi-workflows.client.v1",
        "type": "request",
        "requestId": "r1",
        "clientId": "c1",
        "operation": "run.get",
        "idempotencyKey": "k1",
        "payload": {},
        "runId": "run-1",
    }
    unit = with_run_views(ClientOperation(request, OperationContext(1, "owner")), cache)
    assert isinstance(unit, ClientOperation) and unit.views is cache
    answer = handle_operation(db, request, unit.ctx, None, unit.views)
    assert answer["receipt"] == build_run_view(db, "run-1") and cache.counts.builds == 1
    read = with_run_views(ReadView(ViewSpec("run", run_id="run-1"), -1), cache)
    assert isinstance(read, ReadView) and read.views is cache
    gone: Any = {**request, "runId": "run-none"}
    missing = handle_operation(db, gone, unit.ctx, None, cache)
    assert missing["outcome"] == "notFound"
    other = ReadView(ViewSpec("runList"), -1)
    assert with_run_views(other, cache) is other, "only a run's view is served from it"
