"""State retention (workflow-server.md § State retention, manual `state prune`): select
expired root-run trees free of protected state, delete one tree (every run table, its
view content and command receipts), and collect the blobs no remaining row names (the
tree's, and any other left behind); the backup first is `_backup.py`. Internal;
`pi_workflows.storage` exports the names.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass

from pi_workflows.storage._db import Database, Reader, Tx
from pi_workflows.supervision import crash_point

__all__ = [
    "DAY_MS",
    "CompactOutcome",
    "PruneTree",
    "TreePage",
    "collect_unnamed_blobs",
    "collect_unreferenced_blobs",
    "compact_state",
    "delete_tree",
    "known_resource_uids",
    "known_run_ids",
    "known_runner_epochs",
    "prunable_tree_page",
    "prunable_trees",
    "retained_trees",
    "runner_work_pending",
    "runs_by_state",
    "tree_blockers",
    "tree_runner_epochs",
    "unnamed_blobs",
]

DAY_MS = 24 * 60 * 60 * 1000

# Trees whose every run is terminal and finished before the cutoff, oldest first.
# Groups every run by its root (one pass over runs: a manual maintenance read).
_SELECT_EXPIRED_TREES = """
SELECT root_run_id, count(*) AS run_count, max(finished_at) AS finished_at
FROM runs
GROUP BY root_run_id
HAVING sum(
    status NOT IN ('completed', 'failed', 'timed_out', 'cancelled')
    OR finished_at IS NULL OR finished_at >= :cutoff
) = 0
ORDER BY max(finished_at), root_run_id
"""
_SELECT_TREE_RUNS = "SELECT run_id FROM runs WHERE root_run_id = :root ORDER BY created_at, run_id"
_TREE = "(SELECT run_id FROM runs WHERE root_run_id = :root)"
# Each check names one kind of protected state; any row blocks the tree.
_BLOCKERS: tuple[tuple[str, str], ...] = (
    (
        "unfinishedRun",
        "SELECT 1 FROM runs WHERE root_run_id = :root AND (status NOT IN"
        " ('completed', 'failed', 'timed_out', 'cancelled') OR finished_at IS NULL"
        " OR finished_at >= :cutoff)",
    ),
    (
        "liveQueueRow",
        f"SELECT 1 FROM run_queue WHERE run_id IN {_TREE}"
        " AND state IN ('queued', 'starting', 'running', 'parked')",
    ),
    ("activeLease", f"SELECT 1 FROM leases WHERE resource IN {_TREE}"),
    (
        "activeRunner",
        f"SELECT 1 FROM runner_epochs WHERE run_id IN {_TREE} AND status IN ('starting', 'ready')",
    ),
    (
        "registeredProcess",
        f"SELECT 1 FROM runner_processes WHERE runner_epoch IN"
        f" (SELECT runner_epoch FROM runner_epochs WHERE run_id IN {_TREE})",
    ),
    (
        "pendingInteraction",
        f"SELECT 1 FROM interactive_requests WHERE run_id IN {_TREE} AND status = 'pending'",
    ),
    (
        "pendingDecision",
        f"SELECT 1 FROM human_decisions WHERE run_id IN {_TREE} AND status = 'pending'",
    ),
    (
        "pendingMessage",
        f"SELECT 1 FROM workflow_messages WHERE run_id IN {_TREE} AND state = 'pending'",
    ),
    (
        "openTurn",
        f"SELECT 1 FROM workflow_turns WHERE run_id IN {_TREE} AND status = 'open'",
    ),
    # A capture still recording (its last batch within the retention window): the
    # extension may still send the rest of the turn's session events.
    (
        "recordingSegment",
        f"SELECT 1 FROM session_segments WHERE run_id IN {_TREE}"
        " AND status = 'recording' AND updated_at >= :cutoff",
    ),
    (
        "followUpFromOutside",
        f"SELECT 1 FROM follow_ups WHERE chain_run_id IN {_TREE} AND run_id NOT IN {_TREE}",
    ),
    (
        "queuedFollowUp",
        f"SELECT 1 FROM follow_ups WHERE run_id IN {_TREE} AND state = 'pending'",
    ),
    (
        "unsettledEffect",
        f"SELECT 1 FROM effects WHERE run_id IN {_TREE}"
        " AND state IN ('pending', 'applying', 'ambiguous')",
    ),
    (
        "validatingSubmission",
        "SELECT 1 FROM interactive_submissions WHERE outcome = 'validating' AND request_id IN"
        f" (SELECT request_id FROM interactive_requests WHERE run_id IN {_TREE})",
    ),
    (
        "referencedFromOutside",
        "SELECT 1 FROM runs WHERE root_run_id != :root AND ("
        f"parent_run_id IN {_TREE} OR restart_of IN {_TREE} OR continuation_of IN {_TREE})",
    ),
    # A run a resource manager's resource reserved (`ctx.workflows.ensure`): the resource
    # owns it while the resource exists, so a repeated pass finds the same run.
    ("resourceChildRun", f"SELECT 1 FROM resource_child_runs WHERE run_id IN {_TREE}"),
    (
        "decisionFromOutside",
        f"SELECT 1 FROM human_decisions WHERE continuation_run_id IN {_TREE}"
        f" AND run_id NOT IN {_TREE}",
    ),
    (
        "channelFromOutside",
        "SELECT 1 FROM channel_messages AS c JOIN human_decisions AS d"
        " ON d.decision_id = c.decision_id"
        f" WHERE d.run_id NOT IN {_TREE} AND (c.delivery_effect_id IN"
        f" (SELECT effect_id FROM effects WHERE run_id IN {_TREE}) OR c.settlement_effect_id IN"
        f" (SELECT effect_id FROM effects WHERE run_id IN {_TREE}))",
    ),
)
# Every digest column (blobs are shared: identical content has one row).
_DIGEST_COLUMNS: tuple[tuple[str, str], ...] = (
    ("node_attempts", "output_hash"),
    ("human_decisions", "request_hash"),
    ("human_decisions", "default_response_hash"),
    ("human_decision_resolutions", "response_hash"),
    ("effects", "request_hash"),
    ("effects", "result_hash"),
    ("effect_attempts", "result_hash"),
    ("interactive_requests", "contract_hash"),
    ("interactive_submissions", "payload_hash"),
    ("interactive_submissions", "receipt_hash"),
    ("runner_epochs", "diagnostic_hash"),
    ("follow_ups", "content_hash"),
    ("session_entries", "content_hash"),
    ("session_pages", "checkpoint_hash"),
)
# The digests a tree's rows name, by the tables' path to the run.
_TREE_DIGESTS = f"""
SELECT output_hash AS digest FROM node_attempts WHERE run_id IN {_TREE}
UNION SELECT request_hash FROM human_decisions WHERE run_id IN {_TREE}
UNION SELECT default_response_hash FROM human_decisions WHERE run_id IN {_TREE}
UNION SELECT r.response_hash FROM human_decision_resolutions AS r
    JOIN human_decisions AS d ON d.decision_id = r.decision_id WHERE d.run_id IN {_TREE}
