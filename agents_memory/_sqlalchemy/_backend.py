"""The operations themselves, shared by every session and store on one engine and name set.

A session object is cheap (a backend and an id); the backend keeps the
prepared statements and the engine's shared write lock.

Each operation runs on the driver itself when it can (``_driver``: aiosqlite or
asyncpg, on an engine that nobody observes with ``echo`` or execution events),
and through SQLAlchemy Core otherwise; both run the same SQL with the same
guarantees, errors and cancellation behaviour.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

from sqlalchemy import Executable, Row
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agents_memory._codec import OnCorrupt, decode_row, decode_rows
from agents_memory._errors import SessionClosedError
from agents_memory._sqlalchemy import _lite
from agents_memory._sqlalchemy._cancel import cancel_safe
from agents_memory._sqlalchemy._driver import DriverPath, Reads, observed
from agents_memory._sqlalchemy._engine import EngineState, engine_state
from agents_memory._sqlalchemy._faults import connection_errors, retry_when_safe
from agents_memory._sqlalchemy._mysql import check_packet_size, max_packet
from agents_memory._sqlalchemy._pg import PgPath
from agents_memory._sqlalchemy._schema import ensure_schema, schema_errors
from agents_memory._sqlalchemy._statements import Statements, statements_for
from agents_memory._tables import TableNames

T = TypeVar("T")


def _driver_path(
    engine: AsyncEngine, state: EngineState, st: Statements, on_corrupt: OnCorrupt
) -> DriverPath | None:
    """The driver path for this engine's driver, or None where only SQLAlchemy's will do."""
    driver = engine.dialect.driver
    if st.driver is None:
        return None
    if driver == "aiosqlite" and _lite.supported():
        return _lite.LitePath(engine, state, st.driver, on_corrupt)
    if driver == "asyncpg":
        return PgPath(engine, st.driver, on_corrupt)
    return None


class _CoreReads:
    """The driver path's reads, run through SQLAlchemy on one connection (``Reads``)."""

    def __init__(self, conn: AsyncConnection, st: Statements) -> None:
        self._conn = conn
        self._st = st

    async def _rows(self, statement: Executable, params: dict[str, Any]) -> Sequence[Row[Any]]:
        return (await self._conn.execute(statement, params)).all()

    async def latest(self, session_id: str, n: int) -> Sequence[Row[Any]]:
        return await self._rows(self._st.select_latest, {"sid": session_id, "n": n})

    async def everything(self, session_id: str) -> Sequence[Row[Any]]:
        return await self._rows(self._st.select_all, {"sid": session_id})

    async def after(self, session_id: str, after: int, n: int) -> Sequence[Row[Any]]:
        params = {"sid": session_id, "after": after, "n": n}
        return await self._rows(self._st.select_after, params)

    async def older(self, session_id: str, before: int, n: int) -> Sequence[Row[Any]]:
        params = {"sid": session_id, "before": before, "n": n}
        return await self._rows(self._st.select_older, params)


