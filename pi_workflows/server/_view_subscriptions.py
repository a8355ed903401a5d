"""What a subscription reads: the run list, one run's view, an origin session's view.

Implements client-protocol.md § Subscriptions and reconnection for the subscription
actor's `ViewReader`. Each read runs on the reader actor in one read transaction. An
unchanged run costs one revision lookup (`run_view_revision`), never a rebuild: the
view is built only when its revision differs from the one the actor last read.
"""

from __future__ import annotations

from typing import Any, Final

from pi_workflows.actors._subscriptions import ViewGone, ViewSnapshot, ViewSpec
from pi_workflows.server._operations import build_run_list
from pi_workflows.server._run_view import build_run_view
from pi_workflows.storage import Database, run_view_revision
from pi_workflows.wire.protocol import SESSION_VIEW_SCHEMA

__all__ = ["RUN_GONE", "read_view", "run_view_read", "session_view"]

RUN_GONE: Final = ViewGone("runNotFound", "the run no longer exists (it was pruned)")


def read_view(db: Database, spec: ViewSpec, since: int) -> ViewSnapshot | ViewGone | None:
    """The view `spec` names if its revision differs from `since`; None when unchanged."""
    match spec.kind:
        case "runList":
            built = build_run_list(db, since)
            return None if built is None else ViewSnapshot(*built)
        case "run" if spec.run_id is not None:
            return run_view_read(db, spec.run_id, since)
        case "sessionView" if spec.session_id is not None:
            return None if since == 0 else ViewSnapshot(0, session_view(spec.session_id))
        case _:
            raise ValueError(f"no view of kind {spec.kind}")


def run_view_read(db: Database, run_id: str, since: int) -> ViewSnapshot | ViewGone | None:
    """One run's `pi-workflows.run-view.v1`, built only when its revision moved."""
    with db.read():  # the revision and the view it names come from one snapshot
        revision = run_view_revision(db, run_id)
        if revision is None:
            return RUN_GONE
        if revision == since:
            return None
        view = build_run_view(db, run_id)
    if view is None:
        return RUN_GONE
    return ViewSnapshot(int(view["revision"]), view)


def session_view(session_id: str) -> dict[str, Any]:
    """`pi-workflows.session-view.v1`, the shape only: the origin-session issue fills it."""
    return {
        "schema": SESSION_VIEW_SCHEMA,
        "sessionId": session_id,
        "revision": 0,
        "activeRun": None,
        "messages": {"count": 0, "items": []},
        "nextMessage": None,
    }
