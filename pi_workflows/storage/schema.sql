-- pi-workflows-state, schema version 1.
-- Implements workflow-server.md § Durable protocol records, § Claim rules and § Run lifecycle.
-- Alpha policy: a change here changes the DDL digest in place (update DDL_DIGEST in
-- _schema.py); an installed database with another digest is refused, never migrated.
-- Every time is integer epoch milliseconds. Every JSON column holds one JSON text.
-- Every column that names a blob digest ('sha256:<hex>') references blobs(digest).

-- The schema record: one row naming the schema, its version and this file's digest.
CREATE TABLE schema_info (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    schema_name TEXT NOT NULL,
    schema_version INTEGER NOT NULL,
    ddl_digest TEXT NOT NULL,
    created_at INTEGER NOT NULL
) STRICT;

-- The server lease and epoch: one row, kept after release so the epoch only grows.
CREATE TABLE server_lease (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    epoch INTEGER NOT NULL CHECK (epoch >= 1),
    owner_id TEXT NOT NULL,
    token_hash TEXT NOT NULL,
    pid INTEGER,
    acquired_at INTEGER NOT NULL,
    heartbeat_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    released_at INTEGER
) STRICT;

-- Content-addressed blobs: immutable bytes under 'sha256:<hex>' of those bytes.
CREATE TABLE blobs (
    digest TEXT PRIMARY KEY,
    byte_length INTEGER NOT NULL CHECK (byte_length >= 0),
    content BLOB NOT NULL,
    created_at INTEGER NOT NULL
) STRICT;

