"""Opening the state database, `write()`, group commits, read snapshots and typed reads.

Implements python-port.md decision 2 and workflow-server.md § Alpha state policy: WAL,
`synchronous=FULL`, foreign keys, `BEGIN IMMEDIATE` for every write (a group commit
makes each `write()` a savepoint of one), and a DDL-digest check before any write.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pi_workflows.storage import _queries as q
from pi_workflows.storage._clock import Clock, SystemClock
from pi_workflows.storage._errors import SchemaMismatchError
from pi_workflows.storage._paths import ensure_private_dir, state_db_path
from pi_workflows.storage._schema import DDL_DIGEST, SCHEMA_NAME, SCHEMA_VERSION, ddl_statements
from pi_workflows.supervision import crash_point

__all__ = [
    "DEFAULT_BUSY_TIMEOUT_MS",
    "Database",
    "GroupCommit",
    "GroupLostError",
    "Params",
    "Reader",
    "Tracer",
    "Tx",
    "open_database",
    "open_live_reader",
    "open_readonly",
]

T = TypeVar("T")

Params = Mapping[str, Any] | Sequence[Any]
"""Bound parameters: a mapping for `:name` placeholders, a sequence for `?`."""

Tracer = Callable[[str, Params | None], None]
"""Called after each statement succeeds, with the SQL and its (redacted) parameters.

`BEGIN IMMEDIATE`, `COMMIT` and `ROLLBACK` are traced too, so a `COMMIT` trace means
the transaction is durable: crash points "after commit, before reply" hook in here.
"""

DEFAULT_BUSY_TIMEOUT_MS = 5_000
"""How long a statement waits for another connection's lock (a backup, `state verify`)."""

_WAL_CHECKPOINT_TRUNCATE = "PRAGMA wal_checkpoint(TRUNCATE)"
_WAL_CHECKPOINT_PASSIVE = "PRAGMA wal_checkpoint(PASSIVE)"

# Parameters that must never reach a tracer or a log line (workflow-server.md § Claim rules).
_SENSITIVE_PARAMS = frozenset({"token_hash"})
_REDACTED = "<redacted>"


class Reader(Protocol):
    """Anything that runs typed reads: a `Database` (autocommit) or an open `Tx`."""

    @property
    def connection(self) -> sqlite3.Connection:
        """The underlying connection (for `verify`; do not write through it)."""
        ...

    def fetch_one(self, sql: str, params: Params, row_type: type[T]) -> T | None:
        """Return the first row as `row_type(**columns)`, or None."""
        ...

    def fetch_all(self, sql: str, params: Params, row_type: type[T]) -> list[T]:
        """Return every row as `row_type(**columns)`."""
        ...

    def fetch_value(self, sql: str, params: Params) -> Any:
        """Return the first column of the first row, or None when there is no row."""
        ...


def _redact(params: Params) -> Params:
    if isinstance(params, Mapping) and not _SENSITIVE_PARAMS.isdisjoint(params):
        return {k: (_REDACTED if k in _SENSITIVE_PARAMS else v) for k, v in params.items()}
    return params


def _rows(cursor: sqlite3.Cursor, row_type: type[T]) -> list[T]:
    names = [d[0] for d in cursor.description]
    return [row_type(**dict(zip(names, row, strict=True))) for row in cursor.fetchall()]


def _first(cursor: sqlite3.Cursor, row_type: type[T]) -> T | None:
    rows = _rows(cursor, row_type)
    return rows[0] if rows else None


class _ReadMixin:
    """Typed reads shared by `Database` and `Tx`. Internal."""

    _conn: sqlite3.Connection
    tracer: Tracer | None

    @property
    def connection(self) -> sqlite3.Connection:
        """The underlying connection (for `verify`; do not write through it)."""
        return self._conn

    def _run(self, sql: str, params: Params) -> sqlite3.Cursor:
        cursor = self._conn.execute(sql, params)
        if self.tracer is not None:
            self.tracer(sql, _redact(params))
        return cursor

    def fetch_one(self, sql: str, params: Params, row_type: type[T]) -> T | None:
        """Return the first row as `row_type(**columns)`, or None when there is no row."""
        return _first(self._run(sql, params), row_type)

    def fetch_all(self, sql: str, params: Params, row_type: type[T]) -> list[T]:
        """Return every row as `row_type(**columns)`; column names must match fields."""
        return _rows(self._run(sql, params), row_type)

    def fetch_value(self, sql: str, params: Params) -> Any:
        """Return the first column of the first row, or None when there is no row."""
        cursor = self._run(sql, params)
        row = cursor.fetchone()
        cursor.close()  # finish the statement (an UPDATE ... RETURNING) before COMMIT
        return None if row is None else row[0]


