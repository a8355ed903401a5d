"""Every SQL statement of the storage layer, as a named constant.

Implements the house rule "SQL is named, reviewable text" (style-examples.md § For our
project, 8): verb-first names, named parameters, explicit column lists, no f-strings.
A test compiles every constant here against a fresh schema. Internal module.
"""

from __future__ import annotations

from functools import cache

# ruff: noqa: E501  (SQL reads better unwrapped than split mid-clause)

__all__ = [
    "BEGIN_DEFERRED",
    "BEGIN_IMMEDIATE",
    "CHECK_CLAIMED_QUEUE_WITHOUT_LEASE",
    "CHECK_DECISION_RESOLUTIONS",
    "CHECK_DUPLICATE_PENDING_STEP_MESSAGES",
    "CHECK_EFFECT_APPLIED_TWICE",
    "CHECK_EFFECT_ATTEMPT_NUMBERING",
    "CHECK_EFFECT_INTERRUPTED_NOT_IDEMPOTENT",
    "CHECK_EFFECT_LAST_ATTEMPT",
    "CHECK_EFFECT_NODE_ATTEMPT_RUN",
    "CHECK_EFFECT_RECOVERY_UNRECORDED",
    "CHECK_EFFECT_STATE_MISMATCH",
    "CHECK_EVENT_REVISION_GAPS",
    "CHECK_FINISHED_AT",
    "CHECK_LEASE_GENERATION",
    "CHECK_MULTIPLE_UNFINISHED_ATTEMPTS",
    "CHECK_RESERVATIONS",
    "CHECK_RUNNING_ATTEMPT_WITHOUT_RUNNER",
    "CHECK_RUNS_WITHOUT_QUEUE",
    "CHECK_RUN_QUEUE_PAIRS",
    "CHECK_RUN_REVISION_MATCHES_EVENTS",
    "CHECK_TERMINAL_PAUSED",
    "CHECK_TERMINAL_PENDING_DECISIONS",
    "CHECK_TERMINAL_PENDING_REQUESTS",
    "CHECK_TERMINAL_PENDING_STEP_MESSAGES",
    "CHECK_TERMINAL_RUNS_WITH_LEASE",
    "CHECK_TERMINAL_UNFINISHED_ATTEMPTS",
    "CHECK_TERMINAL_UNSETTLED_EFFECTS",
    "CHECK_TWO_ACTIVE_RUNNERS",
    "COMMIT",
    "COUNT_ACTIVE_QUEUE_ROWS",
    "COUNT_ACTIVE_RUNNER_EPOCHS",
    "COUNT_AMBIGUOUS_EFFECTS",
    "COUNT_DUE_RESOURCES",
    "COUNT_EXPIRED_LEASES",
    "COUNT_FINISHED_VISITS",
    "COUNT_LIVE_RESOURCE_CLAIMS",
    "COUNT_PENDING_REQUESTS",
    "COUNT_QUEUE_BY_STATE",
    "COUNT_RUNNER_MESSAGES",
    "COUNT_RUNNER_OUTCOMES",
    "COUNT_RUNS_BY_STATUS",
    "COUNT_RUN_AMBIGUOUS_EFFECTS",
    "COUNT_SCHEMA_OBJECTS",
    "DELETE_LEASE",
    "DELETE_RESOURCE",
    "DELETE_RESOURCE_CLAIM",
    "DELETE_RESOURCE_QUEUE_ROW",
    "DELETE_RUNNER_MESSAGES",
    "DRIVERS_OF_DISPLAY",
    "INSERT_BLOB",
    "INSERT_CHECKPOINT_DECISION",
    "INSERT_COMMAND",
    "INSERT_DECISION_ANSWER_ACCEPTED",
    "INSERT_DECISION_MESSAGE_AGAIN",
    "INSERT_DECISION_RESOLUTION_ACCEPTED",
    "INSERT_EFFECT",
    "INSERT_EFFECT_ATTEMPT",
    "INSERT_EVENT",
    "INSERT_NODE_ATTEMPT",
    "INSERT_PENDING_DECISION_CANCELLATIONS",
    "INSERT_QUEUE_ROW",
    "INSERT_RECONCILE_HISTORY",
    "INSERT_RESOURCE",
    "INSERT_RESOURCE_CHILD_RUN",
    "INSERT_RESOURCE_CLAIM",
    "INSERT_RESOURCE_EFFECT",
    "INSERT_RESOURCE_EVENT",
    "INSERT_RUN",
    "INSERT_RUNNER_EPOCH",
    "INSERT_RUNNER_MESSAGE",
    "INSERT_RUN_BINDING",
    "INSERT_SCHEMA_INFO",
    "INSERT_VIEW_CONTENT",
    "PRAGMA_FOREIGN_KEYS_ON",
    "PRAGMA_FOREIGN_KEY_CHECK",
    "PRAGMA_INTEGRITY_CHECK",
    "PRAGMA_JOURNAL_MODE_WAL",
    "PRAGMA_QUERY_ONLY",
    "PRAGMA_SYNCHRONOUS_FULL",
    "RELEASE_PART",
    "RELEASE_UNIT",
    "RENEW_RESOURCE_CLAIM",
    "ROLLBACK",
    "ROLLBACK_TO_PART",
    "ROLLBACK_TO_UNIT",
    "SAVEPOINT_PART",
    "SAVEPOINT_UNIT",
    "SELECT_ACTIVE_RUNNER_EPOCH",
    "SELECT_ACTIVE_RUNNER_EPOCHS",
    "SELECT_ADMISSIBLE_RUNS",
    "SELECT_BLOB_CONTENTS",
    "SELECT_BLOB_LOCATION",
    "SELECT_COMMAND_BY_KEY",
    "SELECT_COMMAND_BY_REQUEST",
    "SELECT_CONTINUATION_DECISION",
    "SELECT_DECISIONS_TO_PRESENT_AGAIN",
    "SELECT_EFFECT_BY_KEY",
    "SELECT_EVENTS",
    "SELECT_EXPIRED_CLAIMED_RUNS",
    "SELECT_EXPIRED_RESOURCE_CLAIMS",
    "SELECT_INTERACTIVE_ORIGIN_SESSION",
    "SELECT_INTERRUPTED_REQUEST_TURNS",
    "SELECT_LATEST_TERMINAL_RUN",
    "SELECT_LEASE",
    "SELECT_MESSAGE_TURN_ENDED",
    "SELECT_NEXT_DUE_RESOURCE",
    "SELECT_NEXT_ELIGIBLE_MESSAGE",
    "SELECT_NEXT_RESOURCE_DUE_AT",
    "SELECT_NEXT_SESSION_ORDER",
    "SELECT_NODE_ATTEMPT",
    "SELECT_OPEN_RUN_TURN",
    "SELECT_PENDING_DECISION",
    "SELECT_PENDING_STEP_MESSAGE",
    "SELECT_PROTECTED_DECISION",
    "SELECT_QUEUE_ROW",
    "SELECT_RECONCILE_HISTORY",
    "SELECT_RESOURCE_BY_KEY",
    "SELECT_RESOURCE_BY_UID",
    "SELECT_RESOURCE_CHILD_RUN",
    "SELECT_RESOURCE_CHILD_RUNS",
    "SELECT_RESOURCE_CLAIM",
    "SELECT_RESOURCE_CLAIM_GENERATION",
    "SELECT_RESOURCE_EFFECTS",
    "SELECT_RESOURCE_EFFECT_BY_KEY",
    "SELECT_RESOURCE_EVENTS",
    "SELECT_RESOURCE_QUEUE_ROW",
    "SELECT_RESOURCE_SUMMARIES",
    "SELECT_RESUME_ATTEMPTS",
    "SELECT_RUN",
    "SELECT_RUNNER_EPOCH",
    "SELECT_RUNNER_MESSAGE",
    "SELECT_RUNNER_PROGRESS",
    "SELECT_RUN_AMBIGUOUS_EFFECTS",
    "SELECT_RUN_ATTEMPTS",
    "SELECT_RUN_EFFECTS",
    "SELECT_RUN_HEAD",
    "SELECT_RUN_LIST_REVISION",
    "SELECT_RUN_PARENT_RESOURCE",
    "SELECT_RUN_PAUSED",
    "SELECT_RUN_PENDING_MESSAGES",
    "SELECT_RUN_PROTECTED_DECISION",
    "SELECT_RUN_RESUME_HEAD",
    "SELECT_RUN_ROOT",
    "SELECT_RUN_SUMMARIES",
    "SELECT_RUN_SUMMARY",
    "SELECT_RUN_VIEW_REVISION",
    "SELECT_RUN_WAITS_AT_AGENT_STEP",
    "SELECT_SCHEDULED_RECONCILES",
    "SELECT_SCHEMA_INFO",
    "SELECT_SCHEMA_INFO_TABLE",
    "SELECT_SERVER_HAS_WORK",
    "SELECT_SERVER_LEASE",
    "SELECT_SERVER_LEASE_HEAD",
    "SELECT_SESSION_BASE_REVISION",
    "SELECT_SESSION_RESERVATION",
    "SELECT_STATE_COUNTS",
    "SELECT_STATUS_COUNTS",
    "SELECT_SUBMISSION_RUN_STATUS",
    "SELECT_SUBMISSION_VALIDATING",
    "SELECT_TABLE_NAMES",
    "SELECT_TERMINAL_CLEARED",
    "SELECT_TERMINAL_RETAINED",
    "SELECT_UNFINISHED_ATTEMPT",
    "SELECT_UNFINISHED_RUN_PAUSED",
    "SELECT_UNPRODUCTIVE_TURN_ENDS",
    "SELECT_VIEW_CONTENTS",
    "SELECT_VIEW_CONTENT_LOCATION",
    "TRIM_RECONCILE_HISTORY",
    "UPDATE_APPLYING_EFFECTS_AMBIGUOUS",
    "UPDATE_APPLYING_EFFECT_ATTEMPTS_AMBIGUOUS",
    "UPDATE_ATTEMPT_FINISH",
    "UPDATE_ATTEMPT_WAITING",
    "UPDATE_BINDING_HEADLESS",
    "UPDATE_BINDING_ORIGIN_SESSION",
    "UPDATE_BINDING_RELEASE",
    "UPDATE_BINDING_TERMINAL_CLEARED",
    "UPDATE_CANCELLED_REQUEST_MESSAGES_CANCEL",
    "UPDATE_CHAIN_FOLLOW_UPS_TARGET",
    "UPDATE_DECISION_ACCEPTED",
    "UPDATE_EFFECT_ATTEMPT_CLOSE",
    "UPDATE_EFFECT_ATTEMPT_CONFIRM",
    "UPDATE_EFFECT_ATTEMPT_RETRY",
    "UPDATE_EFFECT_CONFIRM",
    "UPDATE_EFFECT_REOPEN",
    "UPDATE_EFFECT_SETTLE",
    "UPDATE_EFFECT_START",
    "UPDATE_EFFECT_TOUCH",
    "UPDATE_LEASE_CHECK_RENEW",
    "UPDATE_LEASE_RENEW",
    "UPDATE_MESSAGE_TARGET",
    "UPDATE_OWNER_LEASES_RENEW",
    "UPDATE_PENDING_DECISIONS_CANCEL",
    "UPDATE_PENDING_EFFECTS_CANCEL",
    "UPDATE_PENDING_MESSAGES_CANCEL",
    "UPDATE_PENDING_REQUESTS_CANCEL",
    "UPDATE_QUEUE_REQUEUE",
    "UPDATE_QUEUE_STATE",
    "UPDATE_REQUEST_CANCEL",
    "UPDATE_REQUEST_TIME_OUT",
    "UPDATE_REQUEST_TURNS_CARRIED",
    "UPDATE_REQUEST_UNPRODUCTIVE_TURNS",
    "UPDATE_RESOURCE_CLAIM_GENERATION",
    "UPDATE_RESOURCE_DELETION",
    "UPDATE_RESOURCE_SPEC",
    "UPDATE_RESOURCE_STATUS",
    "UPDATE_RUNNER_EPOCH_FINISH",
    "UPDATE_RUNNER_EPOCH_READY",
    "UPDATE_RUNNING_ATTEMPTS_INTERRUPTED",
    "UPDATE_RUN_GENERATION",
    "UPDATE_RUN_OPEN_TURNS_LOST",
    "UPDATE_RUN_REQUESTS_TARGET",
    "UPDATE_RUN_REQUESTS_UNTARGETED",
    "UPDATE_RUN_REVISION",
    "UPDATE_RUN_STATUS",
    "UPDATE_RUN_STEP_DECISION_MESSAGES_CANCEL",
    "UPDATE_RUN_TERMINAL",
    "UPDATE_SERVER_LEASE_RELEASE",
    "UPDATE_SERVER_LEASE_RENEW",
    "UPDATE_STEP_MESSAGES_CANCEL",
    "UPDATE_UNFINISHED_ATTEMPTS_CLOSE",
    "UPSERT_LEASE",
    "UPSERT_RESOURCE_QUEUE",
    "UPSERT_RESOURCE_QUEUE_AFTER_RECONCILE",
    "UPSERT_SERVER_LEASE",
]