-- One row per run: identity, lineage, status, pause, revision and claim generation.
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY CHECK (length(run_id) BETWEEN 1 AND 200),
    workflow_name TEXT NOT NULL,
    title TEXT,
    project_path TEXT NOT NULL,
    source_identity TEXT NOT NULL CHECK (json_valid(source_identity)),
    definition_digest TEXT NOT NULL,
    input_hash TEXT NOT NULL,
    input TEXT NOT NULL CHECK (json_valid(input)),
    status TEXT NOT NULL CHECK (status IN (
        'queued', 'running', 'waiting', 'completed', 'failed', 'timed_out', 'cancelled'
    )),
    paused INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
    revision INTEGER NOT NULL CHECK (revision >= 1),
    generation INTEGER NOT NULL DEFAULT 0 CHECK (generation >= 0),
    root_run_id TEXT NOT NULL REFERENCES runs (run_id) DEFERRABLE INITIALLY DEFERRED,
    parent_run_id TEXT REFERENCES runs (run_id) DEFERRABLE INITIALLY DEFERRED,
    restart_of TEXT REFERENCES runs (run_id) DEFERRABLE INITIALLY DEFERRED,
    continuation_of TEXT REFERENCES runs (run_id) DEFERRABLE INITIALLY DEFERRED,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    finished_at INTEGER,
    failure_class TEXT CHECK (failure_class IN (
        'claimLost', 'workerCrashed', 'runnerNoProgress', 'workerTimedOut', 'hostUnavailable',
        'sourceChanged', 'effectAmbiguous', 'nodeFailed', 'protocolRejected', 'resourceLimit'
    )),
    failure_reason TEXT,
    -- Changes shown in the run's view that append no event (a runner epoch starting, a
    -- queue move, a lineage link); kept by the triggers below. The presentation revision
    -- is revision + view_changes: both only grow, so it changes whenever the view can.
    view_changes INTEGER NOT NULL DEFAULT 0 CHECK (view_changes >= 0)
) STRICT;
-- Run list, newest first.
CREATE INDEX runs_by_created ON runs (created_at DESC, run_id DESC);
-- Status counts and recovery scans; the run list filtered by stored status, newest first.
CREATE INDEX runs_by_status ON runs (status, created_at DESC, run_id DESC);
-- The run list filtered by workflow or by project, newest first.
CREATE INDEX runs_by_workflow ON runs (workflow_name, created_at DESC, run_id DESC);
CREATE INDEX runs_by_project ON runs (project_path, created_at DESC, run_id DESC);
-- The run list filtered by display status `paused`, newest first.
CREATE INDEX runs_paused ON runs (created_at DESC, run_id DESC) WHERE paused = 1;
-- Retention: terminal runs by age, and lineage trees.
CREATE INDEX runs_by_finished ON runs (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX runs_by_root ON runs (root_run_id);
CREATE INDEX runs_by_parent ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL;
CREATE INDEX runs_by_restart ON runs (restart_of) WHERE restart_of IS NOT NULL;
CREATE INDEX runs_by_continuation ON runs (continuation_of) WHERE continuation_of IS NOT NULL;

-- The run list's revision: one row, +1 by trigger with every inserted, updated or deleted
-- run row, so it is O(1) to read, grows with every committed run change and never goes
-- back (deleting runs bumps it too).
CREATE TABLE run_list_revision (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    revision INTEGER NOT NULL CHECK (revision >= 0)
) STRICT;
INSERT INTO run_list_revision (singleton, revision) VALUES (1, 0);
CREATE TRIGGER run_list_after_insert AFTER INSERT ON runs
BEGIN
    UPDATE run_list_revision SET revision = revision + 1 WHERE singleton = 1;
END;
CREATE TRIGGER run_list_after_update AFTER UPDATE ON runs
BEGIN
    UPDATE run_list_revision SET revision = revision + 1 WHERE singleton = 1;
END;
CREATE TRIGGER run_list_after_delete AFTER DELETE ON runs
BEGIN
    UPDATE run_list_revision SET revision = revision + 1 WHERE singleton = 1;
END;
-- A run row change without an event (the claim generation) is a view change.
CREATE TRIGGER run_view_after_run_update AFTER UPDATE ON runs
WHEN NEW.revision = OLD.revision AND NEW.view_changes = OLD.view_changes
BEGIN
    UPDATE runs SET view_changes = view_changes + 1 WHERE run_id = NEW.run_id;
END;
-- A restart or continuation shows in the view of the run it came from.
CREATE TRIGGER run_view_after_lineage AFTER INSERT ON runs
WHEN NEW.restart_of IS NOT NULL OR NEW.continuation_of IS NOT NULL
BEGIN
    UPDATE runs SET view_changes = view_changes + 1
    WHERE run_id IN (NEW.restart_of, NEW.continuation_of);
END;

-- The queue projection of every run; 'kind' lets the scheduler alternate admissions.
CREATE TABLE run_queue (
    run_id TEXT PRIMARY KEY REFERENCES runs (run_id) ON DELETE CASCADE,
    state TEXT NOT NULL CHECK (state IN (
        'queued', 'starting', 'running', 'parked', 'done', 'failed', 'cancelled'
    )),
    kind TEXT NOT NULL CHECK (kind IN ('workflow', 'resource')),
    priority INTEGER NOT NULL DEFAULT 0,
    enqueued_at INTEGER NOT NULL,
    park_reason TEXT,
    updated_at INTEGER NOT NULL
) STRICT;
-- Admission order: higher priority first, then oldest, per kind.
CREATE INDEX run_queue_admission ON run_queue (kind, priority DESC, enqueued_at, run_id)
    WHERE state = 'queued';
-- Capacity and recovery: runs that hold or are taking a runner.
CREATE INDEX run_queue_active ON run_queue (state) WHERE state IN ('starting', 'running');

-- Live run claims. Release deletes the row; the generation counter lives on runs.
-- WITHOUT ROWID and no index on the expiry, so a renewal rewrites one page.
CREATE TABLE leases (
    resource TEXT PRIMARY KEY REFERENCES runs (run_id) ON DELETE CASCADE,
    owner_type TEXT NOT NULL CHECK (length(owner_type) BETWEEN 1 AND 64),
    owner_id TEXT NOT NULL CHECK (length(owner_id) BETWEEN 1 AND 200),
    token_hash TEXT NOT NULL,
    generation INTEGER NOT NULL CHECK (generation >= 1),
    acquired_at INTEGER NOT NULL,
    heartbeat_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    CHECK (acquired_at <= heartbeat_at AND heartbeat_at < expires_at)
) STRICT, WITHOUT ROWID;
-- Timer renewal of every claim of one owner.
CREATE INDEX leases_by_owner ON leases (owner_type, owner_id);

-- The immutable, gap-free event log of each run; revision N is the run's Nth change.
-- Keyed by (run_id, revision) WITHOUT ROWID: one b-tree, appends stay local per run.
-- Large values go to blobs by reference, so event rows stay small.
CREATE TABLE events (
    run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    revision INTEGER NOT NULL CHECK (revision >= 1),
    event_type TEXT NOT NULL,
    generation INTEGER NOT NULL,
    payload TEXT NOT NULL CHECK (json_valid(payload)),
    recorded_at INTEGER NOT NULL,
    PRIMARY KEY (run_id, revision)
) STRICT, WITHOUT ROWID;
CREATE TRIGGER events_are_immutable BEFORE UPDATE ON events
BEGIN
    SELECT RAISE(ABORT, 'events are immutable');
END;

-- Node execution: one row per attempt; the unfinished attempt names the current node.
CREATE TABLE node_attempts (
    attempt_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    node_path TEXT NOT NULL,
    node_type TEXT NOT NULL,
    visit INTEGER NOT NULL CHECK (visit >= 1),
    generation INTEGER NOT NULL,
    status TEXT NOT NULL CHECK (status IN (
        'running', 'waiting', 'completed', 'failed', 'timed_out', 'cancelled', 'interrupted'
    )),
    started_at INTEGER NOT NULL,
    deadline_at INTEGER,
    finished_at INTEGER,
    output_hash TEXT REFERENCES blobs (digest),
    error TEXT,
    -- The node the runner routed to when this attempt finished (NULL: none, or the end).
    next_node_path TEXT,
    CHECK ((finished_at IS NULL) = (status IN ('running', 'waiting'))),
    CHECK (next_node_path IS NULL OR status IN ('completed', 'failed', 'timed_out'))
) STRICT;
CREATE INDEX node_attempts_by_node ON node_attempts (run_id, node_path, visit);
-- Trace pages: one run's attempts in start (rowid) order, counted and read by range.
CREATE INDEX node_attempts_by_run ON node_attempts (run_id);
-- At most one unfinished attempt per run (a run executes one node at a time).
CREATE UNIQUE INDEX node_attempts_one_unfinished ON node_attempts (run_id)
    WHERE status IN ('running', 'waiting');
CREATE INDEX node_attempts_by_output ON node_attempts (output_hash)
    WHERE output_hash IS NOT NULL;

-- Checkpoints and protected human decisions; the request JSON is a blob.
CREATE TABLE human_decisions (
    decision_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    attempt_id TEXT REFERENCES node_attempts (attempt_id) ON DELETE CASCADE,
    node_path TEXT NOT NULL,
    audience TEXT NOT NULL,
    request_digest TEXT NOT NULL,
    request_hash TEXT NOT NULL REFERENCES blobs (digest),
    revision INTEGER NOT NULL DEFAULT 1 CHECK (revision >= 1),
    status TEXT NOT NULL CHECK (status IN ('pending', 'accepted', 'cancelled')),
    expires_at INTEGER,
    default_response_hash TEXT REFERENCES blobs (digest),
    continuation_run_id TEXT REFERENCES runs (run_id) DEFERRABLE INITIALLY DEFERRED,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
) STRICT;
CREATE INDEX human_decisions_by_run ON human_decisions (run_id, status);
CREATE INDEX human_decisions_by_attempt ON human_decisions (attempt_id)
    WHERE attempt_id IS NOT NULL;
CREATE INDEX human_decisions_by_request ON human_decisions (request_hash);
CREATE INDEX human_decisions_by_default ON human_decisions (default_response_hash)
    WHERE default_response_hash IS NOT NULL;
CREATE UNIQUE INDEX human_decisions_by_continuation ON human_decisions (continuation_run_id)
    WHERE continuation_run_id IS NOT NULL;
-- Pending deadlines for the timeout path.
CREATE INDEX human_decisions_by_expiry ON human_decisions (expires_at)
    WHERE status = 'pending' AND expires_at IS NOT NULL;

-- The single atomic fence of a decision: exactly one resolution, accepted or cancelled.
CREATE TABLE human_decision_resolutions (
    decision_id TEXT PRIMARY KEY REFERENCES human_decisions (decision_id) ON DELETE CASCADE,
    outcome TEXT NOT NULL CHECK (outcome IN ('accepted', 'cancelled')),
    provenance TEXT CHECK (provenance IN ('human', 'timeout')),
    response_hash TEXT REFERENCES blobs (digest),
    answer_digest TEXT,
    idempotency_key TEXT,
    source_channel TEXT,
    cancel_reason TEXT,
    resolved_at INTEGER NOT NULL,
    CHECK ((outcome = 'accepted') = (provenance IS NOT NULL AND response_hash IS NOT NULL))
) STRICT;
CREATE INDEX human_decision_resolutions_by_response ON human_decision_resolutions (response_hash)
    WHERE response_hash IS NOT NULL;

-- Every answer attempt per idempotency key, so a retry adopts its stored outcome.
CREATE TABLE human_decision_answers (
    decision_id TEXT NOT NULL REFERENCES human_decisions (decision_id) ON DELETE CASCADE,
    idempotency_key TEXT NOT NULL,
    answer_digest TEXT NOT NULL,
    source_channel TEXT NOT NULL,
    outcome TEXT NOT NULL CHECK (outcome IN ('accepted', 'rejected', 'conflict')),
    submitted_at INTEGER NOT NULL,
    PRIMARY KEY (decision_id, idempotency_key)
) STRICT;

-- Managed side effects, reserved before execution and settled after. Owned by a run
-- (`run_id`) or by a resource manager's resource (`resource_uid`), never both.
CREATE TABLE effects (
    effect_id TEXT PRIMARY KEY,
    run_id TEXT REFERENCES runs (run_id) ON DELETE CASCADE,
    resource_uid TEXT REFERENCES resources (uid) ON DELETE CASCADE,
    attempt_id TEXT REFERENCES node_attempts (attempt_id) ON DELETE CASCADE,
    effect_type TEXT NOT NULL,
    idempotency_key TEXT NOT NULL UNIQUE,
    request_fingerprint TEXT NOT NULL,
    request_hash TEXT REFERENCES blobs (digest),
    -- 1: the external system deduplicates by the key, so an interrupted apply is
    -- applied again with the same key (a new attempt) instead of becoming ambiguous.
    idempotent INTEGER NOT NULL DEFAULT 0 CHECK (idempotent IN (0, 1)),
    state TEXT NOT NULL CHECK (state IN (
        'pending', 'applying', 'applied', 'rejected', 'cancelled', 'ambiguous'
    )),
    result_hash TEXT REFERENCES blobs (digest),
    error TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    settled_at INTEGER,
    CHECK ((settled_at IS NULL) = (state IN ('pending', 'applying'))),
    CHECK ((run_id IS NULL) <> (resource_uid IS NULL))
) STRICT;
CREATE INDEX effects_by_run ON effects (run_id, state);
CREATE INDEX effects_by_resource ON effects (resource_uid, state)
    WHERE resource_uid IS NOT NULL;
-- The runs with an ambiguous effect (the run list's `ambiguous` filter).
CREATE INDEX effects_ambiguous ON effects (run_id) WHERE state = 'ambiguous';
CREATE INDEX effects_by_attempt ON effects (attempt_id) WHERE attempt_id IS NOT NULL;
CREATE INDEX effects_by_request ON effects (request_hash) WHERE request_hash IS NOT NULL;
CREATE INDEX effects_by_result ON effects (result_hash) WHERE result_hash IS NOT NULL;

-- Numbered execution attempts of one effect; at most one in flight, at most one applied.
-- `interrupted`: an idempotent effect's attempt that stopped mid-apply and was followed
-- by another attempt with the same key. `recovery`: an operator's reviewed decision on an
-- ambiguous attempt (`confirmed`: it applied; `retried`: another attempt follows).
CREATE TABLE effect_attempts (
    effect_id TEXT NOT NULL REFERENCES effects (effect_id) ON DELETE CASCADE,
    attempt_number INTEGER NOT NULL CHECK (attempt_number >= 1),
    executor_epoch TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN (
        'applying', 'applied', 'rejected', 'cancelled', 'ambiguous', 'interrupted'
    )),
    started_at INTEGER NOT NULL,
    finished_at INTEGER,
    result_hash TEXT REFERENCES blobs (digest),
    error TEXT,
    recovery TEXT CHECK (recovery IN ('confirmed', 'retried')),
    PRIMARY KEY (effect_id, attempt_number),
    CHECK ((finished_at IS NULL) = (state = 'applying')),
    CHECK (recovery IS NULL
        OR (recovery = 'confirmed' AND state = 'applied')
        OR (recovery = 'retried' AND state = 'ambiguous'))
) STRICT;
CREATE UNIQUE INDEX effect_attempts_one_applying ON effect_attempts (effect_id)
    WHERE state = 'applying';
CREATE UNIQUE INDEX effect_attempts_one_applied ON effect_attempts (effect_id)
    WHERE state = 'applied';
CREATE INDEX effect_attempts_by_result ON effect_attempts (result_hash)
    WHERE result_hash IS NOT NULL;

-- How a run executes and which origin Pi session it reserves while nonterminal.
CREATE TABLE run_bindings (
    run_id TEXT PRIMARY KEY REFERENCES runs (run_id) ON DELETE CASCADE,
    execution_mode TEXT NOT NULL CHECK (execution_mode IN ('interactive', 'headless')),
    origin_session_id TEXT,
    reserved INTEGER NOT NULL CHECK (reserved IN (0, 1)),
    created_at INTEGER NOT NULL,
    released_at INTEGER,
    -- `sessionView.clearTerminal`: the session view no longer retains this terminal run.
    terminal_cleared_at INTEGER,
    CHECK ((execution_mode = 'interactive') = (origin_session_id IS NOT NULL)),
    CHECK (reserved = 0 OR execution_mode = 'interactive')
) STRICT;
-- One origin session holds at most one reservation.
CREATE UNIQUE INDEX run_bindings_one_reservation ON run_bindings (origin_session_id)
    WHERE reserved = 1;
CREATE INDEX run_bindings_by_session ON run_bindings (origin_session_id)
    WHERE origin_session_id IS NOT NULL;

-- Command receipts. The request ID is transport identity and not in the fingerprint.
-- The receipt is the canonical JSON of the response body, inline (never shared).
CREATE TABLE host_commands (
    request_id TEXT PRIMARY KEY,
    client_id TEXT NOT NULL,
    operation TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    run_id TEXT,
    accepted_revision INTEGER,
    outcome TEXT NOT NULL CHECK (outcome IN ('accepted', 'rejected')),
    receipt BLOB NOT NULL,
    created_at INTEGER NOT NULL,
    UNIQUE (client_id, idempotency_key)
) STRICT;
CREATE INDEX host_commands_by_run ON host_commands (run_id) WHERE run_id IS NOT NULL;

-- Durable requests for agent, assistant, checkpoint and decision steps; one per attempt.
CREATE TABLE interactive_requests (
    request_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    attempt_id TEXT NOT NULL UNIQUE REFERENCES node_attempts (attempt_id) ON DELETE CASCADE,
    target_session_id TEXT,
    kind TEXT NOT NULL CHECK (kind IN ('agent', 'assistant', 'checkpoint', 'decision')),
    contract_hash TEXT NOT NULL REFERENCES blobs (digest),
    revision INTEGER NOT NULL DEFAULT 1 CHECK (revision >= 1),
    status TEXT NOT NULL CHECK (status IN ('pending', 'settled', 'cancelled')),
    accepted_submission_id TEXT,
    unproductive_turn_ends INTEGER NOT NULL DEFAULT 0 CHECK (unproductive_turn_ends >= 0),
    -- The last unproductive turn's reason (a provider error, bounded) for the run view.
    last_turn_error TEXT CHECK (last_turn_error IS NULL OR length(last_turn_error) <= 2048),
    -- The node timeout runs only during reported model turns of a connected active
    -- session: active_ms is the time used so far, active_since the start of the running
    -- span (NULL: suspended). The budget is the attempt's deadline_at - started_at.
    active_ms INTEGER NOT NULL DEFAULT 0 CHECK (active_ms >= 0),
    active_since INTEGER,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    settled_at INTEGER,
    CHECK ((settled_at IS NULL) = (status = 'pending'))
) STRICT;
CREATE INDEX interactive_requests_by_run ON interactive_requests (run_id, status);
CREATE INDEX interactive_requests_by_contract ON interactive_requests (contract_hash);
-- The deadline timer's scan: pending requests only.
CREATE INDEX interactive_requests_pending ON interactive_requests (active_since)
    WHERE status = 'pending';

-- Submissions against one interactive request; repeated keys return the same receipt.
CREATE TABLE interactive_submissions (
    submission_id TEXT PRIMARY KEY,
    request_id TEXT NOT NULL REFERENCES interactive_requests (request_id) ON DELETE CASCADE,
    idempotency_key TEXT NOT NULL,
    request_revision INTEGER NOT NULL,
    payload_hash TEXT NOT NULL REFERENCES blobs (digest),
    outcome TEXT NOT NULL CHECK (outcome IN ('validating', 'accepted', 'rejected')),
    receipt_hash TEXT REFERENCES blobs (digest),
    submitted_at INTEGER NOT NULL,
    settled_at INTEGER,
    UNIQUE (request_id, idempotency_key)
) STRICT;
CREATE UNIQUE INDEX interactive_submissions_one_validating ON interactive_submissions (request_id)
    WHERE outcome = 'validating';
CREATE UNIQUE INDEX interactive_submissions_one_accepted ON interactive_submissions (request_id)
    WHERE outcome = 'accepted';
CREATE INDEX interactive_submissions_by_payload ON interactive_submissions (payload_hash);
CREATE INDEX interactive_submissions_by_receipt ON interactive_submissions (receipt_hash)
    WHERE receipt_hash IS NOT NULL;

-- Content Pi must add to an origin conversation, in session order.
CREATE TABLE workflow_messages (
    message_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    target_session_id TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN (
        'step', 'decision', 'notification', 'terminal', 'follow_up'
    )),
    reason TEXT CHECK (reason IN ('initial', 'reminder', 'resumed')),
    source_id TEXT NOT NULL,
    content_digest TEXT NOT NULL,
    session_order INTEGER NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'sent', 'cancelled')),
    pi_entry_id TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    CHECK ((kind = 'step') = (reason IS NOT NULL)),
    UNIQUE (target_session_id, session_order)
) STRICT;
-- At most one pending step message per interactive request (source_id is the request ID).
CREATE UNIQUE INDEX workflow_messages_one_pending_step ON workflow_messages (source_id)
    WHERE kind = 'step' AND state = 'pending';
