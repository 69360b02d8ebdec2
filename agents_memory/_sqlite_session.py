"""``SQLiteSession``: the Agents SDK's class of the same name, on the stdlib ``sqlite3`` module.

No SQLAlchemy engine, no extra driver: one ``sqlite3`` connection per session,
owned by one worker thread, so the event loop never blocks on the database and
the connection is never used by two threads at once. The tables are the same as
``SQLAlchemySession``'s (the DDL and statements are compiled from the same
models), so either class reads what the other wrote.

Concurrency: operations on one session queue on its worker thread. Writers of
all sessions on one file in this process queue on one lock per file (a thread
wakes as soon as the lock is free, where SQLite's busy handler would sleep and
poll); other processes coordinate through SQLite's own locking. Every write is
one ``BEGIN IMMEDIATE`` transaction, so a writer waits for the file's write lock
up front (up to the busy timeout) instead of failing with "database is locked"
when it upgrades a read, and any error rolls the whole transaction back, leaving
the connection ready for the next call.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import os
import sqlite3
import threading
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

from agents_memory._codec import decode_rows, encode_items
from agents_memory._crypto import Keyring
from agents_memory._databases import sqlite as lite
from agents_memory._errors import (
    DatabaseConnectionError,
    SchemaNotReadyError,
    SessionClosedError,
)
from agents_memory._ids import validate_session_id
from agents_memory._protocol import (
    SessionBase,
    coerce_settings,
    resolve_limit,
    writes_overridden,
)
from agents_memory._sqlalchemy import _compaction as compaction
from agents_memory._sqlalchemy._cancel import run_to_completion
from agents_memory._sqlalchemy._timestamps import check_ttl, utcnow
from agents_memory._tables import DEFAULT_MESSAGES_TABLE, DEFAULT_SESSIONS_TABLE, TableNames
from agents_memory.models import REVISION

if TYPE_CHECKING:
    from agents_memory._protocol import SessionSettings, TResponseInputItem

T = TypeVar("T")

MEMORY = ":memory:"


def _database_path(db_path: object) -> str:
    """The path ``sqlite3`` opens; a missing directory is reported now, not at first use."""
    if not isinstance(db_path, str | os.PathLike):
        msg = f"db_path must be a str or path, got {type(db_path).__name__}"
        raise TypeError(msg)
    path = os.fspath(db_path)
    if not isinstance(path, str):
        msg = "db_path must be a text path, not bytes"
        raise TypeError(msg)
    if path == MEMORY:
        return path
    if not path:
        msg = 'db_path must not be empty; pass ":memory:" for an in-memory database'
        raise ValueError(msg)
    parent = Path(path).parent
    if not parent.is_dir():
        msg = f"directory {str(parent)!r} of db_path {path!r} does not exist; create it first"
        raise FileNotFoundError(msg)
    return path


class _FileLock:
    """The write lock shared by every session of this process on one database file.

    With it, the file's queue of writes: batches of several sessions queued
    behind a commit share the next transaction (``lite.SharedWrites``).
    """

    __slots__ = ("__weakref__", "lock", "writes")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.writes = lite.SharedWrites()


_file_locks: weakref.WeakValueDictionary[str, _FileLock] = weakref.WeakValueDictionary()
_file_locks_guard = threading.Lock()


def _file_lock(path: str) -> _FileLock:
    """The lock for ``path`` (a private one for in-memory databases, which are never shared)."""
    if path == MEMORY:
        return _FileLock()
    key = os.path.realpath(path)
    with _file_locks_guard:
        found = _file_locks.get(key)
        if found is None:
            found = _file_locks[key] = _FileLock()
        return found


@contextlib.contextmanager
def _snapshot(conn: sqlite3.Connection) -> Iterator[None]:
    """One read transaction, so that a read and its refills see the same rows."""
    conn.execute("BEGIN")
    try:
        yield
    finally:
        conn.rollback()


def _connect(path: str, names: TableNames, write_lock: threading.Lock) -> sqlite3.Connection:
    """Open and configure a connection, and create the tables if they do not exist yet.

    (Whether they have ``expires_at`` is asked next: :func:`lite.has_expiry`.)
    """
    # isolation_level=None: no implicit BEGINs; transactions are exactly ours (_snapshot and
    # the SQLite module's write transactions).
    conn = sqlite3.connect(
        path,
        timeout=lite.BUSY_TIMEOUT_MS / 1000,
        isolation_level=None,
        check_same_thread=True,
    )
    try:
        lite.configure(conn, wal=False)  # WAL below, under the write lock
        create, exists, stamp_head = lite.schema_sql(names, REVISION)
        with write_lock:
            if path != MEMORY:
                conn.execute("PRAGMA journal_mode = WAL")
            with lite.write_transaction(conn):
                # Existing tables (seed, SDK, an older revision) are used as they are:
                # adding head-only objects to them would break their next migration.
                if not conn.execute(exists).fetchone():
                    # Created at head, and recorded so, as `agents-memory db upgrade` would.
                    for statement in (*create, *stamp_head):
                        conn.execute(statement)
    except BaseException:
        conn.close()
        raise
    return conn


class SQLiteSession(SessionBase):
    """One conversation's history in a SQLite database, through the stdlib ``sqlite3`` module.

    In memory by default (the history lives as long as the session object); pass
    ``db_path`` (a str or :class:`~pathlib.Path`) to keep it in a file, which
    ``SQLAlchemySession`` and ``SessionStore`` can open as well. Call
    :meth:`close` (or use ``with`` / ``async with``) to release the connection
    and its worker thread; later calls raise :class:`SessionClosedError`.

    Like the SDK's class, the constructor opens the database and creates the
    tables (on the worker thread, waiting for it), so a file has its tables even
    when the first write fails, and a bad path fails here rather than later.

    ``encryption=Keyring(...)`` encrypts items before they are written and opens
    them on read (see :class:`~agents_memory.Keyring`). ``ttl=timedelta(...)``:
    each write moves the session's deadline to that long from now; once it has
    passed the session reads as empty and its next write starts it afresh (as
    ``SessionStore(ttl=)`` does; tables created without migrations cannot).
    """

    def __init__(
        self,
        session_id: str,
        db_path: str | Path = MEMORY,
        sessions_table: str = DEFAULT_SESSIONS_TABLE,
        messages_table: str = DEFAULT_MESSAGES_TABLE,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        *,
        encryption: Keyring | None = None,
        ttl: dt.timedelta | None = None,
    ) -> None:
        names = TableNames(sessions_table, messages_table)
        self._ttl = check_ttl(ttl)
        if encryption is not None and not isinstance(encryption, Keyring):
            msg = f"encryption must be an agents_memory.Keyring, got {type(encryption).__name__}"
            raise TypeError(msg)
        self._keyring = encryption
        self.session_id: str = validate_session_id(session_id)
        self.session_settings: SessionSettings | None = coerce_settings(session_settings)
        self.db_path: str | Path = db_path
        self.sessions_table: str = names.sessions
        self.messages_table: str = names.messages
        self._names = names
        self._path = _database_path(db_path)
        self._sql = lite.compiled(names)
        self._expiry = False
        """Whether the tables are at head (positions, ``expires_at``): which statements run."""
        self._file_lock = _file_lock(self._path)  # held, so every session on the file shares it
        self._write_lock = self._file_lock.lock
        self._guard = threading.Lock()
        self._closed = False
        # One worker thread owns the connection: operations on this session queue on it.
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agents_memory-sqlite")
        self._conn: sqlite3.Connection | None = None
        try:
            self._worker.submit(self._in_worker, lambda _conn: None).result()
        except BaseException:
            self._closed = True
            self._worker.shutdown(wait=False)
            raise

    @property
    def table_names(self) -> TableNames:
        """The validated table names of this session."""
        return self._names

    def __repr__(self) -> str:
        return f"{type(self).__name__}(session_id={self.session_id!r}, db_path={self._path!r})"

    # -- plumbing -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            msg = f"session {self.session_id!r} was closed; create a new SQLiteSession to use it"
            raise SessionClosedError(msg)

    async def _call(self, operation: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``operation`` on the worker thread with this session's connection."""
        with self._guard:
            self._check_open()
            future = self._worker.submit(self._in_worker, operation)
        return await asyncio.wrap_future(future)

    def _in_worker(self, operation: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._conn
        if conn is None:
            # Opened on the thread that owns it; the constructor's first job does it.
            try:
                conn = self._conn = _connect(self._path, self._names, self._write_lock)
            except sqlite3.DatabaseError as exc:
                kind = lite.SQLite.classify(exc)
                advice = lite.SQLite.cannot_open_advice(self._path, kind or "connect")
                if kind not in ("connect", "notadb") or advice is None:
                    raise
                msg = f"cannot open the SQLite database {self._path!r} ({exc}); {advice}"
                raise DatabaseConnectionError(msg) from exc
            self._expiry = lite.has_expiry(conn, self._names)
            self._sql = lite.compiled(self._names, self._expiry)
            if self._ttl is not None and not self._expiry:
                self._close_in_worker()
                msg = (
                    f"ttl= needs the expires_at column, which the tables {self._names.sessions}/"
                    f"{self._names.messages} in {self._path!r} (created without migrations) do "
                    "not have; run `agents-memory db upgrade` on the file"
                )
                raise SchemaNotReadyError(msg)
        return operation(conn)

    def _close_in_worker(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- the protocol -------------------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """Return the latest ``limit`` items (all when ``None``), in chronological order.

        Without an explicit limit, ``session_settings.limit`` applies.
        """
        n = resolve_limit(limit, self.session_settings)
        if n == 0:
            self._check_open()
            return []
        return await self._call(functools.partial(self._get, n))  # type: ignore[arg-type]

    def _get(self, limit: int | None, conn: sqlite3.Connection) -> list[dict[str, Any]]:
        ex, sid = lite.LiteExecutor(conn, self._sql), self.session_id
        with _snapshot(conn):  # one snapshot, even across the refill reads
            if limit is None:
                rows = ex.rows("select_all", {"sid": sid})
                return decode_rows(rows, on_corrupt="skip", keyring=self._keyring)
            fetched = ex.rows("select_latest", {"sid": sid, "n": limit})
            items = decode_rows(reversed(fetched), on_corrupt="skip", keyring=self._keyring)
            want = limit
            # Corrupt rows were skipped: read further back so ``limit`` counts valid items.
            while len(items) < limit and len(fetched) == want:
                want = limit - len(items)
                params = {"sid": sid, "before": fetched[-1][0], "n": want}
                fetched = ex.rows("select_older", params)
                items = (
                    decode_rows(reversed(fetched), on_corrupt="skip", keyring=self._keyring) + items
                )
            return items

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` in order, atomically: all of them or (on any error) none.

        Every item is validated and encoded first; one that is not a
        JSON-serialisable dict raises ``TypeError`` before anything is written.
        """
        data = encode_items(items)
        self._check_open()
        if not data:
            return
        if self._keyring is not None:
            data = self._keyring.encrypt_all(data)
        await self._call(functools.partial(self._add, data))

    def _write(
        self, conn: sqlite3.Connection, job: Callable[[sqlite3.Connection], T], size: int = 0
    ) -> T:
        """Run ``job`` in a write transaction, grouped with other sessions' writes on the file."""
        return self._file_lock.writes.run(self._write_lock, conn, job, size)

    def _deadline(self) -> str | None:
        """The deadline a write gives the session (``ttl`` from now), as SQLite text."""
        return None if self._ttl is None else lite.stamp(utcnow() + self._ttl)

    def _add(self, data: list[str], conn: sqlite3.Connection) -> None:
        sql, sid, expires = self._sql, self.session_id, self._deadline()
        job: Callable[[sqlite3.Connection], None] = (
            lite.Append(self._names, sid, data, expires)  # a group may run it with others
            if self._expiry
            else lambda c: lite.add_body(lite.LiteExecutor(c, sql), sid, data, expires)
        )
        self._write(conn, job, sum(map(len, data)))

    async def pop_item(self) -> TResponseInputItem | None:
        """Atomically remove and return the newest item; ``None`` when the session is empty.

        A corrupt newest row holds no item to return: it is removed (with a
        warning) and the next one is popped, in the same transaction.
        """
        return await self._call(self._pop)  # type: ignore[arg-type]

    def _pop(self, conn: sqlite3.Connection) -> dict[str, Any] | None:
        sql, sid, keyring = self._sql, self.session_id, self._keyring
        return self._write(
            conn, lambda c: lite.pop_body(lite.LiteExecutor(c, sql), sid, "skip", keyring)
        )

    async def clear_session(self) -> None:
        """Delete the session and all of its items."""
        await self._call(self._clear)

    def _clear(self, conn: sqlite3.Connection) -> None:
        sql, sid, keyring = self._sql, self.session_id, self._keyring
        self._write(conn, lambda c: lite.clear_body(lite.LiteExecutor(c, sql), sid, keyring))

    async def replace_items(self, items: list[TResponseInputItem]) -> None:
        """Replace the whole history with ``items``, atomically: the old history or the new.

        Validated and encoded first (a bad item raises and nothing changes), then
        one transaction (grouped with other writes on the file, in its own
        savepoint) deletes the items and inserts the new ones. The session row
        stays, ``updated_at`` bumped; ``replace_items([])`` empties the history.
        """
        data = encode_items(items)
        self._check_open()
        await self._call(functools.partial(self._replace, data))

    def _replace(self, data: list[str], conn: sqlite3.Connection) -> None:
        sql, sid, keyring = self._sql, self.session_id, self._keyring
        if keyring is not None:
            data = keyring.encrypt_all(data)
        expires = self._deadline()
        self._write(
            conn,
            lambda c: lite.replace_body(
                lite.LiteExecutor(c, sql), sid, data, keyring, expires, expiry=self._expiry
            ),
            sum(map(len, data)),
        )

    async def _atomic_replace_items(self, items: list[TResponseInputItem]) -> bool:
        """The Agents SDK's compaction hook (see ``SQLAlchemySession._atomic_replace_items``)."""
        if writes_overridden(type(self), SQLiteSession):
            return False
        await self.replace_items(items)
        return True

    async def _get_compaction_snapshot(
        self, limit: int, *, prune_prefix: Callable[[Any], bool] | None = None
    ) -> compaction.CompactionSnapshot | None:
        """The Agents SDK's partial-compaction hook (as ``SQLAlchemySession``'s; ``_compaction``).

        The read is one snapshot; the swap is one write transaction on the file
        (grouped with other writes, in its own savepoint) that checks the suffix first.
        """
        self._check_open()
        if compaction.declined(type(self), SQLiteSession):
            return None
        limit = compaction.check_limit(limit)
        sql = compaction.compiled(self._names, lite.DIALECT, self._expiry)
        sid, keyring = self.session_id, self._keyring

        def read(conn: sqlite3.Connection) -> list[Any]:
            with _snapshot(conn):
                return compaction.read_sync(conn, self._sql, sid, limit)

        decoded = compaction.decode_tail(await self._call(read), limit, keyring)
        if decoded is None:
            return None
        rows, items, complete = decoded

        async def replace_suffix(start: int, output: list[TResponseInputItem]) -> bool:
            expected = rows[start:]
            if not expected:
                return False
            data = compaction.encode_output(list(output), keyring, ensure_ascii=False)

            swap_ = compaction.Swap(sid, expected, data, limit, prune_prefix, keyring)

            def swap(conn: sqlite3.Connection) -> bool:
                def job(c: sqlite3.Connection) -> bool:
                    return compaction.swap_body_sync(
                        c, sql, self._sql, swap_, lite.now(), expires=self._deadline()
                    )

                try:
                    return self._write(conn, job, sum(map(len, data)))
                except compaction.Stale:
                    return False

            return await run_to_completion(self._call(swap))

        return compaction.CompactionSnapshot(items, complete, replace_suffix)

    # -- lifetime -----------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection and stop the worker thread; later calls raise.

        Operations already started finish first. Safe to call more than once.
        """
        with self._guard:
            if self._closed:
                return
            self._closed = True
        self._worker.submit(self._close_in_worker)
        self._worker.shutdown(wait=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # close() waits for a running operation; do that waiting off the event loop.
        await asyncio.to_thread(self.close)