UNION SELECT request_hash FROM effects WHERE run_id IN {_TREE}
UNION SELECT result_hash FROM effects WHERE run_id IN {_TREE}
UNION SELECT a.result_hash FROM effect_attempts AS a
    JOIN effects AS e ON e.effect_id = a.effect_id WHERE e.run_id IN {_TREE}
UNION SELECT contract_hash FROM interactive_requests WHERE run_id IN {_TREE}
UNION SELECT s.payload_hash FROM interactive_submissions AS s
    JOIN interactive_requests AS i ON i.request_id = s.request_id WHERE i.run_id IN {_TREE}
UNION SELECT s.receipt_hash FROM interactive_submissions AS s
    JOIN interactive_requests AS i ON i.request_id = s.request_id WHERE i.run_id IN {_TREE}
UNION SELECT diagnostic_hash FROM runner_epochs WHERE run_id IN {_TREE}
UNION SELECT content_hash FROM follow_ups WHERE run_id IN {_TREE}
UNION SELECT content_hash FROM session_entries WHERE run_id IN {_TREE}
UNION SELECT checkpoint_hash FROM session_pages WHERE run_id IN {_TREE}
"""
# Every column whose value may be a blob's digest: the referencing columns above, and
# those that name a blob without a foreign key (a run's definition snapshot, a workflow
# message's content) or carry a digest of the same bytes (kept conservatively: a blob
# any row's digest names is never collected).
_NAMING_COLUMNS: tuple[tuple[str, str], ...] = (
    *_DIGEST_COLUMNS,
    ("runs", "definition_digest"),
    ("runs", "input_hash"),
    ("workflow_messages", "content_digest"),
    ("human_decisions", "request_digest"),
    ("human_decision_resolutions", "answer_digest"),
    ("human_decision_answers", "answer_digest"),
    ("runner_epochs", "launch_envelope_hash"),
)
# Blobs written before :before that no naming column holds (one pass over each column:
# a manual maintenance read; every table but two has an index on the column anyway).
_SELECT_UNNAMED_BLOBS = "SELECT digest FROM blobs WHERE created_at < :before" + "".join(
    f" EXCEPT SELECT {column} FROM {table}" for table, column in _NAMING_COLUMNS
)
# Stored replies of live runner epochs that carry a content reference: a retried message
# gets the same reply, and its reference offered again (`apply_message`), so a digest
# named in one counts as named while its runner may still ask.
_LIVE_REPLIES_WITH_REFS = """
SELECT m.reply FROM runner_messages AS m
JOIN runner_epochs AS e ON e.runner_epoch = m.runner_epoch AND e.status IN ('starting', 'ready')
WHERE instr(m.reply, CAST('Ref"' AS BLOB)) > 0
"""
_TREE_EVENT_PAYLOADS = f"SELECT payload FROM events WHERE run_id IN {_TREE}"
_EVENT_PAYLOADS_WITH_DIGESTS = "SELECT payload FROM events WHERE instr(payload, 'sha256:') > 0"
_BLOCKER_CHECKS = tuple((name, f"SELECT EXISTS ({check})") for name, check in _BLOCKERS)
_DIGEST_CHECKS = tuple(
    f"SELECT EXISTS (SELECT 1 FROM {table} WHERE {column} = :digest)"
    for table, column in _DIGEST_COLUMNS
)
_DELETE_TREE_RECEIPTS = f"DELETE FROM host_commands WHERE run_id IN {_TREE}"
# `runs` cascades to every run table (queue, events, attempts, effects, decisions,
# requests, messages, bindings, runner epochs and their rows, run_view_content).
_DELETE_TREE_RUNS = "DELETE FROM runs WHERE root_run_id = :root"
_DELETE_BLOB = "DELETE FROM blobs WHERE digest = :digest"
_BLOB_EXISTS = "SELECT EXISTS (SELECT 1 FROM blobs WHERE digest = :digest)"
# Work that automatic retention yields to: a run admitted (queued and unpaused), starting
# or running, or a runner epoch that has not ended (workflow-server.md § State retention).
# Each branch reads a partial index only (every finished run keeps a `done` queue row:
# one OR across states would scan them all, once per tree a sweep deletes).
_RUNNER_WORK_PENDING = """
SELECT EXISTS (SELECT 1 FROM run_queue WHERE state IN ('starting', 'running'))
    OR EXISTS (SELECT 1 FROM run_queue AS q JOIN runs AS r ON r.run_id = q.run_id
               WHERE q.state = 'queued' AND r.paused = 0)
    OR EXISTS (SELECT 1 FROM runner_epochs WHERE status IN ('starting', 'ready'))
    OR EXISTS (SELECT 1 FROM resource_claims)
    OR EXISTS (SELECT 1 FROM resource_queue WHERE available_at <= :now)