CREATE INDEX workflow_messages_by_run ON workflow_messages (run_id, state);
CREATE INDEX workflow_messages_by_source ON workflow_messages (source_id);

-- Model turns of origin sessions as their coordinator reported them (workflowTurn.report).
CREATE TABLE workflow_turns (
    turn_id TEXT PRIMARY KEY,
    message_id TEXT NOT NULL REFERENCES workflow_messages (message_id) ON DELETE CASCADE,
    run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    session_id TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('open', 'completed', 'aborted', 'error', 'lost')),
    response_entry_id TEXT,
    started_at INTEGER NOT NULL,
    ended_at INTEGER,
    CHECK ((ended_at IS NULL) = (status = 'open'))
) STRICT;
-- Pi runs one model turn at a time: at most one open turn per origin session.
CREATE UNIQUE INDEX workflow_turns_one_open ON workflow_turns (session_id)
    WHERE status = 'open';
CREATE INDEX workflow_turns_by_message ON workflow_turns (message_id);
CREATE INDEX workflow_turns_by_run ON workflow_turns (run_id, status);

-- The session record (sessionEvents.record): what happened in the origin Pi session during
-- one workflow turn, as its coordinator reported it. One recording segment per turn, tied
-- to the run, the message and the turn; `recording` until the extension reports the
-- capture finished (`complete`) or the turn is proved lost (`failed`). Integrity
-- findings are counted on the segment, never raised: `missing` sequence numbers (and
-- the `gaps` they came in), a final `expected_count` that is not `event_count`,
-- resends with other content (`conflicts`), and events too large to keep whole.
CREATE TABLE session_segments (
    segment_id INTEGER PRIMARY KEY,
    turn_id TEXT NOT NULL UNIQUE REFERENCES workflow_turns (turn_id) ON DELETE CASCADE,
    run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    message_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('recording', 'complete', 'failed')),
    failure TEXT CHECK (failure IS NULL OR length(failure) <= 64),
    event_count INTEGER NOT NULL DEFAULT 0 CHECK (event_count >= 0),
    next_seq INTEGER NOT NULL DEFAULT 0 CHECK (next_seq >= 0),
    gaps INTEGER NOT NULL DEFAULT 0 CHECK (gaps >= 0),
    missing INTEGER NOT NULL DEFAULT 0 CHECK (missing >= 0),
    expected_count INTEGER CHECK (expected_count IS NULL OR expected_count >= 0),
    conflicts INTEGER NOT NULL DEFAULT 0 CHECK (conflicts >= 0),
    oversized INTEGER NOT NULL DEFAULT 0 CHECK (oversized >= 0),
    started_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    CHECK ((status = 'failed') = (failure IS NOT NULL))
) STRICT;
CREATE INDEX session_segments_by_run ON session_segments (run_id, segment_id);
CREATE INDEX session_segments_recording ON session_segments (run_id) WHERE status = 'recording';
-- Only a proved interruption fails a capture (`turnLost`): a turn closed `lost` by an idle
-- branch report or a newer start (storage `end_turn`), or a capture still recording when
-- its session's Pi reports idle with its turn no longer open (`fail_orphaned_captures`).
-- A run's end or handover closes its open turns `lost` but leaves their captures open
-- until the Pi turn ends (a normal runner continuation fails nothing).

