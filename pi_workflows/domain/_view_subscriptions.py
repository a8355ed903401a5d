"""What a subscription reads: the run list, one run's view, an origin session's view.

Implements client-protocol.md § Subscriptions and reconnection for the subscription
actor's `ViewReader`. Each read runs on the reader actor in one read transaction. An
unchanged run costs one revision lookup (`run_view_revision`), never a rebuild: the
view is built only when its revision differs from the one the actor last read.
"""

from __future__ import annotations

from typing import Final

from pi_workflows.domain._epochs import ActiveEpochs
from pi_workflows.domain._operations import build_run_list
from pi_workflows.domain._run_view import build_run_view
from pi_workflows.domain._run_view_cache import RunViewCache
from pi_workflows.domain._session_view import build_session_view
from pi_workflows.domain._view_types import ViewGone, ViewSnapshot, ViewSpec
from pi_workflows.storage import Database, run_view_revision

__all__ = ["RUN_GONE", "read_view", "run_view_read", "session_view_read"]

RUN_GONE: Final = ViewGone("runNotFound", "the run no longer exists (it was pruned)")


def read_view(
    db: Database,
    spec: ViewSpec,
    since: int,
    *,
    epochs: ActiveEpochs | None = None,
    views: RunViewCache | None = None,
) -> ViewSnapshot | ViewGone | None:
    """The view `spec` names if its revision differs from `since`; None when unchanged.

    `epochs`: the coordinator epochs the server published, for a coordinator's view.
    `views`: the reader actor's built run views, which a run's view is served from.
    """
    match spec.kind:
        case "runList":
            built = build_run_list(db, since)
            return None if built is None else ViewSnapshot(*built)
        case "run" if spec.run_id is not None:
            return run_view_read(db, spec.run_id, since, views)
        case "sessionView" if spec.session_id is not None:
            return session_view_read(db, spec, since, epochs)
        case _:
            raise ValueError(f"no view of kind {spec.kind}")


def run_view_read(
    db: Database, run_id: str, since: int, views: RunViewCache | None = None
) -> ViewSnapshot | ViewGone | None:
    """One run's `pi-workflows.run-view.v1`, built only when its revision moved (and,
    with `views`, only if no view of that revision was built before)."""
    with db.read():  # the revision and the view it names come from one snapshot
        revision = run_view_revision(db, run_id)
        if revision is None:
            return RUN_GONE
        if revision == since:
            return None
        view = build_run_view(db, run_id) if views is None else views.at(db, run_id, revision)
    if view is None:
        return RUN_GONE
    return ViewSnapshot(int(view["revision"]), view)


def session_view_read(
    db: Database, spec: ViewSpec, since: int, epochs: ActiveEpochs | None
) -> ViewSnapshot | None:
    """An origin session's view; a coordinator subscription's names the next message
    while its epoch is the session's active one."""
    assert spec.session_id is not None
    held = spec.connection_id is not None and spec.epoch is not None
    active = (
        held
        and epochs is not None
        and epochs.is_active(spec.session_id, str(spec.connection_id), int(spec.epoch or 0))
    )
    read = build_session_view(
        db, spec.session_id, coordinator=active, fenced=held and not active, since=since
    )
    return None if read is None else ViewSnapshot(read.revision, read.payload)