# --- Transaction control and connection pragmas -------------------------------------

# Start a write transaction that takes the write lock at once (no upgrade deadlocks).
BEGIN_IMMEDIATE = "BEGIN IMMEDIATE"
# Make a write transaction durable.
COMMIT = "COMMIT"
# Undo a write transaction.
ROLLBACK = "ROLLBACK"
# Start a read transaction: its first read fixes one snapshot for every read after it.
BEGIN_DEFERRED = "BEGIN DEFERRED"
# One unit of a group commit: its writes, inside the group's one transaction.
SAVEPOINT_UNIT = "SAVEPOINT unit"
# Keep a unit's writes in the group's transaction (they commit with the group).
RELEASE_UNIT = "RELEASE unit"
# Undo only a unit's writes; the group's transaction and its other units stay.
ROLLBACK_TO_UNIT = "ROLLBACK TO unit"
# A part of a transaction that a refusal undoes alone (`Tx.undoable`).
SAVEPOINT_PART = "SAVEPOINT part"
RELEASE_PART = "RELEASE part"
ROLLBACK_TO_PART = "ROLLBACK TO part"
# Enforce foreign keys on this connection (off by default in SQLite).
PRAGMA_FOREIGN_KEYS_ON = "PRAGMA foreign_keys = ON"
# Write-ahead logging: readers never block the writer.
PRAGMA_JOURNAL_MODE_WAL = "PRAGMA journal_mode = WAL"
# Sync the WAL on every commit, so a returned COMMIT survives power loss.
PRAGMA_SYNCHRONOUS_FULL = "PRAGMA synchronous = FULL"
# Statement journals and sorter spills stay in memory: no temp file on a hot path.
PRAGMA_TEMP_STORE_MEMORY = "PRAGMA temp_store = MEMORY"
# Refuse every write on this connection (read-only opens and schema inspection).
PRAGMA_QUERY_ONLY = "PRAGMA query_only = ON"
# SQLite's structural self-check; one row 'ok' when healthy.
PRAGMA_INTEGRITY_CHECK = "PRAGMA integrity_check"
# Rows whose foreign keys point at nothing.
PRAGMA_FOREIGN_KEY_CHECK = "PRAGMA foreign_key_check"

# --- Schema record ------------------------------------------------------------------

# How many objects the schema holds (0 means a fresh, empty database).
COUNT_SCHEMA_OBJECTS = "SELECT count(*) FROM sqlite_schema"
# Whether the schema record table exists.
SELECT_SCHEMA_INFO_TABLE = (
    "SELECT name FROM sqlite_schema WHERE type = 'table' AND name = 'schema_info'"
)
# The schema record.
SELECT_SCHEMA_INFO = (
    "SELECT schema_name, schema_version, ddl_digest FROM schema_info WHERE singleton = 1"
)
# Write the schema record of a new database.
INSERT_SCHEMA_INFO = """
INSERT INTO schema_info (singleton, schema_name, schema_version, ddl_digest, created_at)
VALUES (1, :schema_name, :schema_version, :ddl_digest, :created_at)
"""
# Every table name, for the verifier's presence check.
SELECT_TABLE_NAMES = "SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name"

# --- Runs ---------------------------------------------------------------------------

# Create a run (revision 1 is its enqueue event).
INSERT_RUN = """
INSERT INTO runs (
    run_id, workflow_name, title, project_path, source_identity, definition_digest,
    input_hash, input, status, paused, revision, generation, root_run_id, parent_run_id,
    restart_of, continuation_of, created_at, updated_at
) VALUES (
    :run_id, :workflow_name, :title, :project_path, :source_identity, :definition_digest,
    :input_hash, :input, 'queued', 0, 1, 0, :root_run_id, :parent_run_id,
    :restart_of, :continuation_of, :now, :now
)
"""
# The lineage root of a run, to place a restart or continuation in its tree.
SELECT_RUN_ROOT = "SELECT root_run_id FROM runs WHERE run_id = :run_id"
# One complete run row.
SELECT_RUN = """
SELECT run_id, workflow_name, title, project_path, source_identity, definition_digest,
       input_hash, input, status, paused, revision, generation, root_run_id, parent_run_id,
       restart_of, continuation_of, created_at, updated_at, finished_at, failure_class,
       failure_reason
FROM runs WHERE run_id = :run_id
"""
# The status facts of a run-list row: status and source facts only (never input, steps
# or trace). The revision is the presentation revision (that of the run's view); the
# ambiguous-effect and active-runner facts are indexed EXISTS checks (effects_by_run,
# runner_epochs_one_active), not loads.
_ambiguous_effect = (
    "EXISTS (SELECT 1 FROM effects AS e WHERE e.run_id = r.run_id AND e.state = 'ambiguous')"
)
_runner_active = (
    "EXISTS (SELECT 1 FROM runner_epochs AS x"
    " WHERE x.run_id = r.run_id AND x.status IN ('starting', 'ready'))"
)
_turn_open = (
    "EXISTS (SELECT 1 FROM workflow_turns AS t WHERE t.run_id = r.run_id AND t.status = 'open')"
)
# The run's checkpoint continuation (runs_by_continuation): committed with the parent's
# completion, so the list never shows a continued run without it.
_continued_by = (
    "(SELECT c.run_id FROM runs AS c WHERE c.continuation_of = r.run_id"
    " ORDER BY c.created_at DESC, c.run_id DESC LIMIT 1)"
)
# The node a run stopped or runs at: its unfinished attempt (node_attempts_one_unfinished),
# else its pending checkpoint's node (human_decisions_by_run); one indexed row each.
_current_node = (
    "(SELECT a.node_path FROM node_attempts AS a"
    " WHERE a.run_id = r.run_id AND a.status IN ('running', 'waiting'))"
)
_decision_node = (
    "(SELECT d.node_path FROM human_decisions AS d"
    " WHERE d.run_id = r.run_id AND d.status = 'pending')"
)
_summary_columns = f"""
SELECT r.run_id, r.workflow_name, r.title, r.status, r.paused,
       r.revision + r.view_changes AS revision, q.state AS queue_state, q.park_reason,
       r.created_at, r.updated_at, r.finished_at, r.failure_class, b.execution_mode,
       {_ambiguous_effect} AS ambiguous_effect, {_runner_active} AS runner_active,
       {_turn_open} AS turn_open, r.continuation_of, {_continued_by} AS continued_by,
       {_current_node} AS current_node, {_decision_node} AS decision_node
FROM runs AS r LEFT JOIN run_queue AS q ON q.run_id = r.run_id
LEFT JOIN run_bindings AS b ON b.run_id = r.run_id"""
# The run list, newest first, keyset-paged by (created_at, run_id).
SELECT_RUN_SUMMARIES = f"""{_summary_columns}
WHERE (r.created_at, r.run_id) < (:before_created_at, :before_run_id)
ORDER BY r.created_at DESC, r.run_id DESC
LIMIT :limit
"""


def display_status_sql(
    status: str, paused: str, queue_state: str, ambiguous: str, runner: str, *, turn: str = "0"
) -> str:
    """The display status of a run in SQL over the given column expressions: the rule of
    domain/_display_status.py `display_status`, for the run list's status filter
    (tests/server/test_display_status.py checks they agree in every case)."""
    return f"""CASE
    WHEN {status} IN ('completed', 'failed', 'timed_out', 'cancelled') THEN {status}
    WHEN {ambiguous} THEN 'ambiguous'
    WHEN {paused} = 1 THEN 'paused'
    WHEN {turn} THEN 'running'
    WHEN {status} = 'waiting' THEN 'waiting'
    WHEN {queue_state} IN ('starting', 'running') OR {runner} THEN 'running'
    ELSE 'queued' END"""


_display_status_case = display_status_sql(
    "r.status", "r.paused", "q.state", _ambiguous_effect, _runner_active, turn=_turn_open
)

# The index-driven conditions ("drivers") that find the runs of each display status, so
# a status filter reads about one page even when few of many runs match: a stored
# status, the pause flag, the ambiguous effects, or the active queue rows and runners.
_STATUS_DRIVERS: dict[str, str] = {
    "completed": "r.status = 'completed'",
    "failed": "r.status = 'failed'",
    "timed_out": "r.status = 'timed_out'",
    "cancelled": "r.status = 'cancelled'",
    "waiting": "r.status = 'waiting'",
    "queued": "r.status = 'queued'",
    "running": "r.status = 'running'",
    "paused": "r.paused = 1",
    "ambiguous": "r.run_id IN (SELECT run_id FROM effects WHERE state = 'ambiguous')",
    "active": (
        "r.run_id IN (SELECT run_id FROM run_queue WHERE state IN ('starting', 'running')"
        " UNION SELECT run_id FROM runner_epochs WHERE status IN ('starting', 'ready'))"
    ),
    "turn": "r.run_id IN (SELECT run_id FROM workflow_turns WHERE status = 'open')",
}
# Which drivers find every run of a display status (the rule of `display_status_sql`).
DRIVERS_OF_DISPLAY: dict[str, tuple[str, ...]] = {
    "completed": ("completed",),
    "failed": ("failed",),
    "timed_out": ("timed_out",),
    "cancelled": ("cancelled",),
    "ambiguous": ("ambiguous",),
    "paused": ("paused",),
    "waiting": ("waiting",),
    "running": ("active", "turn"),
    "queued": ("queued", "running"),
}


@cache
def filtered_run_summaries_sql(
    *, workflow: bool, project: bool, since: bool, until: bool, drivers: tuple[str, ...] = ()
) -> str:
    """One filtered run-list page, newest first, keyset-paged by (created_at, run_id).

    Only the filters that are on appear, so each drives its index (an `:x IS NULL OR`
    test would hide every index from the planner). With a status filter (`drivers`, from
    `DRIVERS_OF_DISPLAY`) the page is a merge of one index-driven arm per driver, each
    reading at most `:limit` rows, and `:statuses` (a JSON array of display statuses)
    keeps only the rows whose display status was asked for.
    """
    conditions = ["(r.created_at, r.run_id) < (:before_created_at, :before_run_id)"]
    if workflow:
        conditions.append("r.workflow_name = :workflow")
    if project:
        conditions.append("r.project_path = :project")
    if since:
        conditions.append("r.created_at >= :since")
    if until:
        conditions.append("r.created_at < :until")
    order = "ORDER BY r.created_at DESC, r.run_id DESC LIMIT :limit"
    if not drivers:
        return f"{_summary_columns}\nWHERE {' AND '.join(conditions)}\n{order}\n"
    conditions.append(f"{_display_status_case} IN (SELECT value FROM json_each(:statuses))")
    arms = [
        f"SELECT * FROM ({_summary_columns}\nWHERE {_STATUS_DRIVERS[driver]} AND "
        f"{' AND '.join(conditions)}\n{order})"
        for driver in drivers
    ]
    if len(arms) == 1:
        return arms[0] + "\n"
    # UNION, not UNION ALL: a run two drivers find (paused and queued) shows once.
    return "\nUNION\n".join(arms) + "\nORDER BY created_at DESC, run_id DESC LIMIT :limit\n"