-- The session events of a run in recording order: `position` counts them from 0 across
-- the run's segments (pages are positions), `seq` is the extension's sequence number in
-- its turn (the idempotency key). Payloads are bounded like resource events; a finished
-- message's verbatim Pi entry lives in `session_entries`.
CREATE TABLE session_events (
    run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    position INTEGER NOT NULL CHECK (position >= 0),
    segment_id INTEGER NOT NULL REFERENCES session_segments (segment_id) ON DELETE CASCADE,
    seq INTEGER NOT NULL CHECK (seq >= 0),
    event_type TEXT NOT NULL,
    payload TEXT NOT NULL CHECK (json_valid(payload) AND length(CAST(payload AS BLOB)) <= 65536),
    recorded_at INTEGER NOT NULL,
    PRIMARY KEY (run_id, position)
) STRICT, WITHOUT ROWID;
CREATE UNIQUE INDEX session_events_by_seq ON session_events (segment_id, seq);
CREATE TRIGGER session_events_are_immutable BEFORE UPDATE ON session_events
BEGIN
    SELECT RAISE(ABORT, 'session events are immutable');
END;

-- Finished messages with their Pi entry ID and, when reported, the verbatim message (a
-- JSON blob): a settled message shows the entry instead of its folded deltas.
CREATE TABLE session_entries (
    segment_id INTEGER NOT NULL REFERENCES session_segments (segment_id) ON DELETE CASCADE,
    entry_id TEXT NOT NULL,
    run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    role TEXT,
    content_hash TEXT REFERENCES blobs (digest),
    recorded_at INTEGER NOT NULL,
    PRIMARY KEY (segment_id, entry_id)
) STRICT;
CREATE INDEX session_entries_by_run ON session_entries (run_id, position);
CREATE INDEX session_entries_by_content ON session_entries (content_hash)
    WHERE content_hash IS NOT NULL;