class Tx(_ReadMixin):
    """One open `BEGIN IMMEDIATE` transaction; only `Database.write()` creates it.

    `now` is the clock reading taken when the transaction began: every time written
    in one transaction is the same instant. The handle is dead once its `write()` block
    ends; using it afterwards raises `RuntimeError`.
    """

    __slots__ = ("_active", "_conn", "lifecycle", "now", "tracer")

    def __init__(self, conn: sqlite3.Connection, now: int, tracer: Tracer | None) -> None:
        self._conn = conn
        self.now = now
        self.tracer = tracer
        self._active = True
        self.lifecycle: list[str] = []
        """The lifecycle transitions of this transaction by name (`pause`, `node_finish`,
        ...): its commit passes `server.lifecycle.<name>.before_commit` and `.after_commit`
        of each, in order."""

    def _run(self, sql: str, params: Params) -> sqlite3.Cursor:
        if not self._active:
            raise RuntimeError("this transaction has ended; open a new write()")
        cursor = self._conn.execute(sql, params)
        if self.tracer is not None:
            self.tracer(sql, _redact(params))
        return cursor

    def execute(self, sql: str, params: Params = ()) -> int:
        """Run one statement and return the number of rows it changed."""
        return self._run(sql, params).rowcount

    @contextlib.contextmanager
    def undoable(self) -> Iterator[None]:
        """A part of this transaction that an exception leaving it undoes alone (a
        savepoint): a refused command's change writes nothing (no blob, no row), while
        the transaction goes on to store the refusal's receipt."""
        mark = len(self.lifecycle)
        self._run(q.SAVEPOINT_PART, ())
        try:
            yield
        except BaseException:
            if self._conn.in_transaction:
                self._run(q.ROLLBACK_TO_PART, ())
                self._run(q.RELEASE_PART, ())
            del self.lifecycle[mark:]
            raise
        self._run(q.RELEASE_PART, ())


class _Write:
    """The context manager `Database.write()` returns. Internal.

    A class rather than a generator: it runs on every write, and this is measurably
    cheaper (benchmarks/bench_storage.py). Inside a group commit it is a savepoint.
    """

    __slots__ = ("_db", "_mark", "_tx")

    def __init__(self, db: Database) -> None:
        self._db = db
        self._tx: Tx | None = None
        self._mark = 0

    def __enter__(self) -> Tx:
        db = self._db
        if db.read_only:
            raise RuntimeError("this database was opened read-only")
        if db._in_write:
            raise RuntimeError("write() does not nest; pass the open Tx down instead")
        group = db._group
        if group is None:
            db._run(q.BEGIN_IMMEDIATE, ())
            self._mark = 0
        else:
            if group.began_at is None:
                db._run(q.BEGIN_IMMEDIATE, ())
                group.began_at = group.units
            db._run(q.SAVEPOINT_UNIT, ())
            self._mark = len(group.actions)
        db._in_write = True
        self._tx = Tx(db._conn, db.clock.now_ms(), db.tracer)
        return self._tx

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, *_: object
    ) -> None:
        db, tx = self._db, self._tx
        assert tx is not None
        tx._active = False
        group = db._group
        try:
            if exc_type is None:
                if group is not None:
                    db._run(q.RELEASE_UNIT, ())
                    group.lifecycle.extend(tx.lifecycle)
                    return
                for name in tx.lifecycle:
                    crash_point(f"server.lifecycle.{name}.before_commit")
                db._run(q.COMMIT, ())
                for name in tx.lifecycle:
                    crash_point(f"server.lifecycle.{name}.after_commit")
                actions, db._after_write = db._after_write, []
                for action in actions:
                    action()
                return
        except BaseException as failed:
            self._undo(failed)
            raise
        finally:
            db._in_write = False
        self._undo(exc)

    def _undo(self, cause: BaseException | None) -> None:
        db, group = self._db, self._db._group
        if group is None:
            db._after_write = []
            _rollback(db)
            return
        del group.actions[self._mark :]
        if db._conn.in_transaction:
            try:
                db._run(q.ROLLBACK_TO_UNIT, ())
                db._run(q.RELEASE_UNIT, ())
                return
            except sqlite3.Error:
                _rollback(db)
        # SQLite rolled back the group's whole transaction (an I/O error, a full disk):
        # the writes of every unit since it began are gone with it.
        group.lost = True
        group.lost_by = cause