# The run list's revision: a one-row counter that triggers on `runs` keep (schema.sql).
SELECT_RUN_LIST_REVISION = "SELECT revision FROM run_list_revision WHERE singleton = 1"
# The presentation revision of a run's view: its event revision plus the view changes
# that append no event (kept by triggers, schema.sql); both only grow.
SELECT_RUN_VIEW_REVISION = "SELECT revision + view_changes FROM runs WHERE run_id = :run_id"
# The status facts of one run.
SELECT_RUN_SUMMARY = f"""{_summary_columns}
WHERE r.run_id = :run_id
"""
# Run counts per status, for server status.
COUNT_RUNS_BY_STATUS = "SELECT status AS key, count(*) AS n FROM runs GROUP BY status"
# Everything a transition or protected write checks, in one read.
SELECT_RUN_HEAD = """
SELECT r.run_id, r.status, r.paused, r.revision, r.generation, q.state AS queue_state,
       l.owner_type AS lease_owner_type, l.owner_id AS lease_owner_id,
       l.token_hash AS lease_token_hash, l.generation AS lease_generation,
       l.expires_at AS lease_expires_at
FROM runs AS r
LEFT JOIN run_queue AS q ON q.run_id = r.run_id
LEFT JOIN leases AS l ON l.resource = r.run_id
WHERE r.run_id = :run_id
"""
# Bump the revision of a run whose lifecycle state does not change.
UPDATE_RUN_REVISION = (
    "UPDATE runs SET revision = :revision, updated_at = :now WHERE run_id = :run_id"
)
# Move a run to a nonterminal status (pause flag and revision with it).
UPDATE_RUN_STATUS = """
UPDATE runs SET status = :status, paused = :paused, revision = :revision, updated_at = :now
WHERE run_id = :run_id
"""
# Move a run to a terminal status; a terminal run is never paused.
UPDATE_RUN_TERMINAL = """
UPDATE runs
SET status = :status, paused = 0, revision = :revision, updated_at = :now, finished_at = :now,
    failure_class = :failure_class, failure_reason = :failure_reason
WHERE run_id = :run_id
"""
# Record a newly issued claim generation.
UPDATE_RUN_GENERATION = "UPDATE runs SET generation = :generation WHERE run_id = :run_id"
# Whether a run is paused (a missing run reads as not paused).
SELECT_RUN_PAUSED = "SELECT paused FROM runs WHERE run_id = :run_id"
# Whether an unfinished run is paused (no row once it finished).
SELECT_UNFINISHED_RUN_PAUSED = """
SELECT paused FROM runs WHERE run_id = :run_id AND finished_at IS NULL
"""

# --- Run queue ----------------------------------------------------------------------

# Create the queue row of a new run.
INSERT_QUEUE_ROW = """
INSERT INTO run_queue (run_id, state, kind, priority, enqueued_at, park_reason, updated_at)
VALUES (:run_id, 'queued', :kind, :priority, :now, NULL, :now)
"""
# One queue row.
SELECT_QUEUE_ROW = """
SELECT run_id, state, kind, priority, enqueued_at, park_reason, updated_at
FROM run_queue WHERE run_id = :run_id
"""
# Change the queue state (and park reason) of a run.
UPDATE_QUEUE_STATE = """
UPDATE run_queue SET state = :state, park_reason = :park_reason, updated_at = :now
WHERE run_id = :run_id
"""
# Put a run back in line for admission.
UPDATE_QUEUE_REQUEUE = """
UPDATE run_queue SET state = 'queued', park_reason = NULL, enqueued_at = :now, updated_at = :now
WHERE run_id = :run_id
"""
# The next admissible runs of one kind: queued and not paused, best first.
SELECT_ADMISSIBLE_RUNS = """
SELECT q.run_id, q.state, q.kind, q.priority, q.enqueued_at, q.park_reason, q.updated_at
FROM run_queue AS q JOIN runs AS r ON r.run_id = q.run_id
WHERE q.state = 'queued' AND q.kind = :kind AND r.paused = 0
ORDER BY q.priority DESC, q.enqueued_at, q.run_id
LIMIT :limit
"""
# Runs holding or taking a runner (capacity includes pending launches).
COUNT_ACTIVE_QUEUE_ROWS = "SELECT count(*) FROM run_queue WHERE state IN ('starting', 'running')"
# Whether durable work keeps the server alive: admissible or executing runs, claims,
# active runners, scheduled wakes (deadlines), unsettled effects, provisional
# submissions, and decisions that time out or wait on an external channel.
SELECT_SERVER_HAS_WORK = """
SELECT EXISTS (SELECT 1 FROM run_queue AS q JOIN runs AS r ON r.run_id = q.run_id
               WHERE q.state IN ('starting', 'running') OR (q.state = 'queued' AND r.paused = 0))
    OR EXISTS (SELECT 1 FROM leases)
    OR EXISTS (SELECT 1 FROM runner_epochs WHERE status IN ('starting', 'ready'))
    OR EXISTS (SELECT 1 FROM node_attempts WHERE status = 'waiting' AND deadline_at IS NOT NULL)
    OR EXISTS (SELECT 1 FROM effects WHERE state IN ('pending', 'applying'))
    OR EXISTS (SELECT 1 FROM interactive_submissions WHERE outcome = 'validating')
    OR EXISTS (SELECT 1 FROM human_decisions AS d
               WHERE d.status = 'pending' AND (d.expires_at IS NOT NULL OR EXISTS (
                   SELECT 1 FROM channel_messages AS c WHERE c.decision_id = d.decision_id)))
    OR EXISTS (SELECT 1 FROM resource_queue)
    OR EXISTS (SELECT 1 FROM resource_claims)
"""
# Queue counts per state, for server status.
COUNT_QUEUE_BY_STATE = "SELECT state AS key, count(*) AS n FROM run_queue GROUP BY state"

# --- Leases (run claims) ------------------------------------------------------------

# Grant a claim, replacing an expired one (the caller checked it is not live).
UPSERT_LEASE = """
INSERT INTO leases (
    resource, owner_type, owner_id, token_hash, generation, acquired_at, heartbeat_at, expires_at
) VALUES (
    :run_id, :owner_type, :owner_id, :token_hash, :generation, :now, :now, :expires_at
)
ON CONFLICT (resource) DO UPDATE SET
    owner_type = excluded.owner_type, owner_id = excluded.owner_id,
    token_hash = excluded.token_hash, generation = excluded.generation,
    acquired_at = excluded.acquired_at, heartbeat_at = excluded.heartbeat_at,
    expires_at = excluded.expires_at
"""
# The protected write's fast path: check the exact live claim (and the expected revision,
# when given) and renew it, in one statement; returns the run's revision, or no row.
UPDATE_LEASE_CHECK_RENEW = """
UPDATE leases SET heartbeat_at = :now, expires_at = :expires_at
WHERE resource = :run_id AND generation = :generation AND owner_type = :owner_type
  AND owner_id = :owner_id AND token_hash = :token_hash AND expires_at > :now
  AND (:expected_revision IS NULL
       OR :expected_revision = (SELECT revision FROM runs WHERE run_id = :run_id))
RETURNING (SELECT revision FROM runs WHERE run_id = :run_id) AS revision
"""
# Renew the exact claim the caller just verified.
UPDATE_LEASE_RENEW = """
UPDATE leases SET heartbeat_at = :now, expires_at = :expires_at
WHERE resource = :run_id AND generation = :generation
"""
# Renew every live claim of one owner (the claim-renewer timer).
UPDATE_OWNER_LEASES_RENEW = """
UPDATE leases SET heartbeat_at = :now, expires_at = :expires_at
WHERE owner_type = :owner_type AND owner_id = :owner_id AND expires_at > :now
RETURNING resource, generation, expires_at
"""
# Drop the claim on a run.
DELETE_LEASE = "DELETE FROM leases WHERE resource = :run_id"
# One claim, without its token hash.
SELECT_LEASE = """
SELECT resource, owner_type, owner_id, generation, acquired_at, heartbeat_at, expires_at
FROM leases WHERE resource = :run_id
"""
# Runs whose runner-holding state has an expired or missing claim (recovery input).
SELECT_EXPIRED_CLAIMED_RUNS = """
SELECT q.run_id, q.state, q.kind, q.priority, q.enqueued_at, q.park_reason, q.updated_at
FROM run_queue AS q LEFT JOIN leases AS l ON l.resource = q.run_id
WHERE q.state IN ('starting', 'running') AND (l.resource IS NULL OR l.expires_at <= :now)
ORDER BY q.run_id
"""
# Pending interactive requests, for server status.
COUNT_PENDING_REQUESTS = "SELECT count(*) FROM interactive_requests WHERE status = 'pending'"
# Ambiguous effects awaiting operator recovery, for server status.
COUNT_AMBIGUOUS_EFFECTS = "SELECT count(*) FROM effects WHERE state = 'ambiguous'"
# How many claims have expired without release, for server status.
COUNT_EXPIRED_LEASES = "SELECT count(*) FROM leases WHERE expires_at <= :now"
# Runner epochs launched and not yet exited (startup recovery closes a dead server's).
COUNT_ACTIVE_RUNNER_EPOCHS = (
    "SELECT count(*) FROM runner_epochs WHERE status IN ('starting', 'ready')"
)
# Every count of `server status` in one statement (one step through SQLite, one snapshot).
# `state status`: one statement, so the counts are one snapshot. Pending and unsettled
# rows are the ones an operator acts on; `leases` counts live and expired claims alike.
SELECT_STATE_COUNTS = """
SELECT 'runs' AS kind, count(*) AS n FROM runs
UNION ALL SELECT 'nonterminalRuns', count(*) FROM runs WHERE finished_at IS NULL
UNION ALL SELECT 'pendingDecisions', count(*) FROM human_decisions WHERE status = 'pending'
UNION ALL SELECT 'pendingInteractions', count(*) FROM interactive_requests
    WHERE status = 'pending'
UNION ALL SELECT 'pendingFollowUps', count(*) FROM follow_ups WHERE state = 'pending'
UNION ALL SELECT 'pendingWorkflowMessages', count(*) FROM workflow_messages
    WHERE state = 'pending'
UNION ALL SELECT 'activeLeases', count(*) FROM leases WHERE expires_at > :now
UNION ALL SELECT 'unsettledEffects', count(*) FROM effects
    WHERE state IN ('pending', 'applying', 'ambiguous')
UNION ALL SELECT 'ambiguousEffects', count(*) FROM effects WHERE state = 'ambiguous'
UNION ALL SELECT 'blobs', count(*) FROM blobs
UNION ALL SELECT 'viewContents', count(*) FROM run_view_content
"""
SELECT_STATUS_COUNTS = """
SELECT 'runs' AS kind, status AS key, count(*) AS n FROM runs GROUP BY status
UNION ALL SELECT 'queue', state, count(*) FROM run_queue GROUP BY state
UNION ALL SELECT 'expired', '', count(*) FROM leases WHERE expires_at <= :now
UNION ALL SELECT 'pending', '', count(*) FROM interactive_requests WHERE status = 'pending'
UNION ALL SELECT 'ambiguous', '', count(*) FROM effects WHERE state = 'ambiguous'
UNION ALL SELECT 'runners', '', count(*) FROM runner_epochs WHERE status IN ('starting', 'ready')
"""

# --- Server lease and epoch ---------------------------------------------------------