-- Session-event pages, cut when recorded (at most 256 events and a byte budget each), so
-- a page's first position never moves; each holds the replay checkpoint before its first
-- event: the folded conversation, inline JSON or, when large, a JSON blob (also copied to
-- the run's view content so a page can reference it).
CREATE TABLE session_pages (
    run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    page_index INTEGER NOT NULL CHECK (page_index >= 0),
    first_position INTEGER NOT NULL CHECK (first_position >= 0),
    item_count INTEGER NOT NULL DEFAULT 0 CHECK (item_count >= 0),
    byte_count INTEGER NOT NULL DEFAULT 0 CHECK (byte_count >= 0),
    checkpoint TEXT CHECK (checkpoint IS NULL OR json_valid(checkpoint)),
    checkpoint_hash TEXT REFERENCES blobs (digest),
    CHECK ((checkpoint IS NULL) != (checkpoint_hash IS NULL)),
    PRIMARY KEY (run_id, page_index),
    UNIQUE (run_id, first_position)
) STRICT, WITHOUT ROWID;
CREATE INDEX session_pages_by_checkpoint ON session_pages (checkpoint_hash)
    WHERE checkpoint_hash IS NOT NULL;

-- Follow-ups (`followUp.add`): text for the origin session, delivered as `follow_up`
-- workflow messages, in order, after the continuation chain's final completed outcome,
-- its terminal turn, earlier follow-ups and the release of the reservation. `chain_run_id`
-- is the chain's first run; the text is a blob. Failure and cancellation cancel them.
CREATE TABLE follow_ups (
    follow_up_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    chain_run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    target_session_id TEXT NOT NULL,
    content_hash TEXT NOT NULL REFERENCES blobs (digest),
    state TEXT NOT NULL CHECK (state IN ('pending', 'presented', 'cancelled')),
    message_id TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    CHECK ((state = 'presented') = (message_id IS NOT NULL))
) STRICT;
CREATE INDEX follow_ups_by_chain ON follow_ups (chain_run_id, state, created_at);
CREATE INDEX follow_ups_by_run ON follow_ups (run_id);
CREATE INDEX follow_ups_by_content ON follow_ups (content_hash);

-- Runner epochs: several per run and generation over time, at most one active.
CREATE TABLE runner_epochs (
    runner_epoch TEXT PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    generation INTEGER NOT NULL CHECK (generation >= 1),
    launch_envelope_hash TEXT NOT NULL,
    pid INTEGER,
    process_start_time INTEGER,
    status TEXT NOT NULL CHECK (status IN (
        'starting', 'ready', 'exited', 'cancelled', 'timedOut', 'crashed', 'claimLost', 'orphaned'
    )),
    started_at INTEGER NOT NULL,
    ready_at INTEGER,
    ready_revision INTEGER,
    finished_at INTEGER,
    exit_code INTEGER,
    signal INTEGER,
    diagnostic_hash TEXT REFERENCES blobs (digest),
    CHECK ((finished_at IS NULL) = (status IN ('starting', 'ready')))
) STRICT;
CREATE UNIQUE INDEX runner_epochs_one_active ON runner_epochs (run_id)
    WHERE status IN ('starting', 'ready');
CREATE INDEX runner_epochs_by_run ON runner_epochs (run_id, generation);
CREATE INDEX runner_epochs_by_diagnostic ON runner_epochs (diagnostic_hash)
    WHERE diagnostic_hash IS NOT NULL;

-- Replies to accepted runner messages, so a retried message receives the same answer.
-- The fingerprint is the digest of the canonical message; the reply is its canonical
-- JSON, inline (a bounded frame: a large result is a blob the reply names).
-- Deleted when its runner epoch ends (`record_runner_exit`): the runner host refuses
-- every frame of an ended epoch before the database, so no one can ask for it again.
CREATE TABLE runner_messages (
    runner_epoch TEXT NOT NULL REFERENCES runner_epochs (runner_epoch) ON DELETE CASCADE,
    message_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    reply BLOB NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (runner_epoch, message_id)
) STRICT, WITHOUT ROWID;

-- Generated view content, readable only under its exact run, digest and media type.
CREATE TABLE run_view_content (
    run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    digest TEXT NOT NULL,
    media_type TEXT NOT NULL,
    byte_length INTEGER NOT NULL CHECK (byte_length >= 0),
    content BLOB NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (run_id, digest, media_type)
) STRICT;

-- Delivery and settlement of one decision on one external channel ('telegram:<profile>').
CREATE TABLE channel_messages (
    decision_id TEXT NOT NULL REFERENCES human_decisions (decision_id) ON DELETE CASCADE,
    channel TEXT NOT NULL,
    channel_revision INTEGER NOT NULL DEFAULT 1 CHECK (channel_revision >= 1),
    adapter_epoch TEXT,
    delivery_state TEXT NOT NULL CHECK (delivery_state IN (
        'pending', 'presenting', 'presented', 'failed', 'ambiguous'
    )),
    settlement_state TEXT NOT NULL CHECK (settlement_state IN (
        'none', 'pending', 'settling', 'settled', 'failed', 'ambiguous'
    )),
    delivery_effect_id TEXT REFERENCES effects (effect_id),
    settlement_effect_id TEXT REFERENCES effects (effect_id),
    -- An attempt the adapter did not send ('notSent': nothing reached the Bot API, or
    -- it answered 429 or 5xx): the next one waits until retry_at. retry_since is when
    -- the first not-sent attempt of this streak ended (the retry bound counts from it);
    -- retry_reason is the last one's reason ('rateLimited' holds the whole chat).
    retry_at INTEGER,
    retry_since INTEGER,
    retry_reason TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (decision_id, channel)
) STRICT;
CREATE INDEX channel_messages_by_delivery_effect ON channel_messages (delivery_effect_id)
    WHERE delivery_effect_id IS NOT NULL;
CREATE INDEX channel_messages_by_settlement_effect ON channel_messages (settlement_effect_id)
    WHERE settlement_effect_id IS NOT NULL;

-- Every process the server must be able to stop after its own crash: each runner (recorded
-- right after it is spawned) and each process group a runner registered (a shell command,
-- later a headless Pi child). Known by exact identity: PID, kernel start ticks, boot ID.
-- Rows leave when the process is unregistered or stopped; recovery stops and deletes the rest.
CREATE TABLE runner_processes (
    runner_epoch TEXT NOT NULL REFERENCES runner_epochs (runner_epoch) ON DELETE CASCADE,
    pid INTEGER NOT NULL CHECK (pid > 0),
    start_ticks INTEGER NOT NULL,
    boot_id TEXT NOT NULL,
    role TEXT NOT NULL CHECK (role IN ('runner', 'registered')),
    recorded_at INTEGER NOT NULL,
    PRIMARY KEY (runner_epoch, pid)
) STRICT, WITHOUT ROWID;

-- Every table whose rows show in a run's view bumps that run's view_changes when a row
-- is inserted or updated (rows leave only with their run). Events need none: each one
-- comes with a revision. The queue row and the binding are inserted with their run, so
-- only their updates count.
CREATE TRIGGER run_view_after_run_queue_update AFTER UPDATE ON run_queue
BEGIN
    UPDATE runs SET view_changes = view_changes + 1 WHERE run_id = NEW.run_id;
END;
CREATE TRIGGER run_view_after_node_attempts_insert AFTER INSERT ON node_attempts
BEGIN
    UPDATE runs SET view_changes = view_changes + 1 WHERE run_id = NEW.run_id;
END;
CREATE TRIGGER run_view_after_node_attempts_update AFTER UPDATE ON node_attempts
BEGIN
    UPDATE runs SET view_changes = view_changes + 1 WHERE run_id = NEW.run_id;
END;
CREATE TRIGGER run_view_after_human_decisions_insert AFTER INSERT ON human_decisions
BEGIN
    UPDATE runs SET view_changes = view_changes + 1 WHERE run_id = NEW.run_id;
END;
CREATE TRIGGER run_view_after_human_decisions_update AFTER UPDATE ON human_decisions
BEGIN
    UPDATE runs SET view_changes = view_changes + 1 WHERE run_id = NEW.run_id;
END;
CREATE TRIGGER run_view_after_effects_insert AFTER INSERT ON effects
BEGIN
    UPDATE runs SET view_changes = view_changes + 1 WHERE run_id = NEW.run_id;
END;
CREATE TRIGGER run_view_after_effects_update AFTER UPDATE ON effects
BEGIN
    UPDATE runs SET view_changes = view_changes + 1 WHERE run_id = NEW.run_id;
END;
CREATE TRIGGER run_view_after_run_bindings_update AFTER UPDATE ON run_bindings
BEGIN
    UPDATE runs SET view_changes = view_changes + 1 WHERE run_id = NEW.run_id;
END;
CREATE TRIGGER run_view_after_interactive_requests_insert AFTER INSERT ON interactive_requests
BEGIN
    UPDATE runs SET view_changes = view_changes + 1 WHERE run_id = NEW.run_id;
END;
CREATE TRIGGER run_view_after_interactive_requests_update AFTER UPDATE ON interactive_requests
BEGIN
    UPDATE runs SET view_changes = view_changes + 1 WHERE run_id = NEW.run_id;
END;
CREATE TRIGGER run_view_after_runner_epochs_insert AFTER INSERT ON runner_epochs
BEGIN
    UPDATE runs SET view_changes = view_changes + 1 WHERE run_id = NEW.run_id;
END;
CREATE TRIGGER run_view_after_runner_epochs_update AFTER UPDATE ON runner_epochs
BEGIN
    UPDATE runs SET view_changes = view_changes + 1 WHERE run_id = NEW.run_id;
END;
CREATE TRIGGER run_view_after_session_segments_insert AFTER INSERT ON session_segments
BEGIN
    UPDATE runs SET view_changes = view_changes + 1 WHERE run_id = NEW.run_id;
END;
CREATE TRIGGER run_view_after_session_segments_update AFTER UPDATE ON session_segments
BEGIN
    UPDATE runs SET view_changes = view_changes + 1 WHERE run_id = NEW.run_id;
END;
CREATE TRIGGER run_view_after_run_view_content_insert AFTER INSERT ON run_view_content
BEGIN
    UPDATE runs SET view_changes = view_changes + 1 WHERE run_id = NEW.run_id;
END;

-- Resource managers (resource-managers.md): durable resources, their reconcile queue,
-- claims, structured pass history and child-run reservations. The resource row is the
-- source of truth; the queue only describes delivery and can be rebuilt from it.

-- One resource per (manager, project, key). `resource_version` changes on every write
-- (the compare-and-swap token of a pass); `generation` only when the spec changes.
-- `claim_generation` is the fencing counter of resource claims, so it only grows.
CREATE TABLE resources (
    uid TEXT PRIMARY KEY CHECK (length(uid) BETWEEN 1 AND 200),
    manager TEXT NOT NULL CHECK (length(manager) BETWEEN 1 AND 200),
    project_path TEXT NOT NULL,
    resource_key TEXT NOT NULL CHECK (length(resource_key) BETWEEN 1 AND 512),
    resource_version INTEGER NOT NULL CHECK (resource_version >= 1),
    generation INTEGER NOT NULL CHECK (generation >= 1),
    claim_generation INTEGER NOT NULL DEFAULT 0 CHECK (claim_generation >= 0),
    spec TEXT NOT NULL CHECK (json_valid(spec) AND length(CAST(spec AS BLOB)) <= 1048576),
    spec_digest TEXT NOT NULL,
    status TEXT NOT NULL
        CHECK (json_valid(status) AND length(CAST(status AS BLOB)) <= 1048576),
    observed_generation INTEGER NOT NULL DEFAULT 0 CHECK (observed_generation >= 0),
    conditions TEXT NOT NULL DEFAULT '[]'
        CHECK (json_valid(conditions) AND length(CAST(conditions AS BLOB)) <= 1048576),
    finalizers TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(finalizers)),
    deletion_requested_at INTEGER,
    source_identity TEXT NOT NULL CHECK (json_valid(source_identity)),
    source_digest TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    CHECK (observed_generation <= generation),
    UNIQUE (manager, project_path, resource_key)
) STRICT;
CREATE INDEX resources_by_project ON resources (project_path, manager, resource_key);

