"""The aiosqlite hot path: each operation is one job on a connection's own thread.

aiosqlite runs every call on the connection's thread and then wakes the event
loop: one such hop costs 50-150 µs here, more than our statements. Through
SQLAlchemy a read took five hops (cursor, execute, fetch, cursor close, and the
pool's rollback-on-return) and an append six or more. Here:

* a write is one job that runs ``BEGIN IMMEDIATE ... COMMIT`` on the connection's
  thread and rolls back on any error: atomic in one hop, and a caller cancelled
  while it runs cannot leave a transaction open (the job finishes either way, and
  the cancel is raised once it has: ``_settle``);
* a read is one ``execute_fetchall``: one hop;
* a few connections are kept instead of being checked in after each operation,
  which would cost the rollback hop: they are detached from the engine's pool
  (so they do not use up its slots) and closed when the engine is disposed.
  In-memory databases (one shared connection) are never detached.

Writers still queue on the engine's write lock, so SQLite writers are serialised
per engine; readers run on their own connections, beside a write, under WAL.

The one-job writes need aiosqlite's ``Connection._execute`` (aiosqlite 0.17 up to
at least 0.22); without it the SQLAlchemy path is used.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

import aiosqlite
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import PoolProxiedConnection, StaticPool
from sqlalchemy.util import greenlet_spawn
from sqlalchemy.util.concurrency import in_greenlet

from agents_memory import _sqlite_jobs as sqlite_jobs
from agents_memory._codec import OnCorrupt
from agents_memory._sqlalchemy._driver import Row, await_in_greenlet, wrap_error
from agents_memory._sqlalchemy._engine import EngineState
from agents_memory._sqlalchemy._statements import DriverSQL

T = TypeVar("T")

KEEP = 2
"""Connections kept per engine: a writer and a reader at once is the common case."""


def supported() -> bool:
    """Whether the installed aiosqlite lets us run a whole transaction as one job."""
    return callable(getattr(aiosqlite.Connection, "_execute", None)) and isinstance(
        getattr(aiosqlite.Connection, "_conn", None), property
    )


def _nothing() -> None:
    """A job that only marks its place in the connection's queue."""


async def _settle(driver: aiosqlite.Connection) -> None:
    """Wait, through any further cancels, until the jobs queued on ``driver`` have run.

    A cancel cannot stop a job on the connection's thread: the transaction runs on
    to its COMMIT (or rollback). Raising the cancel only after that keeps the write
    lock held and the connection out of use until then, and leaves the session
    fully before or fully after the operation when the caller sees the cancel.
    Jobs run in order, so a no-op queued behind the job finishes after it.
    """
    marker = asyncio.ensure_future(driver._execute(_nothing))  # type: ignore[no-untyped-call]  # noqa: SLF001
    while not marker.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(marker)
    if not marker.cancelled():
        marker.exception()  # retrieved: a closed connection has nothing left to wait for


# -- kept connections ---------------------------------------------------------------------------


class _Lease:
    """A connection in use: the pool's proxy, the aiosqlite connection, and whether it is kept."""

    __slots__ = ("driver", "fairy", "generation", "kept")

    def __init__(
        self,
        fairy: PoolProxiedConnection,
        driver: aiosqlite.Connection,
        *,
        kept: bool,
        generation: int,
    ) -> None:
        self.fairy = fairy
        self.driver = driver
        self.kept = kept
        self.generation = generation


class _Keeper:
    """The connections kept for one engine; dropped (and closed) when the engine is disposed."""

    def __init__(self, sync_engine: Engine) -> None:
        self._idle: list[_Lease] = []
        self._kept = 0
        self._generation = 0
        self._detachable = not isinstance(sync_engine.pool, StaticPool)
        # The listener holds the keeper, not the other way round: no reference to the engine.
        event.listen(sync_engine, "engine_disposed", self._disposed)

    def idle(self) -> _Lease | None:
        """A kept connection free right now (the usual case: no await needed)."""
        return self._idle.pop() if self._idle else None

    async def acquire(self, engine: AsyncEngine) -> _Lease:
        """A kept connection, a new one to keep, or (all kept ones busy) a pooled one."""
        if self._idle:
            return self._idle.pop()
        fairy = await engine.raw_connection()
        # Read the driver connection before detach(), which forgets it.
        driver: aiosqlite.Connection = fairy.driver_connection  # type: ignore[assignment]
        if self._detachable and self._kept < KEEP:
            fairy.detach()
            self._kept += 1
            return _Lease(fairy, driver, kept=True, generation=self._generation)
        return _Lease(fairy, driver, kept=False, generation=self._generation)

    def keep(self, lease: _Lease, *, broken: bool) -> bool:
        """Put a kept connection back for the next operation; False if it must be closed."""
        if not lease.kept or lease.generation != self._generation:
            return False
        if broken:
            self._kept -= 1
            return False
        self._idle.append(lease)
        return True

    def _disposed(self, _engine: Engine) -> None:
        """The engine was disposed: close what is idle; what is in use closes on release.

        A kept connection is detached, so closing it is ours to do: awaited inside
        ``AsyncEngine.dispose()`` (a greenlet), merely queued on its thread when a
        plain ``Engine.dispose()`` is called outside one. Disposal must not fail on
        one bad connection.
        """
        self._generation += 1
        self._kept = 0
        idle, self._idle = self._idle, []
        for lease in idle:
            with contextlib.suppress(Exception):
                if in_greenlet():
                    await_in_greenlet(lease.driver.close())
                else:
                    lease.driver.stop()