# The server lease, with its token hash, for the holder's checks.
SELECT_SERVER_LEASE_HEAD = """
SELECT epoch, owner_id, token_hash, expires_at, released_at FROM server_lease WHERE singleton = 1
"""
# The server lease without its token hash.
SELECT_SERVER_LEASE = """
SELECT epoch, owner_id, pid, acquired_at, heartbeat_at, expires_at, released_at
FROM server_lease WHERE singleton = 1
"""
# Take the server lease with the next epoch.
UPSERT_SERVER_LEASE = """
INSERT INTO server_lease (
    singleton, epoch, owner_id, token_hash, pid, acquired_at, heartbeat_at, expires_at, released_at
) VALUES (1, :epoch, :owner_id, :token_hash, :pid, :now, :now, :expires_at, NULL)
ON CONFLICT (singleton) DO UPDATE SET
    epoch = excluded.epoch, owner_id = excluded.owner_id, token_hash = excluded.token_hash,
    pid = excluded.pid, acquired_at = excluded.acquired_at, heartbeat_at = excluded.heartbeat_at,
    expires_at = excluded.expires_at, released_at = NULL
"""
# Renew the server lease of the verified holder.
UPDATE_SERVER_LEASE_RENEW = """
UPDATE server_lease SET heartbeat_at = :now, expires_at = :expires_at
WHERE singleton = 1 AND epoch = :epoch
"""
# Release the server lease of the verified holder (the epoch stays).
UPDATE_SERVER_LEASE_RELEASE = """
UPDATE server_lease SET released_at = :now, expires_at = :now
WHERE singleton = 1 AND epoch = :epoch
"""

# --- Events -------------------------------------------------------------------------

# Append the immutable event of one revision.
INSERT_EVENT = """
INSERT INTO events (run_id, revision, event_type, generation, payload, recorded_at)
VALUES (:run_id, :revision, :event_type, :generation, :payload, :now)
"""
# A page of a run's events in revision order.
SELECT_EVENTS = """
SELECT run_id, revision, event_type, generation, payload, recorded_at
FROM events WHERE run_id = :run_id AND revision > :after_revision
ORDER BY revision LIMIT :limit
"""

# --- Node attempts ------------------------------------------------------------------

# Start a node attempt.
INSERT_NODE_ATTEMPT = """
INSERT INTO node_attempts (
    attempt_id, run_id, node_path, node_type, visit, generation, status, started_at, deadline_at
) VALUES (
    :attempt_id, :run_id, :node_path, :node_type, :visit, :generation, 'running', :now, :deadline_at
)
"""
# One attempt.
SELECT_NODE_ATTEMPT = """
SELECT attempt_id, run_id, node_path, node_type, visit, generation, status, started_at,
       deadline_at, finished_at, output_hash, error, next_node_path
FROM node_attempts WHERE attempt_id = :attempt_id
"""
# The unfinished attempt of a run (at most one): the current node.
SELECT_UNFINISHED_ATTEMPT = """
SELECT attempt_id, run_id, node_path, node_type, visit, generation, status, started_at,
       deadline_at, finished_at, output_hash, error, next_node_path
FROM node_attempts WHERE run_id = :run_id AND status IN ('running', 'waiting')
"""
# Every attempt of a run in start order: insertion order, since one node runs at a time
# (several starts committed together share one clock reading).
SELECT_RUN_ATTEMPTS = """
SELECT attempt_id, run_id, node_path, node_type, visit, generation, status, started_at,
       deadline_at, finished_at, output_hash, error, next_node_path
FROM node_attempts WHERE run_id = :run_id ORDER BY rowid
"""
# Finished visits of one node: the next visit number is this plus one.
COUNT_FINISHED_VISITS = """
SELECT count(*) FROM node_attempts
WHERE run_id = :run_id AND node_path = :node_path AND status IN ('completed', 'failed', 'timed_out')
"""
# Finish one unfinished attempt.
UPDATE_ATTEMPT_FINISH = """
UPDATE node_attempts
SET status = :status, finished_at = :now, output_hash = :output_hash, error = :error,
    next_node_path = :next_node_path
WHERE attempt_id = :attempt_id AND status IN ('running', 'waiting')
"""
# What a runner resumes from: every attempt of a run in execution order (one node runs
# at a time, so insertion order is execution order, even if the wall clock stepped back).
SELECT_RESUME_ATTEMPTS = """
SELECT attempt_id, node_path, node_type, visit, status, output_hash, next_node_path,
       CASE WHEN status = 'completed' THEN NULL ELSE error END AS error
FROM node_attempts WHERE run_id = :run_id ORDER BY rowid
"""
# The run facts a resuming runner needs: its input and the revision it continues from.
SELECT_RUN_RESUME_HEAD = "SELECT input, revision FROM runs WHERE run_id = :run_id"
# Mark the running attempt of a run as waiting for input.
UPDATE_ATTEMPT_WAITING = """
UPDATE node_attempts SET status = 'waiting' WHERE attempt_id = :attempt_id AND status = 'running'
"""
# Stop the running attempt of a run whose runner stopped (it may run again).
UPDATE_RUNNING_ATTEMPTS_INTERRUPTED = """
UPDATE node_attempts SET status = 'interrupted', finished_at = :now
WHERE run_id = :run_id AND status = 'running'
"""
# Close every unfinished attempt of a run that became terminal.
UPDATE_UNFINISHED_ATTEMPTS_CLOSE = """
UPDATE node_attempts SET status = :status, finished_at = :now
WHERE run_id = :run_id AND status IN ('running', 'waiting')
"""

# --- Terminal cleanup of a run's pending work ---------------------------------------

# Cancel the pending interactive requests of a terminal run.
UPDATE_PENDING_REQUESTS_CANCEL = """
UPDATE interactive_requests SET status = 'cancelled', settled_at = :now, updated_at = :now
WHERE run_id = :run_id AND status = 'pending'
"""
# Fence the pending decisions of a terminal run with a cancelled resolution.
INSERT_PENDING_DECISION_CANCELLATIONS = """
INSERT INTO human_decision_resolutions (decision_id, outcome, cancel_reason, resolved_at)
SELECT decision_id, 'cancelled', :reason, :now FROM human_decisions
WHERE run_id = :run_id AND status = 'pending'
ON CONFLICT (decision_id) DO NOTHING
"""
# Mark the pending decisions of a terminal run cancelled.
UPDATE_PENDING_DECISIONS_CANCEL = """
UPDATE human_decisions SET status = 'cancelled', updated_at = :now
WHERE run_id = :run_id AND status = 'pending'
"""
# An in-flight effect attempt of a stopped run may have applied: ambiguous. A channel
# delivery or settlement is not the runner's: its adapter child still reports it
# (storage/_channels.py), so the run's end leaves it in flight.
UPDATE_APPLYING_EFFECT_ATTEMPTS_AMBIGUOUS = """
UPDATE effect_attempts SET state = 'ambiguous', finished_at = :now
WHERE state = 'applying' AND effect_id IN (
    SELECT effect_id FROM effects WHERE run_id = :run_id AND effect_type NOT LIKE 'channel.%'
)
"""
# An applying effect of a stopped run: its outcome cannot be proven.
UPDATE_APPLYING_EFFECTS_AMBIGUOUS = """
UPDATE effects SET state = 'ambiguous', updated_at = :now, settled_at = :now
WHERE run_id = :run_id AND state = 'applying' AND effect_type NOT LIKE 'channel.%'
"""
# A pending (never started) effect of a stopped run: it will not run.
UPDATE_PENDING_EFFECTS_CANCEL = """
UPDATE effects SET state = 'cancelled', updated_at = :now, settled_at = :now
WHERE run_id = :run_id AND state = 'pending'
"""
# Cancel the pending workflow messages of the given kinds for a run.
UPDATE_PENDING_MESSAGES_CANCEL = """
UPDATE workflow_messages SET state = 'cancelled', updated_at = :now
WHERE run_id = :run_id AND state = 'pending'
  AND kind IN (SELECT value FROM json_each(:kinds))
"""
# Release the origin-session reservation of a terminal run.
UPDATE_BINDING_RELEASE = """
UPDATE run_bindings SET reserved = 0, released_at = :now WHERE run_id = :run_id AND reserved = 1
"""

# --- Run bindings -------------------------------------------------------------------

# Bind a new run to its execution mode (and reserve its origin session).
INSERT_RUN_BINDING = """
INSERT INTO run_bindings (run_id, execution_mode, origin_session_id, reserved, created_at)
VALUES (:run_id, :execution_mode, :origin_session_id, :reserved, :now)
"""
# The run holding an origin session's reservation, if any.
SELECT_SESSION_RESERVATION = """
SELECT run_id FROM run_bindings WHERE origin_session_id = :origin_session_id AND reserved = 1
"""
# The origin Pi session of an interactive run (no row for a headless run).
SELECT_INTERACTIVE_ORIGIN_SESSION = """
SELECT origin_session_id FROM run_bindings
WHERE run_id = :run_id AND execution_mode = 'interactive'
"""
# The latest finished run bound to an origin session.
SELECT_LATEST_TERMINAL_RUN = """
SELECT r.run_id FROM runs r JOIN run_bindings b ON b.run_id = r.run_id
WHERE b.origin_session_id = :origin_session_id AND r.finished_at IS NOT NULL
ORDER BY r.finished_at DESC, r.rowid DESC LIMIT 1
"""
# The terminal run's retention was cleared (`sessionView.clearTerminal`).
SELECT_TERMINAL_CLEARED = """
SELECT 1 FROM run_bindings WHERE run_id = :run_id AND terminal_cleared_at IS NOT NULL
"""
# Stop retaining a terminal run in its session's view (a trigger moves the view revision).
UPDATE_BINDING_TERMINAL_CLEARED = """
UPDATE run_bindings SET terminal_cleared_at = :now WHERE run_id = :run_id
"""

# --- Interactive requests and submissions --------------------------------------------

# The status of the run whose request a submission answers.
SELECT_SUBMISSION_RUN_STATUS = """
SELECT r.status FROM interactive_submissions s
JOIN interactive_requests q ON q.request_id = s.request_id
JOIN runs r ON r.run_id = q.run_id WHERE s.submission_id = :submission_id
"""
# A submission of the request is being validated.
SELECT_SUBMISSION_VALIDATING = """
SELECT 1 FROM interactive_submissions WHERE request_id = :request_id AND outcome = 'validating'
"""
# The step's request is still pending, its run not paused and not terminal, and it has
# no accepted or validating submission: the ended turn was unproductive (the count so far).
SELECT_UNPRODUCTIVE_TURN_ENDS = """
SELECT i.unproductive_turn_ends FROM interactive_requests i
JOIN runs r ON r.run_id = i.run_id
WHERE i.request_id = :request_id AND i.status = 'pending' AND i.accepted_submission_id IS NULL
  AND r.paused = 0 AND r.finished_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM interactive_submissions s
                  WHERE s.request_id = i.request_id AND s.outcome = 'validating')
"""
# Store the unproductive-turn count of an origin-session step's request.
UPDATE_REQUEST_UNPRODUCTIVE_TURNS = """
UPDATE interactive_requests SET unproductive_turn_ends = :count, updated_at = :now
WHERE request_id = :request_id
"""
# The turn count of the latest request of an interrupted attempt of the same node visit.
SELECT_INTERRUPTED_REQUEST_TURNS = """
SELECT r.unproductive_turn_ends, r.last_turn_error FROM interactive_requests r
JOIN node_attempts a ON a.attempt_id = r.attempt_id
JOIN node_attempts cur ON cur.attempt_id = :attempt_id
WHERE r.run_id = :run_id AND r.attempt_id != :attempt_id AND a.status = 'interrupted'
  AND a.node_path = cur.node_path AND a.visit = cur.visit
ORDER BY r.created_at DESC, r.rowid DESC LIMIT 1
"""
# A new request continues an interrupted request's turn count (in its insert's commit).
UPDATE_REQUEST_TURNS_CARRIED = """
UPDATE interactive_requests SET unproductive_turn_ends = :count, last_turn_error = :last_turn_error
WHERE request_id = :request_id
"""
# Cancel one pending request (its attempt failed).
UPDATE_REQUEST_CANCEL = """
UPDATE interactive_requests SET status = 'cancelled', settled_at = :now, updated_at = :now
WHERE request_id = :request_id AND status = 'pending'
"""
# Cancel one pending request whose deadline passed, keeping its active time so far.
UPDATE_REQUEST_TIME_OUT = """
UPDATE interactive_requests SET status = 'cancelled', settled_at = :now, updated_at = :now,
    active_ms = active_ms + CASE WHEN active_since IS NULL THEN 0 ELSE max(0, :now - active_since) END,
    active_since = NULL
WHERE request_id = :request_id AND status = 'pending'
"""

# --- Workflow messages and model turns -----------------------------------------------