-- The immutable, gap-free change log of each resource: version N is its Nth write.
CREATE TABLE resource_events (
    uid TEXT NOT NULL REFERENCES resources (uid) ON DELETE CASCADE,
    resource_version INTEGER NOT NULL CHECK (resource_version >= 1),
    event_type TEXT NOT NULL,
    payload TEXT NOT NULL CHECK (json_valid(payload) AND length(CAST(payload AS BLOB)) <= 65536),
    recorded_at INTEGER NOT NULL,
    PRIMARY KEY (uid, resource_version)
) STRICT, WITHOUT ROWID;
CREATE TRIGGER resource_events_are_immutable BEFORE UPDATE ON resource_events
BEGIN
    SELECT RAISE(ABORT, 'resource events are immutable');
END;

-- The reconcile queue: at most one row per resource. Enqueues update it (`hints` counts
-- them, so a pass can tell that a wake-up arrived while it ran); `retries` counts the
-- consecutive failed passes behind the backoff.
CREATE TABLE resource_queue (
    uid TEXT PRIMARY KEY REFERENCES resources (uid) ON DELETE CASCADE,
    available_at INTEGER NOT NULL,
    retries INTEGER NOT NULL DEFAULT 0 CHECK (retries >= 0),
    reason TEXT NOT NULL CHECK (length(reason) BETWEEN 1 AND 200),
    hints INTEGER NOT NULL DEFAULT 1 CHECK (hints >= 1),
    enqueued_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
) STRICT;
-- The scheduler's next due key.
CREATE INDEX resource_queue_due ON resource_queue (available_at, enqueued_at, uid);