"""
_TREE_RUNNER_EPOCHS = (
    "SELECT runner_epoch AS run_id FROM runner_epochs"
    f" WHERE run_id IN {_TREE} ORDER BY runner_epoch"
)
_DIGEST_IN_TEXT = re.compile(r"sha256:[0-9a-f]{64}")
_DIGEST_IN_BYTES = re.compile(rb"sha256:[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class PruneTree:
    """One expired root-run tree: its root, its runs and when its last run finished."""

    root_run_id: str
    run_ids: tuple[str, ...]
    finished_at: int


@dataclass(frozen=True, slots=True)
class _Tree:
    root_run_id: str
    run_count: int
    finished_at: int


@dataclass(frozen=True, slots=True)
class _RunId:
    run_id: str


@dataclass(frozen=True, slots=True)
class _Digest:
    digest: str | None


@dataclass(frozen=True, slots=True)
class _Payload:
    payload: str


def prunable_trees(reader: Reader, cutoff: int) -> tuple[list[PruneTree], int]:
    """The trees `state prune` would delete now, oldest first, and how many trees are
    expired but kept for protected state. Call it in one read transaction.

    A tree is a root run and every run whose `root_run_id` it is (restarts,
    continuations, children). It expires when every run of it is terminal and finished
    before `cutoff`; it is kept while `tree_blockers` names any protected state: a live
    queue row, an active lease, runner epoch or registered process, a pending
    interaction, decision or workflow message (a terminal result not yet delivered), an
    open workflow turn, a queued follow-up, a validating submission, an unsettled or
    ambiguous effect, a run a resource manager's resource reserved as its child, or a
    run, decision, follow-up or channel message outside the tree that points into it,
    or a session capture still recording.
    """
    trees: list[PruneTree] = []
    kept = 0
    for tree in reader.fetch_all(_SELECT_EXPIRED_TREES, {"cutoff": cutoff}, _Tree):
        if tree_blockers(reader, tree.root_run_id, cutoff):
            kept += 1
            continue
        runs = reader.fetch_all(_SELECT_TREE_RUNS, {"root": tree.root_run_id}, _RunId)
        trees.append(
            PruneTree(tree.root_run_id, tuple(r.run_id for r in runs), int(tree.finished_at))
        )
    return trees, kept


# One page of root-run trees in root order, after a cursor: the index on `root_run_id`
# reads only the page's runs, so a page costs the same however many runs there are.
_SELECT_TREE_PAGE = """
SELECT root_run_id, count(*) AS run_count, max(finished_at) AS finished_at,
       sum(status NOT IN ('completed', 'failed', 'timed_out', 'cancelled')
           OR finished_at IS NULL OR finished_at >= :cutoff) AS unexpired