# Cancel a request's pending step messages.
UPDATE_STEP_MESSAGES_CANCEL = """
UPDATE workflow_messages SET state = 'cancelled', updated_at = :now
WHERE source_id = :request_id AND kind = 'step' AND state = 'pending'
"""
# Cancel the pending step messages of a run's cancelled (superseded) requests.
UPDATE_CANCELLED_REQUEST_MESSAGES_CANCEL = """
UPDATE workflow_messages SET state = 'cancelled', updated_at = :now
WHERE run_id = :run_id AND kind = 'step' AND state = 'pending' AND source_id IN (
    SELECT request_id FROM interactive_requests WHERE run_id = :run_id AND status = 'cancelled'
)
"""
# A request has a pending step message (a reminder or a re-presentation).
SELECT_PENDING_STEP_MESSAGE = """
SELECT 1 FROM workflow_messages WHERE source_id = :request_id AND kind = 'step' AND state = 'pending'
"""
# A turn of the message has ended.
SELECT_MESSAGE_TURN_ENDED = """
SELECT 1 FROM workflow_turns WHERE message_id = :message_id AND status != 'open'
"""
# The run's newest open origin-session model turn.
SELECT_OPEN_RUN_TURN = """
SELECT turn_id, message_id, started_at FROM workflow_turns
WHERE run_id = :run_id AND status = 'open' ORDER BY started_at DESC LIMIT 1
"""
# The next eligible pending message, in session order. An earlier ineligible message
# does not block a later eligible one (workflow-server.md § Interactive Pi execution).
SELECT_NEXT_ELIGIBLE_MESSAGE = """
SELECT m.message_id, m.run_id, m.target_session_id, m.kind, m.reason, m.source_id,
       m.content_digest, m.session_order, m.state, m.pi_entry_id
FROM workflow_messages m JOIN runs r ON r.run_id = m.run_id
WHERE m.target_session_id = :session_id AND m.state = 'pending' AND (
    (m.kind = 'step' AND r.paused = 0 AND EXISTS (
        SELECT 1 FROM interactive_requests i
        WHERE i.request_id = m.source_id AND i.status = 'pending'))
    OR (m.kind = 'decision' AND EXISTS (
        SELECT 1 FROM human_decisions d
        WHERE d.decision_id = m.source_id AND d.status = 'pending'))
    OR m.kind IN ('notification', 'terminal', 'follow_up')
)
ORDER BY m.session_order LIMIT 1
"""

# --- Session view --------------------------------------------------------------------

# Every run of the session adds its view revision: each only grows, and a newer run
# adds its own, so the sum grows with every change a session view shows.
SELECT_SESSION_BASE_REVISION = """
SELECT coalesce(sum(r.revision + r.view_changes), 0) FROM runs r
JOIN run_bindings b ON b.run_id = r.run_id WHERE b.origin_session_id = :session_id
"""
# Its terminal message is pending, or sent with its first turn not started yet, or that
# turn is open or ended less than `:keep_ms` ago: the terminal run stays in view
# (without the sent case it blinked out between the send and pi's turn start).
SELECT_TERMINAL_RETAINED = """
SELECT 1 FROM workflow_messages m
WHERE m.run_id = :run_id AND m.kind = 'terminal' AND (
    m.state = 'pending'
    OR (m.state = 'sent'
        AND NOT EXISTS (SELECT 1 FROM workflow_turns t WHERE t.message_id = m.message_id))
    OR EXISTS (
        SELECT 1 FROM workflow_turns t WHERE t.message_id = m.message_id
        AND t.started_at = (SELECT min(f.started_at) FROM workflow_turns f
                            WHERE f.message_id = m.message_id)
        AND (t.status = 'open' OR t.ended_at > :now - :keep_ms))
)
"""

# --- Runner epochs ------------------------------------------------------------------

# Record a runner epoch before spawning it.
INSERT_RUNNER_EPOCH = """
INSERT INTO runner_epochs (
    runner_epoch, run_id, generation, launch_envelope_hash, status, started_at
) VALUES (:runner_epoch, :run_id, :generation, :launch_envelope_hash, 'starting', :now)
"""
# One runner epoch.
SELECT_RUNNER_EPOCH = """
SELECT runner_epoch, run_id, generation, launch_envelope_hash, pid, process_start_time, status,
       started_at, ready_at, ready_revision, finished_at, exit_code, signal, diagnostic_hash
FROM runner_epochs WHERE runner_epoch = :runner_epoch
"""
# Every runner epoch of a run, in launch order (the logs of `run logs`).
SELECT_RUN_RUNNER_EPOCHS = """
SELECT runner_epoch, run_id, generation, launch_envelope_hash, pid, process_start_time, status,
       started_at, ready_at, ready_revision, finished_at, exit_code, signal, diagnostic_hash
FROM runner_epochs WHERE run_id = :run_id ORDER BY started_at, generation, runner_epoch
"""
# The active runner epoch of a run, if any.
SELECT_ACTIVE_RUNNER_EPOCH = """
SELECT runner_epoch, run_id, generation, launch_envelope_hash, pid, process_start_time, status,
       started_at, ready_at, ready_revision, finished_at, exit_code, signal, diagnostic_hash
FROM runner_epochs WHERE run_id = :run_id AND status IN ('starting', 'ready')
"""
# Every active runner epoch (orphan checks after a server restart).
SELECT_ACTIVE_RUNNER_EPOCHS = """
SELECT runner_epoch, run_id, generation, launch_envelope_hash, pid, process_start_time, status,
       started_at, ready_at, ready_revision, finished_at, exit_code, signal, diagnostic_hash
FROM runner_epochs WHERE status IN ('starting', 'ready') ORDER BY started_at, runner_epoch
"""
# The runner sent its ready message.
UPDATE_RUNNER_EPOCH_READY = """
UPDATE runner_epochs
SET status = 'ready', pid = :pid, process_start_time = :process_start_time, ready_at = :now,
    ready_revision = :ready_revision
WHERE runner_epoch = :runner_epoch AND status = 'starting'
"""
# Record the one terminal outcome of a runner epoch.
UPDATE_RUNNER_EPOCH_FINISH = """
UPDATE runner_epochs
SET status = :status, finished_at = :now, exit_code = :exit_code, signal = :signal,
    diagnostic_hash = :diagnostic_hash
WHERE runner_epoch = :runner_epoch AND status IN ('starting', 'ready')
"""

# --- Managed effects ----------------------------------------------------------------

# One effect by its idempotency key, with its attempt count and latest attempt.
SELECT_EFFECT_BY_KEY = """
SELECT e.effect_id, e.run_id, e.attempt_id, e.effect_type, e.idempotency_key,
       e.request_fingerprint, e.idempotent, e.state, e.result_hash, e.error,
       (SELECT count(*) FROM effect_attempts AS a WHERE a.effect_id = e.effect_id) AS attempt_count,
       (SELECT max(a.attempt_number) FROM effect_attempts AS a WHERE a.effect_id = e.effect_id) AS last_attempt_number,
       (SELECT a.executor_epoch FROM effect_attempts AS a WHERE a.effect_id = e.effect_id
        ORDER BY a.attempt_number DESC LIMIT 1) AS last_executor_epoch,
       (SELECT r.revision FROM runs AS r WHERE r.run_id = e.run_id) AS revision
FROM effects AS e WHERE e.idempotency_key = :idempotency_key
"""
# Every effect of a run in reservation order, with the same attempt summary.
SELECT_RUN_EFFECTS = """
SELECT e.effect_id, e.run_id, e.attempt_id, e.effect_type, e.idempotency_key,
       e.request_fingerprint, e.idempotent, e.state, e.result_hash, e.error,
       (SELECT count(*) FROM effect_attempts AS a WHERE a.effect_id = e.effect_id) AS attempt_count,
       (SELECT max(a.attempt_number) FROM effect_attempts AS a WHERE a.effect_id = e.effect_id) AS last_attempt_number,
       (SELECT a.executor_epoch FROM effect_attempts AS a WHERE a.effect_id = e.effect_id
        ORDER BY a.attempt_number DESC LIMIT 1) AS last_executor_epoch,
       (SELECT r.revision FROM runs AS r WHERE r.run_id = e.run_id) AS revision
FROM effects AS e WHERE e.run_id = :run_id ORDER BY e.rowid
"""
# Ambiguous effects of one run (they block automatic retry and need operator review).
COUNT_RUN_AMBIGUOUS_EFFECTS = """
SELECT count(*) FROM effects WHERE run_id = :run_id AND state = 'ambiguous'
"""
# Reserve a new effect, already applying (its first attempt is inserted with it).
INSERT_EFFECT = """
INSERT INTO effects (
    effect_id, run_id, attempt_id, effect_type, idempotency_key, request_fingerprint,
    request_hash, idempotent, state, created_at, updated_at
) VALUES (
    :effect_id, :run_id, :attempt_id, :effect_type, :idempotency_key, :request_fingerprint,
    :request_hash, :idempotent, 'applying', :now, :now
)
"""
# Open a numbered execution attempt of an effect for one executor epoch.
INSERT_EFFECT_ATTEMPT = """
INSERT INTO effect_attempts (effect_id, attempt_number, executor_epoch, state, started_at)
VALUES (:effect_id, :attempt_number, :executor_epoch, 'applying', :now)
"""
# A pending (reserved, never started) effect starts applying.
UPDATE_EFFECT_START = """
UPDATE effects SET state = 'applying', updated_at = :now
WHERE effect_id = :effect_id AND state = 'pending'
"""
# Close the in-flight attempt of an effect with its outcome.
UPDATE_EFFECT_ATTEMPT_CLOSE = """
UPDATE effect_attempts
SET state = :state, finished_at = :now, result_hash = :result_hash, error = :error
WHERE effect_id = :effect_id AND state = 'applying'
"""
# Settle an applying effect (applied, rejected or ambiguous are all final here).
UPDATE_EFFECT_SETTLE = """
UPDATE effects
SET state = :state, result_hash = :result_hash, error = :error, updated_at = :now, settled_at = :now
WHERE effect_id = :effect_id AND state = 'applying'
"""
# Record that an applying effect moved to a new attempt.
UPDATE_EFFECT_TOUCH = "UPDATE effects SET updated_at = :now WHERE effect_id = :effect_id"
# The ambiguous effects of one run, with the node that reserved each and its latest attempt.
SELECT_RUN_AMBIGUOUS_EFFECTS = """
SELECT e.effect_id, e.effect_type, e.idempotency_key, n.node_path, n.visit,
       (SELECT max(a.attempt_number) FROM effect_attempts AS a WHERE a.effect_id = e.effect_id) AS attempt_number
FROM effects AS e LEFT JOIN node_attempts AS n ON n.attempt_id = e.attempt_id
WHERE e.run_id = :run_id AND e.state = 'ambiguous' ORDER BY e.rowid
"""
# An operator confirmed that the ambiguous latest attempt applied: attempt and effect.
UPDATE_EFFECT_ATTEMPT_CONFIRM = """
UPDATE effect_attempts SET state = 'applied', result_hash = :result_hash, error = NULL,
    recovery = 'confirmed'
WHERE effect_id = :effect_id AND attempt_number = :attempt_number AND state = 'ambiguous'
"""
UPDATE_EFFECT_CONFIRM = """
UPDATE effects SET state = 'applied', result_hash = :result_hash, error = NULL,
    updated_at = :now, settled_at = :now
WHERE effect_id = :effect_id AND state = 'ambiguous'
"""
# An operator ordered a retry: the ambiguous attempt stays, the effect is pending again
# (the next reservation opens the next attempt).
UPDATE_EFFECT_ATTEMPT_RETRY = """
UPDATE effect_attempts SET recovery = 'retried'
WHERE effect_id = :effect_id AND attempt_number = :attempt_number AND state = 'ambiguous'
"""
UPDATE_EFFECT_REOPEN = """
UPDATE effects SET state = 'pending', result_hash = NULL, error = NULL,
    updated_at = :now, settled_at = NULL
WHERE effect_id = :effect_id AND state = 'ambiguous'
"""

# --- Runner message receipts ---------------------------------------------------------