-- Live resource claims, on the lease rules of run claims (owner, token hash, generation,
-- expiry). Release deletes the row. `resource_version` is what the pass read (the CAS
-- token of its commit); `hints` the queue's hint count when it was claimed.
CREATE TABLE resource_claims (
    uid TEXT PRIMARY KEY REFERENCES resources (uid) ON DELETE CASCADE,
    owner_type TEXT NOT NULL CHECK (length(owner_type) BETWEEN 1 AND 64),
    owner_id TEXT NOT NULL CHECK (length(owner_id) BETWEEN 1 AND 200),
    token_hash TEXT NOT NULL,
    generation INTEGER NOT NULL CHECK (generation >= 1),
    reconcile_id TEXT NOT NULL,
    resource_version INTEGER NOT NULL CHECK (resource_version >= 1),
    hints INTEGER NOT NULL CHECK (hints >= 0),
    acquired_at INTEGER NOT NULL,
    heartbeat_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    CHECK (acquired_at <= heartbeat_at AND heartbeat_at < expires_at)
) STRICT, WITHOUT ROWID;
CREATE INDEX resource_claims_by_owner ON resource_claims (owner_type, owner_id);

-- One structured record per committed pass; the newest 50 per resource are kept.
CREATE TABLE reconcile_history (
    history_id INTEGER PRIMARY KEY,
    uid TEXT NOT NULL REFERENCES resources (uid) ON DELETE CASCADE,
    reconcile_id TEXT NOT NULL,
    generation INTEGER NOT NULL CHECK (generation >= 1),
    outcome TEXT NOT NULL CHECK (outcome IN ('settled', 'requeue', 'requeueAfter', 'error')),
    requeue_reason TEXT CHECK (requeue_reason IS NULL OR length(requeue_reason) <= 200),
    error_class TEXT CHECK (error_class IS NULL OR length(error_class) <= 200),
    started_at INTEGER NOT NULL,
    duration_ms INTEGER NOT NULL CHECK (duration_ms >= 0),
    recorded_at INTEGER NOT NULL
) STRICT;
CREATE INDEX reconcile_history_by_resource ON reconcile_history (uid, history_id);

-- Child runs a resource's passes reserved (`ctx.workflows.ensure`): one run ID per
-- (resource, request key), with the fingerprint of the input it was reserved for. The
-- run row may not exist yet (the scheduler creates it); retention keeps the run while
-- this row does.
CREATE TABLE resource_child_runs (
    uid TEXT NOT NULL REFERENCES resources (uid) ON DELETE CASCADE,
    request_key TEXT NOT NULL CHECK (length(request_key) BETWEEN 1 AND 512),
    input_fingerprint TEXT NOT NULL,
    workflow_name TEXT NOT NULL,
    run_id TEXT NOT NULL UNIQUE,
    reserved_at INTEGER NOT NULL,
    PRIMARY KEY (uid, request_key)
) STRICT, WITHOUT ROWID;