_keepers: weakref.WeakKeyDictionary[Engine, _Keeper] = weakref.WeakKeyDictionary()


def _keeper(engine: AsyncEngine) -> _Keeper:
    sync_engine = engine.sync_engine
    keeper = _keepers.get(sync_engine)
    if keeper is None:
        keeper = _keepers[sync_engine] = _Keeper(sync_engine)
    return keeper


class LitePath:
    """The protocol's operations as aiosqlite jobs (see ``agents_memory._sqlalchemy._driver``)."""

    def __init__(
        self, engine: AsyncEngine, state: EngineState, sql: DriverSQL, on_corrupt: OnCorrupt
    ) -> None:
        self._engine = engine
        self._state = state
        self._sql = sql
        self._on_corrupt = on_corrupt
        self._keeper = _keeper(engine)

    async def _release(self, lease: _Lease, *, broken: bool = False) -> None:
        if self._keeper.keep(lease, broken=broken):
            return
        # Shielded, as SQLAlchemy shields its own close: a cancellation must not cut a
        # close or the pool's rollback-on-return short (a StaticPool would lose its
        # one connection).
        if lease.kept:  # detached from the pool: close it ourselves
            with contextlib.suppress(Exception):
                await asyncio.shield(lease.driver.close())
        else:
            await asyncio.shield(greenlet_spawn(lease.fairy.close))

    async def _fail(
        self, lease: _Lease, exc: BaseException, statement: str, params: object
    ) -> NoReturn:
        """Release ``lease`` and raise ``exc`` as SQLAlchemy's execution would raise it.

        A database error becomes its ``sqlalchemy.exc`` class; a connection that is
        gone is closed (a pooled one invalidated) rather than reused. Anything else
        (a cancel, a bad argument) is raised as it is.
        """
        if not isinstance(exc, Exception):
            await self._release(lease)
            raise exc
        err, gone = wrap_error(exc, self._engine, lease.fairy.dbapi_connection, statement, params)
        if gone and not lease.kept:
            lease.fairy.invalidate(err)
        await self._release(lease, broken=gone)
        if err is exc:
            raise exc
        raise err from exc

    # The two runners below are written out, not shared through a context manager:
    # on reads of a few rows that layer measured as a visible share of the call.

    async def _job(self, statement: str, job: Callable[..., T], *args: Any) -> T:  # noqa: ANN401
        """Run ``job(sqlite3_connection, *args)`` as one call on a connection's thread."""
        async with self._state.lock():  # SQLite: writers always queue (EngineState.writing)
            lease = self._keeper.idle() or await self._keeper.acquire(self._engine)
            driver = lease.driver
            try:
                result: T = await driver._execute(job, driver._conn, *args)  # type: ignore[no-untyped-call]  # noqa: SLF001
            except BaseException as exc:  # noqa: BLE001 - _fail releases the lease and re-raises
                if isinstance(exc, asyncio.CancelledError):
                    await _settle(driver)
                await self._fail(lease, exc, statement, args[1:])
            if not self._keeper.keep(lease, broken=False):
                await self._release(lease)
            return result

    async def _fetch(self, statement: str, params: dict[str, Any]) -> Sequence[Row]:
        if not self._state.serialize_all:  # (the usual case: readers need no lock)
            return await self._fetch_unlocked(statement, params)
        async with self._state.reading():
            return await self._fetch_unlocked(statement, params)

    async def _fetch_unlocked(self, statement: str, params: dict[str, Any]) -> Sequence[Row]:
        lease = self._keeper.idle() or await self._keeper.acquire(self._engine)
        try:
            rows: Sequence[Row] = await lease.driver.execute_fetchall(statement, params)  # type: ignore[assignment]
        except BaseException as exc:  # noqa: BLE001 - _fail releases the lease and re-raises
            await self._fail(lease, exc, statement, params)
        if not self._keeper.keep(lease, broken=False):
            await self._release(lease)
        return rows

    async def add(self, session_id: str, data: Sequence[str]) -> None:
        """Upsert the session and insert every item in one transaction (one job)."""
        await self._job(self._sql.insert_message, sqlite_jobs.add, self._sql, session_id, data)

    async def latest(self, session_id: str, n: int) -> Sequence[Row]:
        """The newest ``n`` rows, newest first."""
        return await self._fetch(self._sql.select_latest, {"sid": session_id, "n": n})

    async def everything(self, session_id: str) -> Sequence[Row]:
        """Every row, oldest first."""
        return await self._fetch(self._sql.select_all, {"sid": session_id})

    async def after(self, session_id: str, after: int, n: int) -> Sequence[Row]:
        """Up to ``n`` rows above ``after``, oldest first."""
        return await self._fetch(
            self._sql.select_after, {"sid": session_id, "after": after, "n": n}
        )

    async def older(self, session_id: str, before: int, n: int) -> Sequence[Row]:
        """Up to ``n`` rows below ``before``, newest first."""
        params = {"sid": session_id, "before": before, "n": n}
        return await self._fetch(self._sql.select_older, params)

    async def pop(self, session_id: str) -> dict[str, Any] | None:
        """Remove and return the newest valid item in one transaction (one job)."""
        return await self._job(
            self._sql.pop, sqlite_jobs.pop, self._sql, session_id, self._on_corrupt
        )

    async def clear(self, session_id: str) -> bool:
        """Delete items and session row in one transaction (one job)."""
        return await self._job(self._sql.delete_session, sqlite_jobs.clear, self._sql, session_id)