# The stored reply to one runner message.
COUNT_RUNNER_MESSAGES = """
SELECT COUNT(*) FROM runner_messages WHERE runner_epoch = :runner_epoch
"""

SELECT_RUNNER_MESSAGE = """
SELECT fingerprint, reply
FROM runner_messages WHERE runner_epoch = :runner_epoch AND message_id = :message_id
"""
# Store the reply to an accepted runner message, in the transaction of its change.
INSERT_RUNNER_MESSAGE = """
INSERT INTO runner_messages (runner_epoch, message_id, kind, fingerprint, reply, created_at)
VALUES (:runner_epoch, :message_id, :kind, :fingerprint, :reply, :now)
"""
# Forget an ended runner epoch's replies: no frame of it reaches the database again.
DELETE_RUNNER_MESSAGES = "DELETE FROM runner_messages WHERE runner_epoch = :runner_epoch"
# Whether a runner epoch's run revision advanced after its ready message.
SELECT_RUNNER_PROGRESS = """
SELECT w.ready_revision, r.revision FROM runner_epochs AS w JOIN runs AS r ON r.run_id = w.run_id
WHERE w.runner_epoch = :runner_epoch
"""

# --- Command receipts ---------------------------------------------------------------

# The receipt stored under one request ID.
SELECT_COMMAND_BY_REQUEST = """
SELECT request_id, client_id, operation, idempotency_key, fingerprint, run_id,
       accepted_revision, outcome, receipt, created_at
FROM host_commands WHERE request_id = :request_id
"""
# The receipt stored under one client's idempotency key.
SELECT_COMMAND_BY_KEY = """
SELECT request_id, client_id, operation, idempotency_key, fingerprint, run_id,
       accepted_revision, outcome, receipt, created_at
FROM host_commands WHERE client_id = :client_id AND idempotency_key = :idempotency_key
"""
# Store a command receipt in the transaction of the change it acknowledges.
INSERT_COMMAND = """
INSERT INTO host_commands (
    request_id, client_id, operation, idempotency_key, fingerprint, run_id,
    accepted_revision, outcome, receipt, created_at
) VALUES (
    :request_id, :client_id, :operation, :idempotency_key, :fingerprint, :run_id,
    :accepted_revision, :outcome, :receipt, :now
)
"""

# --- Content ------------------------------------------------------------------------

# Store a blob once; the same bytes always have the same digest.
# A blob written again is marked written now (bytes unchanged) once it is older than
# the refresh interval, so the unnamed-blob sweep's grace period protects it again.
INSERT_BLOB = """
INSERT INTO blobs (digest, byte_length, content, created_at)
VALUES (:digest, :byte_length, :content, :now)
ON CONFLICT (digest) DO UPDATE SET created_at = excluded.created_at
WHERE blobs.created_at < :refresh_before
"""
# Where a blob's bytes are (its rowid, for incremental blob I/O) and how many there are.
SELECT_BLOB_LOCATION = "SELECT rowid AS row_id, byte_length FROM blobs WHERE digest = :digest"
# Store generated view content under its exact run, digest and media type.
INSERT_VIEW_CONTENT = """
INSERT INTO run_view_content (run_id, digest, media_type, byte_length, content, created_at)
VALUES (:run_id, :digest, :media_type, :byte_length, :content, :now)
ON CONFLICT (run_id, digest, media_type) DO NOTHING
"""
# Where view content is, found only by its exact run, digest and media type.
SELECT_VIEW_CONTENT_LOCATION = """
SELECT rowid AS row_id, byte_length FROM run_view_content
WHERE run_id = :run_id AND digest = :digest AND media_type = :media_type
"""
# A verbatim Pi entry of a run's session record, readable as that run's JSON view content.
SELECT_SESSION_ENTRY_LOCATION = """
SELECT b.rowid AS row_id, b.byte_length, 'blobs' AS "table" FROM session_entries n
JOIN blobs b ON b.digest = n.content_hash
WHERE n.run_id = :run_id AND n.content_hash = :digest LIMIT 1
"""
# A run's definition snapshot, readable as that run's JSON view content: read in place
# from its blob (named by `runs.definition_digest` while the run exists), never copied.
SELECT_DEFINITION_LOCATION = """
SELECT b.rowid AS row_id, b.byte_length, 'blobs' AS "table" FROM runs r
JOIN blobs b ON b.digest = r.definition_digest
WHERE r.run_id = :run_id AND r.definition_digest = :digest
"""

# --- Invariant checks (read-only; each returns one row per finding) -----------------

# Runs without a queue row.
CHECK_RUNS_WITHOUT_QUEUE = """
SELECT r.run_id, r.status AS detail FROM runs AS r
LEFT JOIN run_queue AS q ON q.run_id = r.run_id WHERE q.run_id IS NULL
"""
# Run status and queue state of every run, to compare with the lifecycle table.
CHECK_RUN_QUEUE_PAIRS = """
SELECT r.run_id, r.status, q.state FROM runs AS r JOIN run_queue AS q ON q.run_id = r.run_id
"""
# Starting or running queue rows with no claim at all.
CHECK_CLAIMED_QUEUE_WITHOUT_LEASE = """
SELECT q.run_id, q.state AS detail FROM run_queue AS q
LEFT JOIN leases AS l ON l.resource = q.run_id
WHERE q.state IN ('starting', 'running') AND l.resource IS NULL
"""
# Terminal runs that still hold a claim.
CHECK_TERMINAL_RUNS_WITH_LEASE = """
SELECT r.run_id, r.status AS detail FROM runs AS r JOIN leases AS l ON l.resource = r.run_id
WHERE r.status IN ('completed', 'failed', 'timed_out', 'cancelled')
"""
# Claims whose generation is not the run's current generation.
CHECK_LEASE_GENERATION = """
SELECT r.run_id, 'lease ' || l.generation || ', run ' || r.generation AS detail
FROM runs AS r JOIN leases AS l ON l.resource = r.run_id WHERE l.generation <> r.generation
"""
# Runs with more than one active runner epoch.
CHECK_TWO_ACTIVE_RUNNERS = """
SELECT run_id, count(*) || ' active runner epochs' AS detail FROM runner_epochs
WHERE status IN ('starting', 'ready') GROUP BY run_id HAVING count(*) > 1
"""
# Event revisions that do not run 1..N without gaps or repeats.
CHECK_EVENT_REVISION_GAPS = """
SELECT run_id, 'revisions ' || min(revision) || '..' || max(revision) || ', ' || count(*) || ' events' AS detail
FROM events GROUP BY run_id
HAVING min(revision) <> 1 OR max(revision) <> count(*) OR count(DISTINCT revision) <> count(*)
"""
# Runs whose revision differs from their last event revision (or have no events).
CHECK_RUN_REVISION_MATCHES_EVENTS = """
SELECT r.run_id, 'run ' || r.revision || ', last event ' || coalesce(max(e.revision), 'none') AS detail
FROM runs AS r LEFT JOIN events AS e ON e.run_id = r.run_id
GROUP BY r.run_id HAVING max(e.revision) IS NULL OR max(e.revision) <> r.revision
"""
# Terminal runs without a finish time, and nonterminal runs with one.
CHECK_FINISHED_AT = """
SELECT run_id, status AS detail FROM runs
WHERE (status IN ('completed', 'failed', 'timed_out', 'cancelled')) <> (finished_at IS NOT NULL)
"""
# Terminal runs still marked paused.
CHECK_TERMINAL_PAUSED = """
SELECT run_id, status AS detail FROM runs
WHERE paused = 1 AND status IN ('completed', 'failed', 'timed_out', 'cancelled')
"""
# Unfinished attempts of terminal runs.
CHECK_TERMINAL_UNFINISHED_ATTEMPTS = """
SELECT a.run_id, a.attempt_id || ' ' || a.status AS detail FROM node_attempts AS a
JOIN runs AS r ON r.run_id = a.run_id
WHERE a.status IN ('running', 'waiting') AND r.status IN ('completed', 'failed', 'timed_out', 'cancelled')
"""
# Runs with more than one unfinished attempt.
CHECK_MULTIPLE_UNFINISHED_ATTEMPTS = """
SELECT run_id, count(*) || ' unfinished attempts' AS detail FROM node_attempts
WHERE status IN ('running', 'waiting') GROUP BY run_id HAVING count(*) > 1
"""
# Running attempts of runs that have no live runner state.
CHECK_RUNNING_ATTEMPT_WITHOUT_RUNNER = """
SELECT a.run_id, a.attempt_id || ' in queue state ' || coalesce(q.state, 'none') AS detail
FROM node_attempts AS a LEFT JOIN run_queue AS q ON q.run_id = a.run_id
WHERE a.status = 'running' AND coalesce(q.state, '') <> 'running'
"""
# Pending step messages of terminal runs.
CHECK_TERMINAL_PENDING_STEP_MESSAGES = """
SELECT m.run_id, m.message_id AS detail FROM workflow_messages AS m
JOIN runs AS r ON r.run_id = m.run_id
WHERE m.kind = 'step' AND m.state = 'pending'
  AND r.status IN ('completed', 'failed', 'timed_out', 'cancelled')
"""
# Interactive requests with more than one pending step message.
CHECK_DUPLICATE_PENDING_STEP_MESSAGES = """
SELECT min(run_id) AS run_id, 'request ' || source_id || ': ' || count(*) || ' pending step messages' AS detail
FROM workflow_messages WHERE kind = 'step' AND state = 'pending'
GROUP BY source_id HAVING count(*) > 1
"""
# Pending interactive requests of terminal runs.
CHECK_TERMINAL_PENDING_REQUESTS = """
SELECT i.run_id, i.request_id AS detail FROM interactive_requests AS i
JOIN runs AS r ON r.run_id = i.run_id
WHERE i.status = 'pending' AND r.status IN ('completed', 'failed', 'timed_out', 'cancelled')
"""
# Pending human decisions of terminal runs.
CHECK_TERMINAL_PENDING_DECISIONS = """
SELECT d.run_id, d.decision_id AS detail FROM human_decisions AS d
JOIN runs AS r ON r.run_id = d.run_id
WHERE d.status = 'pending' AND r.status IN ('completed', 'failed', 'timed_out', 'cancelled')
"""
# Decisions whose status disagrees with their resolution fence.
CHECK_DECISION_RESOLUTIONS = """
SELECT d.run_id, d.decision_id || ': ' || d.status || ' vs ' || coalesce(x.outcome, 'no resolution') AS detail
FROM human_decisions AS d LEFT JOIN human_decision_resolutions AS x ON x.decision_id = d.decision_id
WHERE (d.status = 'pending' AND x.decision_id IS NOT NULL)
   OR (d.status <> 'pending' AND (x.decision_id IS NULL OR x.outcome <> d.status))
"""
# Unsettled effects of terminal runs (a channel settlement edits the message of a run
# that ended: it is in flight on a terminal run by design).
CHECK_TERMINAL_UNSETTLED_EFFECTS = """
SELECT e.run_id, e.effect_id || ' ' || e.state AS detail FROM effects AS e
JOIN runs AS r ON r.run_id = e.run_id
WHERE e.state IN ('pending', 'applying') AND r.status IN ('completed', 'failed', 'timed_out', 'cancelled')
  AND e.effect_type NOT LIKE 'channel.%'
"""
# Effects with more than one applied attempt.
CHECK_EFFECT_APPLIED_TWICE = """
SELECT e.run_id, e.effect_id || ': ' || count(*) || ' applied attempts' AS detail
FROM effect_attempts AS a JOIN effects AS e ON e.effect_id = a.effect_id
WHERE a.state = 'applied' GROUP BY a.effect_id HAVING count(*) > 1
"""
# Effects whose settled state disagrees with their attempts.
CHECK_EFFECT_STATE_MISMATCH = """
SELECT e.run_id, e.effect_id || ': ' || e.state AS detail FROM effects AS e
WHERE (e.state = 'applied') <> EXISTS (
          SELECT 1 FROM effect_attempts AS a WHERE a.effect_id = e.effect_id AND a.state = 'applied')
   OR (e.state = 'applying') <> EXISTS (
          SELECT 1 FROM effect_attempts AS a WHERE a.effect_id = e.effect_id AND a.state = 'applying')
"""
# Effects whose attempts are not numbered exactly 1..N.
CHECK_EFFECT_ATTEMPT_NUMBERING = """
SELECT e.run_id, e.effect_id || ': attempts ' || min(a.attempt_number) || '..' || max(a.attempt_number) || ', ' || count(*) || ' rows' AS detail
FROM effect_attempts AS a JOIN effects AS e ON e.effect_id = a.effect_id
GROUP BY a.effect_id HAVING min(a.attempt_number) <> 1 OR max(a.attempt_number) <> count(*)
"""
# Effects whose latest attempt disagrees with the effect, or whose earlier attempts did
# not end as cancelled or rejected (only the latest attempt may apply or be in doubt).
CHECK_EFFECT_LAST_ATTEMPT = """
SELECT e.run_id, e.effect_id || ': ' || e.state || ', attempt ' || a.attempt_number || ' ' || a.state AS detail
FROM effects AS e JOIN effect_attempts AS a ON a.effect_id = e.effect_id
WHERE CASE
    WHEN a.attempt_number = (SELECT max(b.attempt_number) FROM effect_attempts AS b
                             WHERE b.effect_id = e.effect_id)
    THEN CASE WHEN e.state IN ('applying', 'applied', 'rejected', 'ambiguous') THEN a.state <> e.state
              ELSE a.state NOT IN ('cancelled', 'rejected')
                   AND NOT (a.state = 'ambiguous' AND a.recovery IS 'retried') END
    ELSE a.state NOT IN ('cancelled', 'rejected', 'interrupted')
         AND NOT (a.state = 'ambiguous' AND a.recovery IS 'retried')
END
"""
# Interrupted attempts of an effect not declared idempotent (only those may re-apply).
CHECK_EFFECT_INTERRUPTED_NOT_IDEMPOTENT = """
SELECT e.run_id, e.effect_id || ': attempt ' || a.attempt_number || ' interrupted' AS detail
FROM effect_attempts AS a JOIN effects AS e ON e.effect_id = a.effect_id
WHERE a.state = 'interrupted' AND e.idempotent = 0
"""
# Operator recoveries with no `effect_recovered` event naming the effect and attempt.
CHECK_EFFECT_RECOVERY_UNRECORDED = """
SELECT e.run_id, e.effect_id || ': attempt ' || a.attempt_number || ' ' || a.recovery AS detail
FROM effect_attempts AS a JOIN effects AS e ON e.effect_id = a.effect_id
WHERE a.recovery IS NOT NULL AND NOT EXISTS (
    SELECT 1 FROM events AS v
    WHERE v.run_id = e.run_id AND v.event_type = 'effect_recovered'
      AND json_extract(v.payload, '$.effectId') = e.effect_id
      AND json_extract(v.payload, '$.attemptNumber') = a.attempt_number
      AND json_extract(v.payload, '$.action') = CASE a.recovery WHEN 'confirmed' THEN 'confirm' ELSE 'retry' END)
"""
# Effects whose node attempt belongs to another run.
CHECK_EFFECT_NODE_ATTEMPT_RUN = """
SELECT e.run_id, e.effect_id || ': node attempt ' || n.attempt_id || ' of another run' AS detail
FROM effects AS e JOIN node_attempts AS n ON n.attempt_id = e.attempt_id
WHERE n.run_id <> e.run_id
"""
# Origin-session reservations of terminal runs, and nonterminal interactive runs without one.
CHECK_RESERVATIONS = """
SELECT r.run_id, r.status || ', reserved ' || b.reserved AS detail FROM run_bindings AS b
JOIN runs AS r ON r.run_id = b.run_id
WHERE b.execution_mode = 'interactive'
  AND (r.status IN ('completed', 'failed', 'timed_out', 'cancelled')) = (b.reserved = 1)
"""
# Every blob with its bytes, for the verifier's digest check (streamed row by row).
SELECT_BLOB_CONTENTS = (
    "SELECT rowid, digest, byte_length, typeof(content) = 'blob', length(content) FROM blobs"
)
# Every view content row, for the same check (its bytes are read in parts).
SELECT_VIEW_CONTENTS = (
    "SELECT rowid, run_id, digest, media_type, byte_length, typeof(content) = 'blob', "
    "length(content) FROM run_view_content"
)


