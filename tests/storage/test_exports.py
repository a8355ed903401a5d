"""The public surface of `pi_workflows.storage`, pinned: the server daemon builds on it."""

from __future__ import annotations

import importlib
import pkgutil

import pi_workflows.storage as storage

PINNED = {
    # opening, transactions, time, paths
    "open_database", "open_readonly", "open_live_reader", "Database", "Tx", "Reader", "Params",
    "Tracer", "GroupCommit", "GroupLostError",
    "DEFAULT_BUSY_TIMEOUT_MS", "Clock", "SystemClock", "ManualClock",
    "AGENT_DIR_ENV", "agent_dir", "workflows_dir", "state_db_path", "ensure_private_dir",
    "SCHEMA_NAME", "SCHEMA_VERSION", "DDL_DIGEST",
    # errors
    "StorageError", "SchemaMismatchError", "ClaimLostError", "ClaimLostReason",
    "ClaimHeldError", "RunNotFoundError", "InvalidTransitionError", "RevisionConflictError",
    "ReceiptConflictError", "ContentUnavailableError", "DiskFullError", "DISK_FULL_MESSAGE",
    "is_disk_full",
    # claims and the server epoch
    "Claim", "OwnerType", "WriteResult", "RenewedClaim", "DEFAULT_CLAIM_TTL_MS",
    "MAX_EVENT_PAYLOAD_BYTES", "acquire_claim", "check_claim", "protected_write",
    "renew_claim", "renew_owner_claims", "release_claim", "get_lease", "hash_token",
    "ServerClaim", "acquire_server_epoch", "renew_server_epoch", "release_server_epoch",
    "get_server_lease", "read_head",
    # lifecycle model and transitions
    "RunPhase", "RunStatus", "QueueState", "QueueKind", "ExecutionMode", "FailureClass",
    "RunnerOutcome", "EventType", "TRANSITIONS", "phase_of", "is_transition_allowed",
    "check_transition", "NewRun", "TransitionResult", "LaunchResult", "AttemptStarted",
    "enqueue_run", "claim_for_launch", "mark_runner_live", "record_runner_exit",
    "start_node_attempt", "finish_node_attempt", "fail_node_attempt", "park_run", "wait_run",
    "pause_run", "resume_run", "requeue_run", "complete_run", "fail_run", "time_out_run",
    "cancel_run", "close_attempt",
    # reads and rows
    "get_run", "get_run_summary", "run_list_revision", "run_view_revision", "get_queue_row",
    "get_phase", "get_attempt", "run_paused", "run_unfinished_unpaused",
    # retention (state prune)
    "DAY_MS", "BackupFailedError", "PruneTree", "collect_unnamed_blobs",
    "collect_unreferenced_blobs", "delete_tree",
    "prunable_trees", "prunable_tree_page", "TreePage", "tree_blockers", "unnamed_blobs",
    "write_backup",
    # retention (the automatic sweep, and state status)
    "CompactOutcome", "compact_state", "runner_work_pending", "tree_runner_epochs",
    "retained_trees", "runs_by_state", "known_run_ids", "known_runner_epochs",
    "known_resource_uids",
    # the verified backup (state backup, and state prune --apply first)
    "BACKUP_STEP_PAGES", "BackupCopy", "BackupProgress", "check_backup_path",
    "list_runs", "list_runs_filtered", "list_runner_epochs", "RunListFilter",
    "list_events", "admissible_runs",
    "active_queue_count", "expired_claimed_runs", "unfinished_attempt", "list_attempts",
    "get_runner", "active_runner", "active_runners", "status_counts", "StatusCounts",
    "state_counts", "state_size",
    "server_has_work", "RunRow", "RunSummary", "QueueRow", "LeaseRow", "EventRow",
    "NodeAttemptRow", "RunnerEpochRow", "ServerLeaseRow",
    # receipts
    "CommandRequest", "LookupOutcome", "ReceiptLookup", "ReceiptOutcome", "StoredReceipt",
    "command_fingerprint", "lookup_receipt", "record_receipt",
    # content
    "BLOB_REFRESH_MS", "CONTENT_PART_BYTES", "ContentRef", "content_digest", "put_blob",
    "put_json_blob",
    "blob_length", "read_blob_part", "iter_blob_parts", "read_blob", "read_json_blob",
    "put_view_content", "view_content_length", "read_view_content_part",
    "iter_view_content_parts", "read_view_content",
    # the invariant checker
    "Finding", "FindingCode", "verify", "verify_backup", "verify_copy",
    # managed effects
    "EffectState", "EffectDecision", "EffectRecord", "EffectReservation", "EffectConflictError",
    "effect_fingerprint", "reserve_effect", "settle_effect", "retry_effect_after_read_back",
    "declare_effect_ambiguous", "get_effect", "list_effects", "count_ambiguous_effects",
    "AmbiguousEffect", "EffectRecovery", "EffectRecoveryError", "list_ambiguous_effects",
    "recover_ambiguous_effect",
    # runner messages, resume state, runner outcomes
    "RunnerMessageConflictError", "runner_message_fingerprint", "lookup_runner_reply",
    "record_runner_reply", "ResumeState", "FinishedAttempt", "UnfinishedAttempt",
    "read_resume_state", "ParkReason", "runner_made_progress",
    # checkpoint decisions
    "CheckpointAnswer", "PendingDecision", "answer_checkpoint", "open_checkpoint_decision",
    "pending_decision", "read_continuation", "count_runner_outcomes", "AnswerInvalidError",
    "checkpoint_answer_schema",
    # the run's end behind posted messages: the epoch's stored replies, counted
    "count_runner_replies",
    # startup recovery
    "RecordedProcess", "RecoveredRun", "close_stale_runner_epoch", "forget_recorded_process",
    "forget_recorded_processes", "record_process", "recorded_processes", "recover_stale_run",
    "stale_runner_epochs", "stale_running_runs", "take_over_claim", "server_deaths_in_flight",
    "recover_expired_runs", "retake_server_epoch", "holds_server_lease",
    # the live run view
    "LineageLinks", "PendingRequest", "TRACEBACK_MEDIA_TYPE", "failure_tracebacks",
    "lineage_links", "pending_requests", "put_traceback", "run_result_payload",
    # view content and trace pages (issue 13 items 5 and 6)
    "VIEW_INLINE_BYTES", "VIEW_JSON_MEDIA_TYPE", "VIEW_TEXT_MEDIA_TYPE", "NumberedAttempt",
    "attempt_position", "attempt_window", "count_attempts",
    "store_view_blob", "store_view_text", "count_transitions", "transition_window",
    # run bindings and the session view: origin sessions, reservations, terminal retention
    "interactive_origin_session", "session_reservation", "latest_terminal_run",
    "terminal_cleared", "clear_terminal_retention", "session_base_revision",
    "terminal_message_retained",
    # interactive requests and their submissions (the domain's interaction units)
    "EVENT_UNPRODUCTIVE_TURN", "UNPRODUCTIVE_TURN_LIMIT", "SubmissionRow", "CarriedTurns",
    "request_interaction", "read_request", "read_request_for_attempt", "read_submission",
    "record_submission", "settle_submission", "submission_receipt", "submission_value",
    "submission_run_status", "submission_validating", "validating_submissions",
    "binding_refusal", "adoptable_submission", "earlier_submission_validating",
    "supersede_earlier_requests", "record_interaction_event", "record_unproductive_turn",
    "unproductive_turn_ends", "set_unproductive_turn_ends", "interrupted_request_turns",
    "carry_turn_count", "cancel_pending_request",
    # workflow messages and origin-session model turns
    "MessageRow", "TurnRow", "OpenTurn", "insert_message", "insert_step_again", "read_message",
    "mark_sent", "absent_from_branch", "session_messages", "session_messages_count",
    "next_eligible_message", "pending_step_message", "cancel_step_messages",
    "cancel_superseded_step_messages", "present_notification", "present_resumed_steps",
    "insert_turn", "read_turn", "end_turn", "open_turns", "latest_open_turn",
    "message_turn_ended",
    # handing an interactive run over: adopt, headless
    "move_origin_session", "make_run_headless", "waits_at_agent_step",
    # active time and deadlines of interactive steps
    "DueRequest", "due_requests", "next_due_at", "start_active_time", "suspend_request_time",
    "suspend_session_time", "resume_session_time", "suspend_after_server_death",
    "time_out_request",
    # protected human decisions
    "CHECKPOINT_AUDIENCE", "ProtectedAnswer", "ProtectedDecisionRow", "decision_audience",
    "open_waiting_decision", "answer_protected_decision", "pending_protected_decisions",
    "read_protected_decision", "protected_decision_row", "run_protected_decision",
    "decision_outcome", "due_decisions", "next_decision_due", "time_out_protected_decision",
    # follow-ups
    "MAX_FOLLOW_UP_CHARS", "add_follow_up", "chain_leaf", "present_next_follow_up",
    # channel adapters (managed effects of the channel children)
    "DELIVER", "SETTLE", "ChannelAttempt", "ChannelCounts", "ChannelResult", "SettledAttempt",
    "StaleChannelResultError", "channel_counts", "channel_message_ids", "delivered_decisions",
    "interrupt_channel_attempts", "recover_channel_effect", "reserve_channel_attempt",
    "settle_channel_attempt", "RETRY_BOUND_MS", "ChannelTrouble", "channel_trouble", "chat_hold",
    # resource managers
    "BACKOFF_BASE_MS", "BACKOFF_CAP_MS", "CONDITION_STATUSES", "HISTORY_KEPT",
    "MAX_RESOURCE_EVENT_BYTES", "MAX_RESOURCE_JSON_BYTES", "RESOURCE_OWNER",
    "ChildRunConflictError", "ChildRunRecord", "ChildRunReservation", "ClaimedReconcile",
    "DeleteOutcome", "ParentResource", "PassOutcome", "PassRecord", "ReconcileCommit",
    "PassResult", "ResourceApplied", "ResourceClaim", "ResourceDeletingError",
    "ResourceEffectRow", "ResourceEventRow", "ResourceLimitError", "ResourceNotFoundError",
    "ResourceQueueRow", "ResourceRecord", "ResourceSummary", "ResourceVersionConflictError",
    "ScheduledReconcile", "apply_resource", "claim_next_resource", "commit_reconcile",
    "enqueue_resource", "get_resource", "get_resource_by_uid", "get_resource_queue_row",
    "list_reconcile_history", "list_resource_child_runs", "list_resource_effects",
    "list_resource_events", "list_resources", "next_reconcile_due_at", "reconcile_backoff_ms",
    "recover_resource_claims", "release_resource_claim", "renew_resource_claim",
    "request_resource_deletion", "reserve_child_run", "run_parent_resource",
    "scheduled_reconciles",
    "check_resource_claim", "ResourceEffect", "ResourceEffectDecision", "reserve_resource_effect",
    "retry_resource_effect", "settle_resource_effect", "count_due_reconciles", "count_reconciling",
    "has_expired_resource_claims",
    # the session record (sessionEvents.record, session-event pages)
    "SESSION_EVENT_BYTES", "SegmentCounts", "SegmentRow", "SegmentSummary", "SessionEventRow",
    "SessionPageRow", "StoredSeq", "fail_orphaned_captures", "append_session_event",
    "count_session_events",
    "count_session_pages", "count_session_segments", "grow_session_page", "insert_session_page",
    "last_session_page", "open_segment", "put_session_entry", "read_segment", "run_segments",
    "session_event_range", "session_page", "session_page_of", "stored_seq", "update_segment",
}  # fmt: skip


def test_public_surface_is_pinned() -> None:
    assert set(storage.__all__) == PINNED
    for name in storage.__all__:
        assert hasattr(storage, name), name


def test_every_implementation_module_is_private_and_declares_all() -> None:
    for info in pkgutil.iter_modules(storage.__path__):
        assert info.name.startswith("_"), info.name
        module = importlib.import_module(f"pi_workflows.storage.{info.name}")
        assert isinstance(getattr(module, "__all__", None), list), info.name
        doc = module.__doc__ or ""
        assert 2 <= len(doc.strip().splitlines()) <= 5, info.name
