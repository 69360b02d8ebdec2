"""The operations themselves, shared by every session and store on one engine and name set.

A session object is cheap (a backend and an id). The backend checks the schema
once, then hands each operation to the engine's database module
(``agents_memory._databases``): its driver runner, or its SQLAlchemy runner for
an engine somebody observes (``echo``, execution events). Here live only what
is the same on every database: the refill of a ``limit`` past corrupt rows,
streaming, the typed errors, retries of what is safe to retry, and lifetime.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import warnings
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from typing import Any, NoReturn, TypeVar

from sqlalchemy import Executable, Row
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agents_memory._codec import OnCorrupt, decode_rows
from agents_memory._crypto import Keyring
from agents_memory._databases import pool as driver_pool
from agents_memory._databases import sqlite as sqlite_module
from agents_memory._databases.base import Database, Operations, Statements, observed
from agents_memory._errors import (
    DatabaseConnectionError,
    SchemaNotReadyError,
    SessionClosedError,
    SessionExistsError,
)
from agents_memory._ids import check_sql_int
from agents_memory._sqlalchemy._cancel import run_to_completion
from agents_memory._sqlalchemy._engine import EngineState, engine_state
from agents_memory._sqlalchemy._faults import connection_errors, retry_delay
from agents_memory._sqlalchemy._schema import ensure_schema, schema_errors, upgrade_command
from agents_memory._sqlalchemy._timestamps import check_ttl, utcnow
from agents_memory._tables import TableNames
from agents_memory._urls import mask_url

T = TypeVar("T")


def _abandoned(engine: AsyncEngine, what: str) -> None:
    """A backend that owned its engine was collected without ``close()``: give everything back.

    As the standard library does for an unclosed file, say so with a
    ``ResourceWarning``; then stop the driver runner's threads and abort its
    connections (no event loop is needed for either) and drop the engine's pool.
    """
    warnings.warn(
        f"{what} on {mask_url(engine.url)} was never closed; call close() or use "
        "'async with' (its connections and threads were released when it was collected)",
        ResourceWarning,
        stacklevel=2,
    )
    sync_engine = engine.sync_engine
    sqlite_module.release_threads(sync_engine)
    driver_pool.release_pools(sync_engine)
    with contextlib.suppress(Exception):
        sync_engine.dispose(close=False)


class Backend:
    """Runs the protocol's operations for any session id against one engine and name set."""

    def __init__(
        self,
        engine: AsyncEngine,
        names: TableNames,
        *,
        create_tables: bool = False,
        on_corrupt: OnCorrupt = "skip",
        encryption: Keyring | None = None,
        ttl: dt.timedelta | None = None,
    ) -> None:
        if on_corrupt not in ("skip", "raise"):
            msg = f"on_corrupt must be 'skip' or 'raise', got {on_corrupt!r}"
            raise ValueError(msg)
        if encryption is not None and not isinstance(encryption, Keyring):
            msg = f"encryption must be an agents_memory.Keyring, got {type(encryption).__name__}"
            raise TypeError(msg)
        self.ttl = check_ttl(ttl)
        """Every write moves the session's deadline to now + ``ttl`` (``None``: no expiry)."""
        self.expiry = False
        """Whether the tables are at head, with positions and ``expires_at`` (the schema check
        says; ``False``: tables the Agents SDK or the seed made, ordered by ``id``): which
        statements run."""
        self.keyring: Keyring | None = encryption
        """Encrypts what is written and opens what is read (``None``: plaintext)."""
        self.engine = engine
        self.names = names
        self.on_corrupt: OnCorrupt = on_corrupt
        self.state: EngineState = engine_state(engine)
        self.db: type[Database] = self.state.db
        self.st: Statements = self.db.statements(names, expiry=True)
        """The head variant's tables and statements, for what works on the schema at head
        (listings, metadata, prune, rotation, bulk, advanced sessions)."""
        self.owns_engine = False
        """Whether this backend created its engine (``from_url``): it then disposes of it."""
        self._create_tables = create_tables
        self._schema_ready = False
        self._closed = False
        self._ops: dict[bool, Operations] = {}
        """The database's operations by "is the engine observed" (the runner differs)."""
        # The event loop our owned engine's pool was opened on.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._finalizer: weakref.finalize[Any, Backend] | None = None

    def own_engine(self, what: str) -> None:
        """The engine is this backend's (``from_url``): dispose of it on close or collection."""
        self.owns_engine = True
        self._finalizer = weakref.finalize(self, _abandoned, self.engine, what)

    # -- plumbing -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            msg = "this session's engine was closed with close(); create a new session"
            raise SessionClosedError(msg)

    async def _follow_loop(self) -> None:
        """Start a fresh engine pool when an engine we own is used from a new event loop.

        A script that calls ``asyncio.run()`` twice, or a test suite with a loop per
        test, would otherwise get pooled connections whose sockets belong to a loop
        that has ended. Nobody else uses an engine we created, so its pool is
        replaced without closing the old connections (their loop is gone). The
        driver runners keep connections per loop already.
        """
        loop = asyncio.get_running_loop()
        if self._loop is not None and self._loop is not loop and self.db.loop_bound:
            await self.engine.dispose(close=False)
        self._loop = loop

    async def _prepare(self) -> None:
        self._check_open()
        if self.owns_engine and self._loop is not asyncio.get_running_loop():
            await self._follow_loop()
        if not self._schema_ready:
            with connection_errors(self.engine):
                # Run to completion whatever cancels the caller: MySQL has no transactional
                # DDL, so a migration cut in half would leave half a schema behind, and on
                # aiosqlite a started statement must finish anyway (see _cancel).
                self.expiry = await run_to_completion(
                    ensure_schema(self.engine, self.names, create=self._create_tables)
                )
            if self.ttl is not None and not self.expiry:
                msg = (
                    f"ttl= needs the expires_at column, which the tables {self.names.sessions}/"
                    f"{self.names.messages} (created without migrations) do not have; run "
                    f"`{upgrade_command(self.engine.url, self.names)}`"
                )
                raise SchemaNotReadyError(msg)
            self._schema_ready = True

    def _operations(self) -> Operations:
        watched = observed(self.engine)
        ops = self._ops.get(watched)
        if ops is None:
            ops = self._ops[watched] = self.db.operations(
                self.engine, self.names, self.on_corrupt, self.keyring, expiry=self.expiry
            )
        return ops

    def _needs_prepare(self) -> bool:
        """Whether an operation must check the schema, the lifetime or the event loop first."""
        return (
            not self._schema_ready
            or self._closed
            or (self.owns_engine and self._loop is not asyncio.get_running_loop())
        )

    def _raise_typed(self, exc: BaseException) -> NoReturn:
        """Re-raise ``exc`` as our typed error where it is one (connection, busy, schema)."""
        with connection_errors(self.engine), schema_errors(self.engine, self.names):
            raise exc

    async def _run(self, op: Callable[[Operations], Coroutine[Any, Any, T]]) -> T:
        """Run one operation; errors come out typed. The happy path pays for a ``try``.

        What the database guarantees was not applied (a statement never sent, a
        deadlock victim rolled back whole) is run again (``_faults.retry_delay``).
        """
        if self._needs_prepare():  # (the hot path: one check, no extra await)
            await self._prepare()
        ops = self._operations()
        failures = 0
        while True:
            try:
                if getattr(ops, "settles", True):
                    return await op(ops)
                return await run_to_completion(op(ops))
            except (DBAPIError, OSError, RuntimeError) as exc:
                failures += 1
                delay = retry_delay(exc, failures, self.db)
                if delay is None:
                    self._raise_typed(exc)
                await asyncio.sleep(delay)

    @contextlib.asynccontextmanager
    async def _connection(self, *, write: bool, begin: bool) -> AsyncIterator[AsyncConnection]:
        with connection_errors(self.engine):
            await self._prepare()
            lock = self.state.writing() if write else self.state.reading()
            async with lock:
                opened = self.engine.begin() if begin else self.engine.connect()
                async with opened as conn:
                    with schema_errors(self.engine, self.names):
                        yield conn

    def reading(self) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        """A connection for a read outside the protocol (listing, metadata)."""
        return self._connection(write=False, begin=False)

    def transaction(self) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        """One transaction (commit on success, roll back on error) for a multi-statement write."""
        return self._connection(write=True, begin=True)

    async def retried(self, body: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """``body`` in one transaction, run again if the database rolled it back whole.

        A deadlock victim or a serialization failure (``_faults.retry_delay``) runs
        again from the start. For the multi-statement writes outside the operations
        (advanced sessions, the compaction swap, prune batches); the operations retry
        the same way in ``_run``. Not shielded from a cancel: callers that must finish
        wrap it (``run_to_completion``).
        """
        failures = 0
        while True:
            try:
                async with self.transaction() as conn:
                    return await body(conn)
            except DBAPIError as exc:
                failures += 1
                delay = retry_delay(exc, failures, self.db)
                if delay is None:
                    raise
                await asyncio.sleep(delay)

    def committing(self) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        """A write connection whose transaction the caller commits itself.

        For a write that holds something past its commit (a copy's table-set lock:
        MySQL's ``GET_LOCK`` outlives the transaction).
        """
        return self._connection(write=True, begin=False)

    async def close(self) -> None:
        """Dispose the engine if this backend created it; later operations raise."""
        if self._closed:
            return
        self._closed = True
        if self._finalizer is not None:
            self._finalizer.detach()
        if self.owns_engine:
            await self.engine.dispose()

    # -- the protocol -------------------------------------------------------------------------

    def deadline(self) -> object:
        """The deadline a write gives its session: now + ``ttl`` as the database binds it."""
        return None if self.ttl is None else self.db.stamp(utcnow() + self.ttl)

    async def statements(self) -> Statements:
        """The statements in force once the schema is checked: the expiry variant at head.

        ``st`` is the head variant, for what only runs at head; a write or read outside
        the operations that must follow the tables as they are (the compaction hook)
        takes these.
        """
        if self._needs_prepare():
            await self._prepare()
        return self.db.statements(self.names, self.expiry)

    async def add(self, session_id: str, data: Sequence[str]) -> None:
        """Append already-encoded items in one transaction (sealed first, with a keyring).

        With a ``ttl`` the session's deadline moves to now + ``ttl``; a session that
        had expired starts afresh (its old items go in the same transaction).
        """
        if data:
            if self.keyring is not None:
                data = self.keyring.encrypt_all(list(data))
            if self.ttl is None:  # (the hot path: no clock read)
                await self._run(lambda ops: ops.add(session_id, data))
                return
            expires = self.deadline()
            await self._run(lambda ops: ops.add(session_id, data, expires))

    async def get(self, session_id: str, limit: int | None) -> list[dict[str, Any]]:
        """All items, or the latest ``limit`` valid ones, oldest first."""
        if limit == 0:
            return []
        if limit is not None:
            check_sql_int("limit", limit)
        return await self._run(lambda ops: self._get(ops, session_id, limit))

    async def _get(
        self, ops: Operations, session_id: str, limit: int | None
    ) -> list[dict[str, Any]]:
        if limit is None:
            return decode_rows(
                await ops.everything(session_id), on_corrupt=self.on_corrupt, keyring=self.keyring
            )
        rows = await ops.latest(session_id, limit)
        items = decode_rows(reversed(rows), on_corrupt=self.on_corrupt, keyring=self.keyring)
        if len(items) < limit and len(rows) == limit:
            items = await self._refill(ops, session_id, items, limit, int(rows[-1][0]))
        return items

    async def _refill(
        self,
        ops: Operations,
        session_id: str,
        items: list[dict[str, Any]],
        limit: int,
        before: int,
    ) -> list[dict[str, Any]]:
        """Corrupt rows were skipped: read further back so ``limit`` still counts valid items."""
        while len(items) < limit:
            want = limit - len(items)
            rows = await ops.older(session_id, before, want)
            if not rows:
                break
            items = (
                decode_rows(reversed(rows), on_corrupt=self.on_corrupt, keyring=self.keyring)
                + items
            )
            before = int(rows[-1][0])
            if len(rows) < want:
                break
        return items

    async def iterate(self, session_id: str, batch_size: int) -> AsyncIterator[dict[str, Any]]:
        """Every item oldest first, fetched ``batch_size`` rows at a time (bounded memory)."""
        if batch_size < 1:
            msg = f"batch_size must be >= 1, got {batch_size}"
            raise ValueError(msg)
        check_sql_int("batch_size", batch_size)
        after = -1
        while True:
            rows = await self._batch(session_id, after, batch_size)
            for item in decode_rows(rows, on_corrupt=self.on_corrupt, keyring=self.keyring):
                yield item
            if len(rows) < batch_size:
                return
            after = int(rows[-1][0])

    async def _batch(self, session_id: str, after: int, n: int) -> Sequence[Any]:
        """One batch of ``iterate``: up to ``n`` rows above ``after``, oldest first."""
        return await self._run(lambda ops: ops.after(session_id, after, n))

    async def fetch(
        self, statement: Executable, params: dict[str, Any] | None = None
    ) -> Sequence[Row[Any]]:
        """Run one read and return all its rows (for the store's listings)."""
        failures = 0
        while True:
            try:
                async with self.reading() as conn:
                    return (await conn.execute(statement, params)).all()
            except DatabaseConnectionError as exc:  # a connection found dead before sending
                failures += 1
                cause = exc.__cause__
                if (
                    not isinstance(cause, DBAPIError)
                    or retry_delay(cause, failures, self.db) is None
                ):
                    raise

    async def pop(self, session_id: str) -> dict[str, Any] | None:
        """Atomically remove and return the newest valid item.

        A corrupt newest row holds no item to return: it is removed (with a warning)
        and the next one is popped. With ``on_corrupt="raise"`` the transaction rolls
        back instead, leaving the row for inspection.
        """
        return await self._run(lambda ops: ops.pop(session_id))

    async def clear(self, session_id: str, *, force: bool = False) -> bool:
        """Delete the session row and all its items at once; True if the session existed.

        Refused (the typed error, nothing deleted) when the keyring could not open
        one of its encrypted items, unless ``force``.
        """
        return await self._run(lambda ops: ops.clear(session_id, checked=not force))

    async def replace(self, session_id: str, data: Sequence[str]) -> None:
        """Swap the session's items for already-encoded ``data`` in one transaction.

        Sealed first with a keyring, as :meth:`add` does; a history holding items
        the keyring cannot open is refused whole (the typed error), as a clear is.
        """
        if self.keyring is not None:
            data = self.keyring.encrypt_all(list(data))
        expires = self.deadline()
        await self._run(lambda ops: ops.replace(session_id, data, expires))

    async def fork(self, session_id: str, new_session_id: str, skip: int | None) -> None:
        """Copy a session (row, items before user turn ``skip + 1``) to a new id, atomically.

        The target's primary key settles a race of forks to one id: the loser's
        unique-key error becomes :class:`SessionExistsError`, nothing written.
        """
        expires = self.deadline()  # the new session's deadline, as if written now
        try:
            await self._run(lambda ops: ops.fork(session_id, new_session_id, skip, expires))
        except DBAPIError as exc:
            if exc.orig is None or not self.db.duplicate_key(exc.orig):
                raise
            msg = (
                f"session {new_session_id!r} already exists, so it cannot be a fork of "
                f"{session_id!r}; nothing was written. Pick another id, or delete that "
                "session first (SessionStore.delete_session)"
            )
            raise SessionExistsError(msg) from exc
