"""The schema file, its digest constant, and every named query against a fresh schema."""

from __future__ import annotations

import re
import sqlite3

import pytest

from pi_workflows.storage import _queries
from pi_workflows.storage._schema import (
    DDL_DIGEST,
    compute_ddl_digest,
    ddl_statements,
    load_ddl,
    normalize_ddl,
)

QUERY_NAMES = sorted(
    name for name, value in vars(_queries).items() if name.isupper() and isinstance(value, str)
)
PARAM = re.compile(r"(?<!:):([a-z_]+)")

EXPECTED_TABLES = {
    "schema_info",
    "server_lease",
    "runner_processes",
    "blobs",
    "runs",
    "run_list_revision",
    "run_queue",
    "leases",
    "events",
    "node_attempts",
    "human_decisions",
    "follow_ups",
    "human_decision_resolutions",
    "human_decision_answers",
    "effects",
    "effect_attempts",
    "run_bindings",
    "host_commands",
    "interactive_requests",
    "interactive_submissions",
    "workflow_messages",
    "workflow_turns",
    "runner_epochs",
    "runner_messages",
    "run_view_content",
    "channel_messages",
    "resources",
    "resource_events",
    "resource_queue",
    "resource_claims",
    "reconcile_history",
    "resource_child_runs",
    "session_segments",
    "session_events",
    "session_entries",
    "session_pages",
}


@pytest.fixture(scope="module")
def fresh() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    for statement in ddl_statements():
        conn.execute(statement)
    return conn


def test_stored_digest_constant_matches_schema_sql() -> None:
    assert compute_ddl_digest(load_ddl()) == DDL_DIGEST


def test_digest_ignores_comments_and_white_space_only() -> None:
    ddl = load_ddl()
    reformatted = "-- a new comment\n" + ddl.replace("\n", "\n   \n")
    assert compute_ddl_digest(reformatted) == DDL_DIGEST
    assert compute_ddl_digest(ddl.replace("STRICT", "strict", 1)) != DDL_DIGEST
    assert "--" not in normalize_ddl(ddl)


def test_schema_has_every_table_the_design_names(fresh: sqlite3.Connection) -> None:
    tables = {row[0] for row in fresh.execute("SELECT name FROM sqlite_schema WHERE type='table'")}
    assert tables == EXPECTED_TABLES


def test_every_table_is_strict(fresh: sqlite3.Connection) -> None:
    for (sql,) in fresh.execute("SELECT sql FROM sqlite_schema WHERE type = 'table'"):
        assert re.search(r"\)\s*STRICT", sql), sql


def test_partial_unique_index_allows_one_pending_step_message_per_request(
    fresh: sqlite3.Connection,
) -> None:
    (sql,) = fresh.execute(
        "SELECT sql FROM sqlite_schema WHERE name = 'workflow_messages_one_pending_step'"
    ).fetchone()
    assert "UNIQUE" in sql and "kind = 'step' AND state = 'pending'" in sql


def test_every_foreign_key_has_an_index(fresh: sqlite3.Connection) -> None:
    """Deleting a run (retention) must not scan child tables."""
    tables = [row[0] for row in fresh.execute("SELECT name FROM sqlite_schema WHERE type='table'")]
    missing = []
    for table in tables:
        leading = set()
        for index in fresh.execute(f"PRAGMA index_list('{table}')").fetchall():
            first = fresh.execute(f"PRAGMA index_info('{index[1]}')").fetchone()
            if first is not None:
                leading.add(first[2])
        pk = [row[1] for row in fresh.execute(f"PRAGMA table_info('{table}')") if row[5] == 1]
        leading.update(pk)
        for fk in fresh.execute(f"PRAGMA foreign_key_list('{table}')"):
            column = fk[3]
            if column not in leading:
                missing.append(f"{table}.{column}")
    assert missing == []


@pytest.mark.parametrize("name", QUERY_NAMES)
def test_query_constant_compiles_against_a_fresh_schema(
    fresh: sqlite3.Connection, name: str
) -> None:
    sql = getattr(_queries, name)
    params = {param: None for param in PARAM.findall(sql)}
    program = fresh.execute("EXPLAIN " + sql, params).fetchall()  # raises if it does not compile
    assert program, f"{name} compiled to no program"


def test_queries_use_no_select_star() -> None:
    for name in QUERY_NAMES:
        assert not re.search(r"SELECT\s+\*", getattr(_queries, name)), name