class Backend:
    """Runs the protocol's operations for any session id against one engine and name set."""

    def __init__(
        self,
        engine: AsyncEngine,
        names: TableNames,
        *,
        create_tables: bool = False,
        on_corrupt: OnCorrupt = "skip",
    ) -> None:
        if on_corrupt not in ("skip", "raise"):
            msg = f"on_corrupt must be 'skip' or 'raise', got {on_corrupt!r}"
            raise ValueError(msg)
        self.engine = engine
        self.names = names
        self.on_corrupt: OnCorrupt = on_corrupt
        self.owns_engine = False
        """Whether this backend created its engine (``from_url``): it then disposes of it."""
        self.state: EngineState = engine_state(engine)
        self.st: Statements = statements_for(names, self.state.dialect)
        self._pg = self.state.dialect == "postgresql"
        # One statement per operation on Postgres: no BEGIN/COMMIT round trips needed.
        self._autocommit = (
            engine.execution_options(isolation_level="AUTOCOMMIT") if self._pg else engine
        )
        self._max_packet: int | None = None  # MySQL's statement size limit, read once
        self._create_tables = create_tables
        self._schema_ready = False
        self._closed = False
        self._driver: DriverPath | None = _driver_path(engine, self.state, self.st, on_corrupt)
        # The event loop our server connections were opened on (engines we own only).
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- plumbing -----------------------------------------------------------------------------

    @property
    def interruptible(self) -> bool:
        """Only Postgres may have a statement cut short by a cancel (see ``_cancel``)."""
        return self._pg

    def _check_open(self) -> None:
        if self._closed:
            msg = "this session's engine was closed with close(); create a new session"
            raise SessionClosedError(msg)

    def _on_other_loop(self) -> bool:
        """Whether this call runs on another event loop than our owned engine's connections."""
        return self.owns_engine and self._loop is not asyncio.get_running_loop()

    async def _follow_loop(self) -> None:
        """Start a fresh pool when an engine we own is used from a new event loop.

        A script that calls ``asyncio.run()`` twice, or a test suite with a loop per
        test, would otherwise get server connections whose sockets belong to a loop
        that has ended. Nobody else uses an engine we created, so its pool is
        replaced without closing the old connections (their loop is gone). SQLite
        needs none of this: aiosqlite connections work from any loop, and an
        in-memory database lives in its one connection.
        """
        loop = asyncio.get_running_loop()
        if self._loop is not None and self._loop is not loop and self.state.dialect != "sqlite":
            await self.engine.dispose(close=False)
        self._loop = loop

    async def _prepare(self) -> None:
        self._check_open()
        if self._on_other_loop():
            await self._follow_loop()
        if not self._schema_ready:
            await ensure_schema(self.engine, self.names, create=self._create_tables)
            self._schema_ready = True

    async def _fast(self) -> DriverPath | None:
        """Prepare for an operation; the driver path to run it on, if this engine allows one."""
        with connection_errors(self.engine):
            await self._prepare()
        return self._direct()

    @contextlib.contextmanager
    def _driver_errors(self) -> Iterator[None]:
        """The same error translation as the SQLAlchemy path's ``_read`` and ``_write``."""
        with connection_errors(self.engine), schema_errors(self.engine, self.names):
            yield

    @contextlib.asynccontextmanager
    async def _read(self) -> AsyncIterator[AsyncConnection]:
        with connection_errors(self.engine):
            await self._prepare()
            async with self.state.reading(), self._autocommit.connect() as conn:
                with schema_errors(self.engine, self.names):
                    yield conn

    @contextlib.asynccontextmanager
    async def _write(self, *, single_statement: bool) -> AsyncIterator[AsyncConnection]:
        """Open a connection for one write, holding the engine's write lock where needed.

        A single statement runs in autocommit on Postgres (it is atomic on its own);
        anything else is a transaction that commits on success and rolls back on error.
        """
        with connection_errors(self.engine):
            await self._prepare()
            async with self.state.writing():
                if single_statement and self._pg:
                    async with self._autocommit.connect() as conn:
                        with schema_errors(self.engine, self.names):
                            yield conn
                else:
                    async with self.engine.begin() as conn:
                        with schema_errors(self.engine, self.names):
                            yield conn

    def reading(self) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        """A connection for a read outside the protocol (listing, metadata)."""
        return self._read()

    def writing(self) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        """A connection for one single-statement write outside the protocol."""
        return self._write(single_statement=True)

    def transaction(self) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        """One transaction (commit on success, roll back on error) for a multi-statement write."""
        return self._write(single_statement=False)

    async def close(self) -> None:
        """Dispose the engine if this backend created it; later operations raise."""
        if self._closed:
            return
        self._closed = True
        if self.owns_engine:
            await self.engine.dispose()

    # -- the protocol -------------------------------------------------------------------------
    #
    # Each operation first tries the driver path directly (``_direct``), with no wrapper:
    # that is the hot path. The first call on a backend (schema not yet checked), a closed
    # backend and an observed engine go through the wrapped method instead, which prepares,
    # is cancel-safe, retries what is safe to retry, and still prefers the driver path.

    def _direct(self) -> DriverPath | None:
        """The driver path, if this operation can take it with no wrapper around it.

        That needs the schema checked, an open backend and an unobserved engine; the
        driver paths handle cancellation themselves (asyncpg: the server cancels the
        statement; aiosqlite: a started job finishes before the cancel is raised).
        """
        driver = self._driver
        if driver is not None and self._schema_ready and not self._closed:
            return None if observed(self.engine) or self._on_other_loop() else driver
        return None

    @retry_when_safe
    async def _on_driver(
        self,
        op: Callable[..., Awaitable[T]],
        *args: Any,  # noqa: ANN401
    ) -> T:
        """Run ``op(*args)`` on the driver path, with the SQLAlchemy path's error translation.

        The translation is entered only once an error is raised: the happy path pays
        for a ``try`` and nothing else.
        """
        try:
            return await op(*args)
        except (DBAPIError, OSError, RuntimeError):
            with self._driver_errors():
                raise

    async def add(self, session_id: str, data: Sequence[str]) -> None:
        """Append already-encoded items in one transaction."""
        if not data:
            return
        if fast := self._direct():
            await self._on_driver(fast.add, session_id, data)
            return
        await self._add(session_id, data)

    @cancel_safe
    @retry_when_safe
    async def _add(self, session_id: str, data: Sequence[str]) -> None:
        if fast := await self._fast():
            with self._driver_errors():
                await fast.add(session_id, data)
            return
        st = self.st
        if st.append is not None:
            async with self._write(single_statement=True) as conn:
                await conn.execute(st.append, {"sid": session_id, "data": list(data)})
            return
        async with self._write(single_statement=False) as conn:
            if self.state.dialect == "mysql":
                if self._max_packet is None:
                    self._max_packet = await max_packet(conn)
                check_packet_size(data, self._max_packet)
            await conn.execute(st.upsert_session, {"sid": session_id})
            await conn.execute(st.insert_messages, [{"sid": session_id, "data": d} for d in data])

    async def get(self, session_id: str, limit: int | None) -> list[dict[str, Any]]:
        """All items, or the latest ``limit`` valid ones, oldest first."""
        if limit == 0:
            return []
        if fast := self._direct():
            return await self._on_driver(self._get_on, fast, session_id, limit)
        return await self._get(session_id, limit)

    async def _get_on(
        self, reads: Reads, session_id: str, limit: int | None
    ) -> list[dict[str, Any]]:
        """``get`` on either path: the driver's, or SQLAlchemy's (``_CoreReads``)."""
        if limit is None:
            return decode_rows(await reads.everything(session_id), on_corrupt=self.on_corrupt)
        rows = await reads.latest(session_id, limit)
        items = decode_rows(reversed(rows), on_corrupt=self.on_corrupt)
        if len(items) < limit and len(rows) == limit:
            older = functools.partial(reads.older, session_id)
            items = await self._refill(older, items, limit, int(rows[-1][0]))
        return items

    @cancel_safe
    @retry_when_safe
    async def _get(self, session_id: str, limit: int | None) -> list[dict[str, Any]]:
        if fast := await self._fast():
            with self._driver_errors():
                return await self._get_on(fast, session_id, limit)
        async with self._read() as conn:
            return await self._get_on(_CoreReads(conn, self.st), session_id, limit)

    async def _refill(
        self,
        older: Callable[[int, int], Awaitable[Sequence[Any]]],
        items: list[dict[str, Any]],
        limit: int,
        before: int,
    ) -> list[dict[str, Any]]:
        """Corrupt rows were skipped: read further back so ``limit`` still counts valid items."""
        while len(items) < limit:
            want = limit - len(items)
            rows = await older(before, want)
            if not rows:
                break
            items = decode_rows(reversed(rows), on_corrupt=self.on_corrupt) + items
            before = int(rows[-1][0])
            if len(rows) < want:
                break
        return items

    async def iterate(self, session_id: str, batch_size: int) -> AsyncIterator[dict[str, Any]]:
        """Every item oldest first, fetched ``batch_size`` rows at a time (bounded memory)."""
        if batch_size < 1:
            msg = f"batch_size must be >= 1, got {batch_size}"
            raise ValueError(msg)
        after = -1
        while True:
            if fast := self._direct():
                rows = await self._on_driver(fast.after, session_id, after, batch_size)
            else:
                rows = await self._batch(session_id, after, batch_size)
            for item in decode_rows(rows, on_corrupt=self.on_corrupt):
                yield item
            if len(rows) < batch_size:
                return
            after = int(rows[-1][0])

    @cancel_safe
    @retry_when_safe
    async def _batch(self, session_id: str, after: int, n: int) -> Sequence[Any]:
        """One batch of ``iterate``: up to ``n`` rows above ``after``, oldest first."""
        if fast := await self._fast():
            with self._driver_errors():
                return await fast.after(session_id, after, n)
        async with self._read() as conn:
            return await _CoreReads(conn, self.st).after(session_id, after, n)

    @cancel_safe
    @retry_when_safe
    async def fetch(
        self, statement: Executable, params: dict[str, Any] | None = None
    ) -> Sequence[Row[Any]]:
        """Run one read and return all its rows (for streaming and the store's listings)."""
        async with self._read() as conn:
            return (await conn.execute(statement, params)).all()

    async def pop(self, session_id: str) -> dict[str, Any] | None:
        """Atomically remove and return the newest valid item.

        A corrupt newest row holds no item to return: it is removed (with a warning)
        and the next one is popped. With ``on_corrupt="raise"`` the transaction rolls
        back instead, leaving the row for inspection.
        """
        if fast := self._direct():
            return await self._on_driver(fast.pop, session_id)
        return await self._pop(session_id)

    @cancel_safe
    @retry_when_safe
    async def _pop(self, session_id: str) -> dict[str, Any] | None:
        if fast := await self._fast():
            with self._driver_errors():
                return await fast.pop(session_id)
        # MySQL has no DELETE ... RETURNING: the newest row is locked (FOR UPDATE), then
        # deleted, in one transaction, so it is still returned by exactly one caller.
        st = self.st
        single = self.on_corrupt == "skip" and st.pop_delete is None
        while True:
            async with self._write(single_statement=single) as conn:
                row = (await conn.execute(st.pop, {"sid": session_id})).first()
                if row is None:
                    return None
                if st.pop_delete is not None:
                    await conn.execute(st.pop_delete, {"id": row[0]})
                item = decode_row(row[1], row_id=row[0], on_corrupt=self.on_corrupt)
            if item is not None:
                return item

    async def clear(self, session_id: str) -> bool:
        """Delete the session row and all its items at once; True if the session existed."""
        if fast := self._direct():
            return await self._on_driver(fast.clear, session_id)
        return await self._clear(session_id)

    @cancel_safe
    @retry_when_safe
    async def _clear(self, session_id: str) -> bool:
        if fast := await self._fast():
            with self._driver_errors():
                return await fast.clear(session_id)
        st = self.st
        if st.clear is not None:
            async with self._write(single_statement=True) as conn:
                result = await conn.execute(st.clear, {"sid": session_id})
                return bool(result.rowcount)
        async with self._write(single_statement=False) as conn:
            await conn.execute(st.delete_messages, {"sid": session_id})
            result = await conn.execute(st.delete_session, {"sid": session_id})
            return bool(result.rowcount)