# --- Checkpoint decisions -----------------------------------------------------------

# Open the pending decision of a run that waits at a checkpoint.
INSERT_CHECKPOINT_DECISION = """
INSERT INTO human_decisions (
    decision_id, run_id, attempt_id, node_path, audience, request_digest, request_hash,
    status, created_at, updated_at
) VALUES (
    :decision_id, :run_id, :attempt_id, :node_path, 'checkpoint', :request_digest,
    :request_hash, 'pending', :now, :now
)
"""
# The pending decision of one run.
SELECT_PENDING_DECISION = """
SELECT decision_id, run_id, attempt_id, node_path, request_hash FROM human_decisions
WHERE run_id = :run_id AND status = 'pending'
"""
# The one resolution of an answered decision.
INSERT_DECISION_RESOLUTION_ACCEPTED = """
INSERT INTO human_decision_resolutions (
    decision_id, outcome, provenance, response_hash, answer_digest, idempotency_key,
    source_channel, resolved_at
) VALUES (
    :decision_id, 'accepted', :provenance, :response_hash, :answer_digest, :idempotency_key,
    :source, :now
)
"""
# The answer record of the accepted attempt.
INSERT_DECISION_ANSWER_ACCEPTED = """
INSERT INTO human_decision_answers (
    decision_id, idempotency_key, answer_digest, source_channel, outcome, submitted_at
) VALUES (:decision_id, :idempotency_key, :answer_digest, :source, 'accepted', :now)
"""
# Close the decision and name its continuation run.
UPDATE_DECISION_ACCEPTED = """
UPDATE human_decisions
SET status = 'accepted', continuation_run_id = :continuation_run_id, updated_at = :now,
    revision = revision + 1
WHERE decision_id = :decision_id AND status = 'pending'
"""
# The decision a continuation run continues, with its accepted answer.
SELECT_CONTINUATION_DECISION = """
SELECT d.decision_id, d.run_id, d.attempt_id, d.node_path, x.response_hash
FROM human_decisions AS d
JOIN human_decision_resolutions AS x ON x.decision_id = d.decision_id
WHERE d.continuation_run_id = :continuation_run_id AND x.outcome = 'accepted'
"""

# --- Protected decisions -------------------------------------------------------------

# The run's protected decision a client's answer means: its pending one, else its latest.
SELECT_RUN_PROTECTED_DECISION = """
SELECT decision_id FROM human_decisions
WHERE run_id = :run_id AND audience != 'checkpoint'
ORDER BY (status = 'pending') DESC, created_at DESC, rowid DESC LIMIT 1
"""
# One protected decision in any state, with its run's workflow name.
SELECT_PROTECTED_DECISION = """
SELECT d.decision_id, d.run_id, d.node_path, r.workflow_name, d.revision, d.request_hash
FROM human_decisions AS d JOIN runs AS r ON r.run_id = d.run_id
WHERE d.decision_id = :decision_id AND d.audience != 'checkpoint'
"""

# How many runner epochs of one run ended with one outcome (e.g. crashed).
COUNT_RUNNER_OUTCOMES = """
SELECT count(*) FROM runner_epochs WHERE run_id = :run_id AND status = :outcome
"""

# --- Handing an interactive run over (adopt, headless) -------------------------------

# Make another session the run's origin session; its reservation moves with it.
UPDATE_BINDING_ORIGIN_SESSION = """
UPDATE run_bindings SET origin_session_id = :session_id
WHERE run_id = :run_id AND execution_mode = 'interactive'
"""
# Turn an interactive run headless: no origin session, its reservation released.
UPDATE_BINDING_HEADLESS = """
UPDATE run_bindings SET execution_mode = 'headless', origin_session_id = NULL, reserved = 0,
    released_at = coalesce(released_at, :now)
WHERE run_id = :run_id AND execution_mode = 'interactive'
"""
# The run's pending origin-session requests now target another session.
UPDATE_RUN_REQUESTS_TARGET = """
UPDATE interactive_requests SET target_session_id = :session_id, updated_at = :now
WHERE run_id = :run_id AND status = 'pending' AND target_session_id IS NOT NULL
"""
# The run's pending requests target no session (a headless bridge answers them).
UPDATE_RUN_REQUESTS_UNTARGETED = """
UPDATE interactive_requests SET target_session_id = NULL, active_since = NULL, updated_at = :now
WHERE run_id = :run_id AND status = 'pending' AND target_session_id IS NOT NULL
"""
# End the run's open origin-session turns as lost.
UPDATE_RUN_OPEN_TURNS_LOST = """
UPDATE workflow_turns SET status = 'lost', ended_at = :now
WHERE run_id = :run_id AND status = 'open'
"""
# The run's pending workflow messages, in session order.
SELECT_RUN_PENDING_MESSAGES = """
SELECT message_id FROM workflow_messages
WHERE run_id = :run_id AND state = 'pending' ORDER BY session_order
"""
# The next place in a session's message order.
SELECT_NEXT_SESSION_ORDER = """
SELECT coalesce(max(session_order), 0) + 1 FROM workflow_messages
WHERE target_session_id = :session_id
"""
# Move one pending message to another session, at the given place.
UPDATE_MESSAGE_TARGET = """
UPDATE workflow_messages SET target_session_id = :session_id, session_order = :order,
    updated_at = :now
WHERE message_id = :message_id AND state = 'pending'
"""
# The chain's pending follow-ups go to the run's new origin session.
UPDATE_CHAIN_FOLLOW_UPS_TARGET = """
UPDATE follow_ups SET target_session_id = :session_id, updated_at = :now
WHERE chain_run_id = :root AND state = 'pending'
"""
# Cancel the run's pending step and decision messages.
UPDATE_RUN_STEP_DECISION_MESSAGES_CANCEL = """
UPDATE workflow_messages SET state = 'cancelled', updated_at = :now
WHERE run_id = :run_id AND state = 'pending' AND kind IN ('step', 'decision')
"""
# The run's pending protected decisions that were presented before (a decision message
# exists) and have no pending message now, with the content of their latest message.
SELECT_DECISIONS_TO_PRESENT_AGAIN = """
SELECT d.decision_id,
       (SELECT m.content_digest FROM workflow_messages AS m
        WHERE m.source_id = d.decision_id AND m.kind = 'decision'
        ORDER BY m.session_order DESC LIMIT 1) AS content_digest
FROM human_decisions AS d
WHERE d.run_id = :run_id AND d.status = 'pending'
  AND EXISTS (SELECT 1 FROM workflow_messages AS m
              WHERE m.source_id = d.decision_id AND m.kind = 'decision')
  AND NOT EXISTS (SELECT 1 FROM workflow_messages AS m
                  WHERE m.source_id = d.decision_id AND m.kind = 'decision'
                    AND m.state = 'pending')
ORDER BY d.created_at, d.rowid
"""
# One more decision message for a pending decision, with an earlier message's content.
INSERT_DECISION_MESSAGE_AGAIN = """
INSERT INTO workflow_messages (message_id, run_id, target_session_id, kind, reason, source_id,
    content_digest, session_order, state, created_at, updated_at)
VALUES (:message_id, :run_id, :session_id, 'decision', NULL, :source_id, :digest, :order,
    'pending', :now, :now)
"""
# The run waits, with no runner, at a pending agent step.
SELECT_RUN_WAITS_AT_AGENT_STEP = """
SELECT 1 FROM runs AS r JOIN interactive_requests AS i ON i.run_id = r.run_id
WHERE r.run_id = :run_id AND r.status = 'waiting' AND i.status = 'pending' AND i.kind = 'agent'
"""

# --- resource managers (`_resources.py`) ---------------------------------------------------