def _rollback(db: Database) -> None:
    """Roll back if a transaction is still open; never mask the original error."""
    if db._conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            db._run(q.ROLLBACK, ())


class GroupLostError(sqlite3.OperationalError):
    """A group commit's transaction ended without its COMMIT: none of its units' writes
    are stored. Raised to (replied to) each unit that ran inside that transaction, from
    the error under which SQLite rolled it back (`is_disk_full` follows that cause)."""


class _Group:
    """The state of one open group commit. Internal."""

    __slots__ = ("actions", "began_at", "lifecycle", "lost", "lost_by", "units")

    def __init__(self) -> None:
        self.units = 0
        """Units started so far (the index of the next one)."""
        self.began_at: int | None = None
        """The unit whose first write opened the transaction; None while nothing wrote."""
        self.lifecycle: list[str] = []
        """Lifecycle transitions among the released savepoints, by name, in order (each
        passes its crash points at the group's COMMIT)."""
        self.actions: list[Callable[[], None]] = []
        """`after_commit` actions, in registration order."""
        self.lost = False
        """SQLite rolled the transaction back under a unit: nothing since `began_at` is kept."""
        self.lost_by: BaseException | None = None
        """The error under which it did (a full disk, an I/O error): `GroupLostError`'s cause."""


class GroupCommit:
    """One group commit: run units with `run`, then make them durable with `commit`.

    Only `Database.group()` creates it. While it is open, every `db.write()` of a unit
    is a `SAVEPOINT` inside one `BEGIN IMMEDIATE` transaction (opened by the first
    write, so a group that only reads takes no write lock and commits nothing). A unit
    whose write block raises rolls back to its savepoint: its own writes are undone,
    those of the other units stay. `commit` then runs one `COMMIT` for all of them.

    Deferred foreign keys are checked at that `COMMIT`, so a unit that leaves one broken
    (a programming error) fails the whole group: every unit in it gets the error.
    """

    __slots__ = ("_db", "_group")

    def __init__(self, db: Database) -> None:
        if db._group is not None or db._in_write:
            raise RuntimeError("a group commit is already open on this database")
        self._db = db
        self._group = _Group()
        db._group = self._group

    @property
    def began_at(self) -> int | None:
        """The index of the first unit that ran inside the transaction, or None."""
        return self._group.began_at

    @property
    def lost(self) -> bool:
        """True when SQLite rolled back the transaction under a unit: commit nothing.

        Every unit from `began_at` to the one that just ran lost its writes.
        """
        return self._group.lost

    def run(self, work: Callable[[Database], T]) -> T:
        """Run one unit (its writes are savepoints); return what it returns or raise."""
        group = self._group
        if group.lost:
            raise RuntimeError("this group lost its transaction; open a new group")
        try:
            return work(self._db)
        finally:
            group.units += 1

    def abandon(self, cause: BaseException) -> None:
        """Give the whole transaction up (a unit hit a full disk): roll it back now, so
        `lost` is true and `commit` raises `GroupLostError` from `cause`. A no-op when
        nothing wrote yet."""
        group = self._group
        if group.began_at is None or group.lost:
            return
        group.actions = []
        _rollback(self._db)
        group.lost = True
        group.lost_by = cause

    def commit(self) -> None:
        """Make every unit's writes durable with one `COMMIT`, then run `after_commit` actions.

        **Durability:** when this returns, every released savepoint of the group is
        committed (`synchronous=FULL`). The crash points `server.group_commit.before_commit`
        and `server.group_commit.after_commit` sit on either side of the `COMMIT`, and each
        lifecycle transition in the group passes its `server.lifecycle.<name>.before_commit`
        and `.after_commit` there too, once each, in order.

        Raises:
            GroupLostError: the transaction was already lost (`lost`); nothing is stored.
            sqlite3.Error: the `COMMIT` failed; it was rolled back and nothing is stored.
        """
        db, group = self._db, self._group
        if group.lost:
            raise GroupLostError(
                "the group's transaction was rolled back; nothing was stored"
            ) from group.lost_by
        if group.began_at is None:
            actions, group.actions = group.actions, []
            for action in actions:
                action()
            return
        try:
            crash_point("server.group_commit.before_commit")
            for name in group.lifecycle:
                crash_point(f"server.lifecycle.{name}.before_commit")
            db._run(q.COMMIT, ())
        except BaseException:
            group.actions = []
            _rollback(db)
            raise
        crash_point("server.group_commit.after_commit")
        for name in group.lifecycle:
            crash_point(f"server.lifecycle.{name}.after_commit")
        actions, group.actions = group.actions, []
        for action in actions:
            action()

    def close(self) -> None:
        """End the group: roll back whatever was not committed, and leave group mode."""
        db = self._db
        if db._group is self._group:
            db._group = None
            self._group.actions = []
            _rollback(db)