FROM runs
WHERE root_run_id > :after
GROUP BY root_run_id
ORDER BY root_run_id
LIMIT :limit
"""


@dataclass(frozen=True, slots=True)
class _PagedTree:
    root_run_id: str
    run_count: int
    finished_at: int | None
    unexpired: int


@dataclass(frozen=True, slots=True)
class TreePage:
    """One page of `prunable_tree_page`: its prunable trees, how many expired trees it
    kept for protected state, and the cursor of the next page (None: the last)."""

    trees: tuple[PruneTree, ...]
    kept: int
    next_after: str | None


def prunable_tree_page(reader: Reader, cutoff: int, *, after: str, limit: int) -> TreePage:
    """The trees `prunable_trees` would select among the next `limit` root-run trees
    after root `after` (in root order; "" for the first page).

    For automatic retention, which reads a page, deletes its trees and reads the next,
    so no read of the whole history holds the reader actor (a `run.start` looks up its
    receipt there). The pages together select what `prunable_trees` does, save trees
    created or changed meanwhile, and every tree is rechecked in its deletion anyway.
    """
    params = {"cutoff": cutoff, "after": after, "limit": limit}
    groups = reader.fetch_all(_SELECT_TREE_PAGE, params, _PagedTree)
    trees: list[PruneTree] = []
    kept = 0
    for group in groups:
        if group.unexpired or group.finished_at is None:
            continue
        if tree_blockers(reader, group.root_run_id, cutoff):
            kept += 1
            continue
        runs = reader.fetch_all(_SELECT_TREE_RUNS, {"root": group.root_run_id}, _RunId)
        trees.append(
            PruneTree(group.root_run_id, tuple(r.run_id for r in runs), int(group.finished_at))
        )
    next_after = groups[-1].root_run_id if len(groups) == limit else None
    return TreePage(tuple(trees), kept, next_after)


def tree_blockers(reader: Reader, root_run_id: str, cutoff: int) -> list[str]:
    """The kinds of protected state that keep the tree of `root_run_id` (empty: none)."""
    params = {"root": root_run_id, "cutoff": cutoff}
    return [name for name, check in _BLOCKER_CHECKS if reader.fetch_value(check, params)]


def delete_tree(tx: Tx, root_run_id: str, cutoff: int) -> tuple[list[str], set[str]] | None:
    """Delete one tree in `tx` if it is still prunable; None if it is not (or is gone).

    Rechecks the tree in the transaction that deletes it, so a run restarted or a
    decision opened since the selection keeps it. Returns the deleted run IDs and the
    digests the tree referenced (to collect with `collect_unreferenced_blobs`).
    """
    params = {"root": root_run_id, "cutoff": cutoff}
    runs = [r.run_id for r in tx.fetch_all(_SELECT_TREE_RUNS, {"root": root_run_id}, _RunId)]
    if not runs or tree_blockers(tx, root_run_id, cutoff):
        return None
    digests = {
        row.digest for row in tx.fetch_all(_TREE_DIGESTS, params, _Digest) if row.digest is not None
    }
    for row in tx.fetch_all(_TREE_EVENT_PAYLOADS, params, _Payload):
        digests.update(_DIGEST_IN_TEXT.findall(row.payload))
    tx.execute(_DELETE_TREE_RECEIPTS, params)
    tx.execute(_DELETE_TREE_RUNS, params)
    tx.lifecycle.append("prune_tree")  # its commit passes the tree's crash points
    return runs, digests


def tree_runner_epochs(reader: Reader, root_run_id: str) -> list[str]:
    """The runner epochs of every run of the tree (their logs go with the tree)."""
    rows = reader.fetch_all(_TREE_RUNNER_EPOCHS, {"root": root_run_id}, _RunId)
    return [row.run_id for row in rows]


_COUNT_TREES_KEPT = """
SELECT count(*) FROM (SELECT root_run_id FROM runs GROUP BY root_run_id HAVING sum(
    status NOT IN ('completed', 'failed', 'timed_out', 'cancelled')
    OR finished_at IS NULL OR finished_at >= :cutoff) > 0)