# One resource by its identity.
SELECT_RESOURCE_BY_KEY = """
SELECT r.uid, r.manager, r.project_path, r.resource_key, r.resource_version, r.generation,
       r.spec, r.spec_digest, r.status, r.observed_generation, r.conditions, r.finalizers,
       r.deletion_requested_at, r.source_identity, r.source_digest, r.created_at, r.updated_at
FROM resources AS r
WHERE r.manager = :manager AND r.project_path = :project_path
  AND r.resource_key = :resource_key
"""
# One resource by its uid.
SELECT_RESOURCE_BY_UID = """
SELECT r.uid, r.manager, r.project_path, r.resource_key, r.resource_version, r.generation,
       r.spec, r.spec_digest, r.status, r.observed_generation, r.conditions, r.finalizers,
       r.deletion_requested_at, r.source_identity, r.source_digest, r.created_at, r.updated_at
FROM resources AS r WHERE r.uid = :uid
"""
# The resource list (no spec, no status value), filtered by manager and/or project.
SELECT_RESOURCE_SUMMARIES = """
SELECT r.uid, r.manager, r.project_path, r.resource_key, r.resource_version, r.generation,
       r.observed_generation, r.conditions, r.finalizers, r.deletion_requested_at,
       r.updated_at, q.available_at, q.retries, q.reason AS queue_reason,
       c.expires_at AS claim_expires_at
FROM resources AS r
LEFT JOIN resource_queue AS q ON q.uid = r.uid
LEFT JOIN resource_claims AS c ON c.uid = r.uid
WHERE (:manager IS NULL OR r.manager = :manager)
  AND (:project_path IS NULL OR r.project_path = :project_path)
ORDER BY r.manager, r.project_path, r.resource_key
LIMIT :limit
"""
INSERT_RESOURCE = """
INSERT INTO resources (
    uid, manager, project_path, resource_key, resource_version, generation, spec,
    spec_digest, status, observed_generation, conditions, finalizers, source_identity,
    source_digest, created_at, updated_at
) VALUES (
    :uid, :manager, :project_path, :resource_key, 1, 1, :spec, :spec_digest, :status, 0,
    '[]', :finalizers, :source_identity, :source_digest, :now, :now
)
"""
# A new spec (and source) from `apply`; the generation moves only when the spec changes.
UPDATE_RESOURCE_SPEC = """
UPDATE resources
SET spec = :spec, spec_digest = :spec_digest, generation = :generation,
    source_identity = :source_identity, source_digest = :source_digest,
    resource_version = :resource_version, updated_at = :now
WHERE uid = :uid
"""
# A committed pass's status, conditions and finalizers.
UPDATE_RESOURCE_STATUS = """
UPDATE resources
SET status = :status, conditions = :conditions, observed_generation = :observed_generation,
    finalizers = :finalizers, resource_version = :resource_version, updated_at = :now
WHERE uid = :uid
"""
UPDATE_RESOURCE_DELETION = """
UPDATE resources
SET deletion_requested_at = :now, resource_version = :resource_version, updated_at = :now
WHERE uid = :uid
"""
UPDATE_RESOURCE_CLAIM_GENERATION = (
    "UPDATE resources SET claim_generation = :claim_generation WHERE uid = :uid"
)
SELECT_RESOURCE_CLAIM_GENERATION = "SELECT claim_generation FROM resources WHERE uid = :uid"
DELETE_RESOURCE = "DELETE FROM resources WHERE uid = :uid"
INSERT_RESOURCE_EVENT = """
INSERT INTO resource_events (uid, resource_version, event_type, payload, recorded_at)
VALUES (:uid, :resource_version, :event_type, :payload, :now)
"""
SELECT_RESOURCE_EVENTS = """
SELECT uid, resource_version, event_type, payload, recorded_at FROM resource_events
WHERE uid = :uid AND resource_version > :after ORDER BY resource_version LIMIT :limit
"""
# An enqueue: one row per resource. A hint never delays a row that is due earlier; the
# reason is the latest hint's.
UPSERT_RESOURCE_QUEUE = """
INSERT INTO resource_queue (uid, available_at, retries, reason, hints, enqueued_at, updated_at)
VALUES (:uid, :available_at, 0, :reason, 1, :now, :now)
ON CONFLICT (uid) DO UPDATE SET
    available_at = min(available_at, excluded.available_at),
    reason = excluded.reason,
    hints = hints + 1,
    updated_at = excluded.updated_at
"""
# A committed pass's next delivery (requeue, requeue_after, backoff, or a wake-up seen).
UPSERT_RESOURCE_QUEUE_AFTER_RECONCILE = """
INSERT INTO resource_queue (uid, available_at, retries, reason, hints, enqueued_at, updated_at)
VALUES (:uid, :available_at, :retries, :reason, 1, :now, :now)
ON CONFLICT (uid) DO UPDATE SET
    available_at = excluded.available_at, retries = excluded.retries,
    reason = excluded.reason, updated_at = excluded.updated_at
"""
DELETE_RESOURCE_QUEUE_ROW = "DELETE FROM resource_queue WHERE uid = :uid"
SELECT_RESOURCE_QUEUE_ROW = """
SELECT uid, available_at, retries, reason, hints, enqueued_at, updated_at
FROM resource_queue WHERE uid = :uid
"""
# The next due key without a live claim (an expired claim does not hold it back).
SELECT_NEXT_DUE_RESOURCE = """
SELECT q.uid FROM resource_queue AS q
WHERE q.available_at <= :now
  AND NOT EXISTS (SELECT 1 FROM resource_claims AS c WHERE c.uid = q.uid AND c.expires_at > :now)
ORDER BY q.available_at, q.enqueued_at, q.uid
LIMIT 1
"""
# The earliest time a queued key without a live claim becomes due (the scheduler's timer).
SELECT_NEXT_RESOURCE_DUE_AT = """
SELECT min(q.available_at) FROM resource_queue AS q
WHERE NOT EXISTS (SELECT 1 FROM resource_claims AS c WHERE c.uid = q.uid AND c.expires_at > :now)
"""
# Scheduled reconcile work (recovery step 7), soonest first.
SELECT_SCHEDULED_RECONCILES = """
SELECT q.uid, r.manager, r.project_path, r.resource_key, q.available_at, q.retries, q.reason,
       c.expires_at AS claim_expires_at
FROM resource_queue AS q
JOIN resources AS r ON r.uid = q.uid
LEFT JOIN resource_claims AS c ON c.uid = q.uid
ORDER BY q.available_at, q.enqueued_at, q.uid
LIMIT :limit
"""
SELECT_RESOURCE_CLAIM = """
SELECT uid, owner_type, owner_id, token_hash, generation, reconcile_id, resource_version,
       hints, acquired_at, heartbeat_at, expires_at
FROM resource_claims WHERE uid = :uid
"""
INSERT_RESOURCE_CLAIM = """
INSERT INTO resource_claims (
    uid, owner_type, owner_id, token_hash, generation, reconcile_id, resource_version, hints,
    acquired_at, heartbeat_at, expires_at
) VALUES (
    :uid, :owner_type, :owner_id, :token_hash, :generation, :reconcile_id, :resource_version,
    :hints, :now, :now, :expires_at
)
"""
# Renew the exact live claim; returns the new expiry, or no row.
RENEW_RESOURCE_CLAIM = """
UPDATE resource_claims SET heartbeat_at = :now, expires_at = :expires_at
WHERE uid = :uid AND generation = :generation AND owner_type = :owner_type
  AND owner_id = :owner_id AND token_hash = :token_hash AND expires_at > :now
RETURNING expires_at
"""
DELETE_RESOURCE_CLAIM = "DELETE FROM resource_claims WHERE uid = :uid"
# Claims whose holder stopped renewing them (recovery returns their keys to the queue);
# :every = 1 at startup, when no pass of an earlier server can still be running.
ANY_EXPIRED_RESOURCE_CLAIM = """
SELECT EXISTS (SELECT 1 FROM resource_claims WHERE expires_at <= :now OR :every = 1)
"""
SELECT_EXPIRED_RESOURCE_CLAIMS = """
SELECT uid FROM resource_claims WHERE expires_at <= :now OR :every = 1
ORDER BY expires_at, uid
"""
INSERT_RECONCILE_HISTORY = """
INSERT INTO reconcile_history (
    uid, reconcile_id, generation, outcome, requeue_reason, error_class, started_at,
    duration_ms, recorded_at
) VALUES (
    :uid, :reconcile_id, :generation, :outcome, :requeue_reason, :error_class, :started_at,
    :duration_ms, :now
)
"""
# Keep the newest :keep records of one resource.
TRIM_RECONCILE_HISTORY = """
DELETE FROM reconcile_history
WHERE uid = :uid AND history_id <= (
    SELECT history_id FROM reconcile_history WHERE uid = :uid
    ORDER BY history_id DESC LIMIT 1 OFFSET :keep
)
"""
SELECT_RECONCILE_HISTORY = """
SELECT reconcile_id, generation, outcome, requeue_reason, error_class, started_at,
       duration_ms, recorded_at
FROM reconcile_history WHERE uid = :uid ORDER BY history_id DESC LIMIT :limit
"""
SELECT_RESOURCE_CHILD_RUN = """
SELECT uid, request_key, input_fingerprint, workflow_name, run_id, reserved_at
FROM resource_child_runs WHERE uid = :uid AND request_key = :request_key
"""
INSERT_RESOURCE_CHILD_RUN = """
INSERT INTO resource_child_runs (
    uid, request_key, input_fingerprint, workflow_name, run_id, reserved_at
) VALUES (:uid, :request_key, :input_fingerprint, :workflow_name, :run_id, :now)
"""
# A resource's child runs, with the run's status once the scheduler created it.
SELECT_RESOURCE_CHILD_RUNS = """
SELECT c.request_key, c.input_fingerprint, c.workflow_name, c.run_id, c.reserved_at,
       r.status AS run_status
FROM resource_child_runs AS c LEFT JOIN runs AS r ON r.run_id = c.run_id
WHERE c.uid = :uid ORDER BY c.reserved_at, c.request_key
"""
# The resource that reserved a run (a run view shows its parent resource).
SELECT_RUN_PARENT_RESOURCE = """
SELECT r.uid, r.manager, r.project_path, r.resource_key, c.request_key
FROM resource_child_runs AS c JOIN resources AS r ON r.uid = c.uid
WHERE c.run_id = :run_id
"""
# A resource's managed effects, in reservation order.
SELECT_RESOURCE_EFFECTS = """
SELECT effect_id, effect_type, idempotency_key, state, error, created_at, updated_at,
       settled_at
FROM effects WHERE resource_uid = :uid ORDER BY rowid
"""
# One resource-owned effect by its stored key, with its latest attempt.
SELECT_RESOURCE_EFFECT_BY_KEY = """
SELECT e.effect_id, e.resource_uid, e.effect_type, e.idempotency_key, e.request_fingerprint,
       e.state, e.result_hash, e.error,
       (SELECT max(a.attempt_number) FROM effect_attempts AS a WHERE a.effect_id = e.effect_id) AS last_attempt_number,
       (SELECT a.executor_epoch FROM effect_attempts AS a WHERE a.effect_id = e.effect_id
        ORDER BY a.attempt_number DESC LIMIT 1) AS last_executor_epoch
FROM effects AS e WHERE e.idempotency_key = :idempotency_key
"""
# Reserve a resource's effect, already applying (its first attempt is inserted with it).
INSERT_RESOURCE_EFFECT = """
INSERT INTO effects (
    effect_id, run_id, resource_uid, attempt_id, effect_type, idempotency_key,
    request_fingerprint, request_hash, idempotent, state, created_at, updated_at
) VALUES (
    :effect_id, NULL, :resource_uid, NULL, :effect_type, :idempotency_key,
    :request_fingerprint, :request_hash, 0, 'applying', :now, :now
)
"""
# Passes running now (live resource claims): the scheduler's capacity counts them.
COUNT_LIVE_RESOURCE_CLAIMS = "SELECT count(*) FROM resource_claims WHERE expires_at > :now"
# Keys due now without a live claim: whether reconciles wait for admission.
COUNT_DUE_RESOURCES = """
SELECT count(*) FROM resource_queue AS q
WHERE q.available_at <= :now
  AND NOT EXISTS (SELECT 1 FROM resource_claims AS c WHERE c.uid = q.uid AND c.expires_at > :now)
"""
