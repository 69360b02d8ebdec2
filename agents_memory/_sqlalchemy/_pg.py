"""The asyncpg hot path: one statement per operation on a connection from the engine's pool.

Each operation is a single statement (see ``DriverSQL``), so it runs outside any
transaction and is atomic on its own: one round trip, no BEGIN/COMMIT. asyncpg
prepares and caches the statement per connection. Nothing serialises writers:
throughput grows with the pool.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import greenlet_spawn

from agents_memory._codec import OnCorrupt, decode_row
from agents_memory._sqlalchemy._driver import Row, await_in_greenlet, wrap_error
from agents_memory._sqlalchemy._statements import DriverSQL

T = TypeVar("T")


class PgPath:
    """The protocol's operations as asyncpg calls (see ``agents_memory._sqlalchemy._driver``)."""

    def __init__(self, engine: AsyncEngine, sql: DriverSQL, on_corrupt: OnCorrupt) -> None:
        self._engine = engine
        self._sql = sql
        self._on_corrupt = on_corrupt

    async def _run(
        self, statement: str, params: tuple[Any, ...], call: Callable[[Any], Awaitable[T]]
    ) -> T:
        """Run ``call(asyncpg_connection)`` on a pooled connection; errors as SQLAlchemy's.

        Checkout, the call and checkin share one greenlet (as in SQLAlchemy's own
        execution), which costs less than a greenlet for checkout and one for checkin.
        """
        result: T = await greenlet_spawn(self._run_in_greenlet, statement, params, call)
        return result

    def _run_in_greenlet(
        self, statement: str, params: tuple[Any, ...], call: Callable[[Any], Awaitable[T]]
    ) -> T:
        fairy = self._engine.sync_engine.raw_connection()
        try:
            result: T = await_in_greenlet(call(fairy.driver_connection))
        except Exception as exc:
            err, gone = wrap_error(exc, self._engine, fairy.dbapi_connection, statement, params)
            if gone:
                fairy.invalidate(err)
            fairy.close()
            if err is exc:
                raise
            raise err from exc
        except BaseException:
            # Cancelled mid-statement: the connection's state is unknown, so it is not
            # reused (as SQLAlchemy itself does).
            fairy.invalidate()
            fairy.close()
            raise
        fairy.close()
        return result

    async def add(self, session_id: str, data: Sequence[str]) -> None:
        """Upsert the session and insert every item in one statement."""
        sql, args = self._sql.append, (session_id, list(data))
        await self._run(sql, args, lambda c: c.execute(sql, *args))

    async def _fetch(self, sql: str, *args: Any) -> Sequence[Row]:  # noqa: ANN401
        rows: Sequence[Row] = await self._run(sql, args, lambda c: c.fetch(sql, *args))
        return rows

    async def latest(self, session_id: str, n: int) -> Sequence[Row]:
        """The newest ``n`` rows, newest first."""
        return await self._fetch(self._sql.select_latest, session_id, n)

    async def everything(self, session_id: str) -> Sequence[Row]:
        """Every row, oldest first."""
        return await self._fetch(self._sql.select_all, session_id)

    async def after(self, session_id: str, after: int, n: int) -> Sequence[Row]:
        """Up to ``n`` rows above ``after``, oldest first."""
        return await self._fetch(self._sql.select_after, session_id, after, n)

    async def older(self, session_id: str, before: int, n: int) -> Sequence[Row]:
        """Up to ``n`` rows below ``before``, newest first."""
        return await self._fetch(self._sql.select_older, session_id, before, n)

    async def pop(self, session_id: str) -> dict[str, Any] | None:
        """Delete and return the newest row; ``FOR UPDATE`` makes each row go to one popper.

        A corrupt row is removed with a warning and the next one is popped; with
        ``on_corrupt="raise"`` the delete runs in a transaction that rolls back,
        leaving the row for inspection.
        """
        sql, args = self._sql.pop, (session_id,)
        if self._on_corrupt == "raise":

            async def in_transaction(conn: Any) -> dict[str, Any] | None:  # noqa: ANN401
                async with conn.transaction():
                    row = await conn.fetchrow(sql, session_id)
                    return (
                        None
                        if row is None
                        else decode_row(row[1], row_id=row[0], on_corrupt="raise")
                    )

            return await self._run(sql, args, in_transaction)
        while True:
            row = await self._run(sql, args, lambda c: c.fetchrow(sql, *args))
            if row is None:
                return None
            item = decode_row(row[1], row_id=row[0], on_corrupt="skip")
            if item is not None:
                return item

    async def clear(self, session_id: str) -> bool:
        """Delete items and session row in one statement; whether the session existed."""
        sql, args = self._sql.clear, (session_id,)
        status: str = await self._run(sql, args, lambda c: c.execute(sql, *args))
        return status.rsplit(" ", 1)[-1] != "0"
