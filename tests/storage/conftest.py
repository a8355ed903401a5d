"""Fixtures for the storage tests: a manual clock and a real state database file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pi_workflows.storage import Database, ManualClock, open_database


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "agent" / "workflows" / "state.sqlite"


@pytest.fixture
def db(db_path: Path, clock: ManualClock) -> Iterator[Database]:
    database = open_database(db_path, clock=clock)
    try:
        yield database
    finally:
        database.close()