"""
_RUNS_BY_STATE = "SELECT status AS key, count(*) AS n FROM runs GROUP BY status ORDER BY status"


@dataclass(frozen=True, slots=True)
class _Counted:
    key: str
    n: int


def retained_trees(reader: Reader, cutoff: int) -> int:
    """How many root-run trees are kept at `cutoff` for their age or unfinished runs
    (trees kept only for protected state are not counted here)."""
    return int(reader.fetch_value(_COUNT_TREES_KEPT, {"cutoff": cutoff}))


def runs_by_state(reader: Reader) -> dict[str, int]:
    """The number of runs in each status (`state status`)."""
    return {row.key: row.n for row in reader.fetch_all(_RUNS_BY_STATE, {}, _Counted)}


_KNOWN_CHUNK = 500


def _known(reader: Reader, sql: str, names: Iterable[str]) -> set[str]:
    wanted = sorted(set(names))
    found: set[str] = set()
    for start in range(0, len(wanted), _KNOWN_CHUNK):
        chunk = wanted[start : start + _KNOWN_CHUNK]
        marks = ", ".join(f":n{i}" for i in range(len(chunk)))
        params = {f"n{i}": name for i, name in enumerate(chunk)}
        found.update(str(row[0]) for row in reader.connection.execute(sql.format(marks), params))
    return found


def known_run_ids(reader: Reader, run_ids: Iterable[str]) -> set[str]:
    """Which of `run_ids` name a run that exists."""
    return _known(reader, "SELECT run_id FROM runs WHERE run_id IN ({})", run_ids)


def known_runner_epochs(reader: Reader, epochs: Iterable[str]) -> set[str]:
    """Which of `epochs` name a runner epoch that exists."""
    return _known(
        reader, "SELECT runner_epoch FROM runner_epochs WHERE runner_epoch IN ({})", epochs
    )


def known_resource_uids(reader: Reader, uids: Iterable[str]) -> set[str]:
    """Which of `uids` name a resource that exists (a deleted one leaves only its log)."""
    return _known(reader, "SELECT uid FROM resources WHERE uid IN ({})", uids)


def runner_work_pending(reader: Reader, now: int) -> bool:
    """Whether a run is admitted (queued, unpaused), starting or running, a runner epoch
    has not ended, a reconcile pass holds a claim (live, or a dead pass's until the key
    is claimed again) or a resource key is due at `now`: automatic retention yields."""
    return bool(reader.fetch_value(_RUNNER_WORK_PENDING, {"now": now}))


def collect_unreferenced_blobs(tx: Tx, candidates: Iterable[str]) -> int:
    """Delete each candidate blob that no row references any more; return how many.

    A blob is referenced by a digest column or by a digest named in an event payload
    (an `outputRef`). The payload check reads every remaining event once, in this
    transaction, so no new reference can appear between the check and the delete.
    """
    # Digests in event payloads may name view content, not blobs: keep stored blobs only.
    wanted = {d for d in set(candidates) if tx.fetch_value(_BLOB_EXISTS, {"digest": d})}
    if not wanted:
        return 0
    for check in _DIGEST_CHECKS:
        wanted = {d for d in wanted if not tx.fetch_value(check, {"digest": d})}
        if not wanted:
            return 0
    # One streamed pass over the payloads that name any digest (not loaded at once).
    for (payload,) in tx.connection.execute(_EVENT_PAYLOADS_WITH_DIGESTS):
        wanted.difference_update(_DIGEST_IN_TEXT.findall(payload))
        if not wanted:
            return 0
    for digest in wanted:
        tx.execute(_DELETE_BLOB, {"digest": digest})
    return len(wanted)


def unnamed_blobs(reader: Reader, written_before: int) -> set[str]:
    """The blobs written before `written_before` that no row names: no digest column
    holds them, no event payload names them, and no stored reply of a live runner epoch
    carries them as a reference (a retried message is offered it again). A read; call
    it in one transaction (`collect_unnamed_blobs` deletes what it finds)."""
    conn = reader.connection
    candidates = {
        str(digest) for (digest,) in conn.execute(_SELECT_UNNAMED_BLOBS, {"before": written_before})
    }
    if not candidates:
        return candidates
    # One streamed pass over the payloads that name any digest (an `outputRef`), and
    # over the live runners' stored replies that carry a reference (`resultRef`).
    for (payload,) in conn.execute(_EVENT_PAYLOADS_WITH_DIGESTS):
        candidates.difference_update(_DIGEST_IN_TEXT.findall(payload))
        if not candidates:
            return candidates
    for (reply,) in conn.execute(_LIVE_REPLIES_WITH_REFS):
        candidates.difference_update(digest.decode() for digest in _DIGEST_IN_BYTES.findall(reply))
        if not candidates:
            return candidates
    return candidates


def collect_unnamed_blobs(tx: Tx, written_before: int) -> int:
    """Delete every blob written before `written_before` that no row names
    (`unnamed_blobs`); return how many. Whatever left it behind (a refusal of an older
    release, a crash, an upload whose value never came), it is collected here.

    **Concurrent writers:** a blob is normally stored in the transaction that commits
    the row naming it, so this sweep (one transaction of the same single writer) never
    sees it unnamed. Two kinds are not: a runner's `content.write` parts, committed one
    by one before the `uploadRef` that names them, and a reply's or command's content
    reference, stored for the runner to read back and named by no row at all. They are
    protected by the grace period the caller subtracts from now, not by a transaction:
    `put_blob` refreshes `created_at` of a blob it finds older than `BLOB_REFRESH_MS`,
    so a blob an in-flight request or upload has just written, or written again, is at
    most that much older than its write.
    """
    found = unnamed_blobs(tx, written_before)
    for digest in found:
        tx.execute(_DELETE_BLOB, {"digest": digest})
    return len(found)


@dataclass(frozen=True, slots=True)
class CompactOutcome:
    """What one idle compaction did: the WAL truncated, `VACUUM` run (or why not)."""

    wal_truncated: bool
    vacuumed: bool
    reclaimable_bytes: int
    """Free pages times page size, before any `VACUUM`."""
    skipped: str | None = None
    """Why it did not compact: `busy` (work appeared, or a transaction is open), or the
    type of the error `VACUUM` failed with."""


def compact_state(
    db: Database, *, vacuum_min_bytes: int, vacuum_min_free_ratio: float
) -> CompactOutcome:
    """Truncate the WAL, then `VACUUM` if still idle and worth it; never in a transaction.

    Runs on the writer connection between group commits (the caller's unit wrote
    nothing, and no other unit of its group did, or `in_transaction` says so and it is
    skipped as `busy`). `VACUUM` runs only when no runner work is pending, at least
    `vacuum_min_bytes` are free and at least `vacuum_min_free_ratio` of the pages are.
    A failed `VACUUM` (a full disk, a reader holding a snapshot) is `skipped` with its
    error's type: SQLite rolled it back, the deletions before it stay committed and
    their free pages stay reusable by the next inserts.
    """
    conn = db.connection
    if conn.in_transaction or runner_work_pending(db, db.clock.now_ms()):
        return CompactOutcome(False, False, 0, skipped="busy")
    crash_point("server.retention.before_wal_truncate")
    truncated = db.reclaim_wal()
    page_size = int(db.fetch_value("PRAGMA page_size", {}))
    pages = int(db.fetch_value("PRAGMA page_count", {}))
    free = int(db.fetch_value("PRAGMA freelist_count", {}))
    reclaimable = free * page_size
    worth = reclaimable >= vacuum_min_bytes and pages > 0 and free / pages >= vacuum_min_free_ratio
    if not worth or conn.in_transaction or runner_work_pending(db, db.clock.now_ms()):
        return CompactOutcome(truncated, False, reclaimable)
    crash_point("server.retention.before_vacuum")
    try:
        # VACUUM's copy of the whole database goes to a temp file, never to memory (the
        # connection keeps statement journals and sorts in memory otherwise).
        conn.execute("PRAGMA temp_store = FILE")
        try:
            conn.execute("VACUUM")
        finally:
            conn.execute("PRAGMA temp_store = MEMORY")
    except sqlite3.Error as exc:  # a full disk, a reader in the way: nothing is lost
        return CompactOutcome(truncated, False, reclaimable, skipped=type(exc).__name__)
    crash_point("server.retention.after_vacuum")
    db.reclaim_wal()
    return CompactOutcome(truncated, True, reclaimable)