class _Read:
    """The context manager `Database.read()` returns. Internal."""

    __slots__ = ("_db", "_open")

    def __init__(self, db: Database) -> None:
        self._db = db
        self._open = False

    def __enter__(self) -> Database:
        db = self._db
        if not db._conn.in_transaction:  # inside a write or a group: already consistent
            db._run(q.BEGIN_DEFERRED, ())
            self._open = True
        return db

    def __exit__(self, *_: object) -> None:
        if self._open and self._db._conn.in_transaction:
            self._db._run(q.COMMIT, ())  # a read transaction: nothing to sync


class Database(_ReadMixin):
    """The one connection to a state database.

    Not thread-safe: exactly one owner (the database actor) uses it at a time. The
    connection is in driver autocommit mode; `write()` is the only way to write.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: Path,
        *,
        clock: Clock,
        tracer: Tracer | None = None,
        read_only: bool = False,
    ) -> None:
        """Wrap an open connection; use `open_database` or `open_readonly` instead."""
        self._conn = conn
        self.path = path
        self.clock = clock
        self.tracer = tracer
        self.read_only = read_only
        self._in_write = False
        self._group: _Group | None = None
        self._after_write: list[Callable[[], None]] = []

    def write(self) -> contextlib.AbstractContextManager[Tx]:
        """Run a `with` block in one `BEGIN IMMEDIATE` transaction and commit it.

        **Durability:** when the block exits normally, `COMMIT` has returned and, with
        `synchronous=FULL`, the change survives a crash or power loss. If the block or
        the commit raises, the transaction is rolled back and the original exception
        propagates unmasked; nothing of the block is stored.

        **Blocking:** `BEGIN IMMEDIATE` waits up to the busy timeout for another
        connection's write lock.

        **Inside a group commit** (`group()`), the block is a savepoint of the group's one
        transaction instead: leaving it normally keeps its changes for the group's COMMIT
        (nothing is durable yet; use `after_commit` for what must follow durability), and
        an exception rolls back only this block's changes.

        Raises:
            RuntimeError: (on entering) the database is read-only, or a write is already
                open; writes do not nest, so pass the `Tx` down instead.
        """
        return _Write(self)

    def group(self) -> GroupCommit:
        """Open a group commit (the database actor's batches); see `GroupCommit`.

        While it is open, `write()` is a savepoint, and only `GroupCommit.commit` makes
        anything durable. Close it with `GroupCommit.close()`.

        Raises:
            RuntimeError: a group or a write is already open.
        """
        return GroupCommit(self)

    def read(self) -> contextlib.AbstractContextManager[Database]:
        """Run a `with` block of reads in one read transaction: one consistent snapshot.

        The snapshot is fixed by the block's first read and ends with the block. Inside an
        open write or group it adds nothing (those reads are already consistent).
        """
        return _Read(self)

    def after_commit(self, action: Callable[[], None]) -> None:
        """Run `action` once the writes made so far on this thread are durable.

        Inside a group commit: after the group's `COMMIT`, before any unit is answered;
        dropped if the group does not commit, or if the `write()` open at the call rolls
        back. Inside a plain `write()`: right after its `COMMIT`; dropped on rollback.
        Otherwise at once, because the last write already committed. For acts that must
        follow durability: stopping a fenced process, "after commit" crash points.
        """
        group = self._group
        if group is not None and group.began_at is not None:
            group.actions.append(action)
        elif group is None and self._in_write:
            self._after_write.append(action)
        else:
            action()

    def reclaim_wal(self) -> bool:
        """Copy the WAL into the database and truncate it (`wal_checkpoint(TRUNCATE)`).

        For a full disk: SQLite checkpoints on its own only past 1,000 WAL pages, so on a
        small disk the WAL can be what fills it, with the same pages many times over.
        Returns True if the WAL was emptied; False if a reader or the disk prevented it
        (nothing is lost either way). Never inside a transaction.
        """
        if self._conn.in_transaction:
            return False
        try:
            busy = self._conn.execute(_WAL_CHECKPOINT_TRUNCATE).fetchone()[0]
        except sqlite3.Error:
            return False
        return int(busy) == 0

    def checkpoint_wal(self) -> bool:
        """Copy what the WAL holds into the database without waiting for anyone
        (`wal_checkpoint(PASSIVE)`), between transactions of the writer.

        For work that writes many pages in a row (a retention sweep): checkpointing a
        few hundred pages at a time keeps the WAL under the 1,000 pages at which SQLite
        checkpoints by itself, inside the commit of whatever transaction comes next.
        Returns True when every frame was copied; False inside a transaction, when a
        reader holds older frames, or on an error (nothing is lost either way).
        """
        if self._conn.in_transaction:
            return False
        try:
            busy, frames, copied = self._conn.execute(_WAL_CHECKPOINT_PASSIVE).fetchone()
        except sqlite3.Error:
            return False
        return int(busy) == 0 and frames == copied

    def close(self) -> None:
        """Close the connection (a WAL checkpoint may run; see SQLite's close rules)."""
        self._conn.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class _SchemaRecord:
    schema_name: str
    schema_version: int
    ddl_digest: str


def _expected() -> _SchemaRecord:
    return _SchemaRecord(SCHEMA_NAME, SCHEMA_VERSION, DDL_DIGEST)


def _describe(record: _SchemaRecord) -> str:
    return f"{record.schema_name} version {record.schema_version} ({record.ddl_digest})"


def _inspect_schema(conn: sqlite3.Connection) -> str | None:
    """Return None for an empty database, "" for ours, else a description of what is there."""
    if conn.execute(q.COUNT_SCHEMA_OBJECTS).fetchone()[0] == 0:
        return None
    if conn.execute(q.SELECT_SCHEMA_INFO_TABLE).fetchone() is None:
        return "an unknown schema (no schema_info table)"
    try:
        row = conn.execute(q.SELECT_SCHEMA_INFO).fetchone()
    except sqlite3.Error:
        return "an unreadable schema record"
    if row is None:
        return "an empty schema record"
    found = _SchemaRecord(*row)
    return "" if found == _expected() else _describe(found)


def _readonly_uri(path: Path) -> str:
    return path.resolve().as_uri() + "?mode=ro"


def _check_existing_file(path: Path) -> None:
    """Refuse a non-empty file whose schema is not ours, using a read-only connection.

    Without a `-wal` file beside it the file alone is the whole database, so it is read
    as `immutable`: SQLite then creates no `-wal` or `-shm` file either.
    """
    if not path.exists() or path.stat().st_size == 0:
        return
    uri = _readonly_uri(path)
    if not path.with_name(path.name + "-wal").exists():
        uri += "&immutable=1"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None)
    try:
        conn.execute(q.PRAGMA_QUERY_ONLY)
        found = _inspect_schema(conn)
    except sqlite3.DatabaseError:
        found = "a file that is not a readable SQLite database"
    finally:
        conn.close()
    if found:
        raise SchemaMismatchError(path, found, _describe(_expected()))


def _create_private_file(path: Path) -> None:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return
    os.close(fd)
    path.chmod(0o600)  # os.open's mode is filtered by the umask


def _apply_pragmas(conn: sqlite3.Connection) -> None:
    conn.execute(q.PRAGMA_FOREIGN_KEYS_ON)
    mode = conn.execute(q.PRAGMA_JOURNAL_MODE_WAL).fetchone()[0]
    if str(mode).lower() != "wal":
        raise sqlite3.OperationalError(f"could not switch the database to WAL (got {mode})")
    conn.execute(q.PRAGMA_SYNCHRONOUS_FULL)
    conn.execute(q.PRAGMA_TEMP_STORE_MEMORY)


def _ensure_schema(db: Database) -> None:
    with db.write() as tx:
        found = _inspect_schema(tx.connection)
        if found is None:
            for statement in ddl_statements():
                tx.execute(statement)
            tx.execute(
                q.INSERT_SCHEMA_INFO,
                {
                    "schema_name": SCHEMA_NAME,
                    "schema_version": SCHEMA_VERSION,
                    "ddl_digest": DDL_DIGEST,
                    "created_at": tx.now,
                },
            )
        elif found:
            raise SchemaMismatchError(db.path, found, _describe(_expected()))


def open_database(
    path: Path | None = None,
    *,
    clock: Clock | None = None,
    tracer: Tracer | None = None,
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
) -> Database:
    """Open (creating if needed) the live state database.

    Steps: create missing folders with mode 0700; if the file exists and is not
    empty, read its schema record through a read-only connection and refuse any other
    schema; create the file with mode 0600; connect in autocommit mode; set
    `busy_timeout`, `foreign_keys=ON`, `journal_mode=WAL`, `synchronous=FULL`; create
    the schema and its record in one transaction if the database is empty.

    **Durability:** a new database's schema and schema record commit together.

    Args:
        path: the database file; default `<agent dir>/workflows/state.sqlite`.
        clock: the time source for every stored time; default `SystemClock()`.
        tracer: called after every statement (see `Tracer`).
        busy_timeout_ms: how long a statement waits for another connection's lock.

    Raises:
        SchemaMismatchError: the file holds another schema, version or DDL digest, or
            is not SQLite at all. Nothing was written; the message says how to back up
            and reset.
    """
    path = state_db_path() if path is None else Path(path)
    ensure_private_dir(path.parent)
    _check_existing_file(path)
    _create_private_file(path)
    if path.stat().st_mode & 0o077:
        path.chmod(0o600)  # our own file, verified above: keep it private
    conn = sqlite3.connect(
        path,
        isolation_level=None,
        check_same_thread=False,
        timeout=busy_timeout_ms / 1000,  # the driver sets SQLite's busy timeout from this
    )
    db = Database(conn, path, clock=clock or SystemClock(), tracer=tracer)
    try:
        _apply_pragmas(conn)
        _ensure_schema(db)
    except BaseException:
        conn.close()
        raise
    return db


def open_live_reader(
    path: Path,
    *,
    clock: Clock | None = None,
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
) -> Database:
    """Open a read-only connection to the live database, beside the server's writer.

    A `mode=ro` URI with `query_only` set: a WAL reader that never blocks the writer and
    is never blocked by it. The writer (`open_database`) must have opened and checked the
    file first; this one checks no schema. Use `Database.read()` for one consistent
    snapshot per request. `write()` raises on the result.

    Raises:
        FileNotFoundError: `path` does not exist.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(path)
    conn = sqlite3.connect(
        _readonly_uri(path),
        uri=True,
        isolation_level=None,
        check_same_thread=False,
        timeout=busy_timeout_ms / 1000,
    )
    conn.execute(q.PRAGMA_QUERY_ONLY)
    return Database(conn, path, clock=clock or SystemClock(), read_only=True)


def open_readonly(
    path: Path, *, clock: Clock | None = None, tracer: Tracer | None = None
) -> Database:
    """Open an inactive copy (a backup) read-only, for `state verify <backup>`.

    Uses a `mode=ro` URI and `PRAGMA query_only`, checks no schema digest (the caller
    verifies it), and never creates the file. `write()` raises on the result.

    Raises:
        FileNotFoundError: `path` does not exist.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(path)
    conn = sqlite3.connect(
        _readonly_uri(path), uri=True, isolation_level=None, check_same_thread=False
    )
    conn.execute(q.PRAGMA_QUERY_ONLY)
    return Database(conn, path, clock=clock or SystemClock(), tracer=tracer, read_only=True)
