"""The baseline: the bare async driver doing the fewest statements a correct store needs.

Same guarantees as ours, nothing more: every ``add_items`` is one transaction (so a batch
is all-or-nothing and contiguous), SQLite writers queue on one lock per database, each
pop claims its row once, and items are encoded before any write. Same schema and indexes
as ours (built from ``agents_memory.get_models``), same pragmas on SQLite.

SQLite (aiosqlite): one writer connection behind an ``asyncio.Lock`` and one reader
connection (WAL lets it read while the writer writes). ``add_items`` = upsert (bumping the
session's ``last_position`` by the batch size, ``RETURNING`` it) + executemany + commit;
reads are one ``execute_fetchall``; pop = ``DELETE ... RETURNING`` + commit.

MySQL/MariaDB (asyncmy): a pool; ``add_items`` = session upsert (``ON DUPLICATE KEY``,
which row-locks the session so concurrent batches stay contiguous, bumping its
``last_position``) + a read of that counter + executemany + commit;
pop = ``SELECT ... FOR UPDATE`` + ``DELETE`` + commit (MySQL has no ``DELETE ... RETURNING``);
clear = one ``DELETE`` of the session row, its items going by ``ON DELETE CASCADE``.

Postgres (asyncpg): a pool without the per-release ``RESET ALL`` round trip (the store never
changes session state), every operation one autocommitted statement: ``add_items`` is a
data-modifying CTE (session upsert returning the bumped ``last_position`` + ``unnest``
insert numbered below it), pop a ``FOR UPDATE`` sub-select.

Through a transaction-pooling PgBouncer the same, with ``statement_cache_size=0``, asyncpg's
documented PgBouncer setting: consecutive statements of one client may run on different
server connections, so named prepared statements are not safe. With the cache off asyncpg
uses the unnamed statement and sends its Parse again with the Bind, so each statement costs
two round trips (describe, then parse + bind + execute) where a cached one costs one.

Every raw store counts the connections it opens (``opened``; asyncmy's pool has no connect hook,
so on MySQL the distinct connections its pool hands out), which shows any churn.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiosqlite
import asyncmy
import asyncpg
from sqlalchemy.engine import make_url

from agents_memory import TableNames

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_loads = json.loads


def encode(items: list[dict[str, Any]]) -> list[str]:
    """Encode a batch before writing anything (json raises on what it cannot encode)."""
    return [_dumps(i) for i in items]


class RawSession:
    """A session-shaped handle over a raw store, so workloads call every store the same way."""

    __slots__ = ("_store", "session_id")

    def __init__(self, store: RawSqlite | RawPostgres | RawMysql, session_id: str) -> None:
        self._store = store
        self.session_id = session_id

    async def add_items(self, items: list[dict[str, Any]]) -> None:
        """Encode, then append in one transaction."""
        await self._store.add(self.session_id, encode(items))

    async def get_items(self, limit: int | None = None) -> list[dict[str, Any]]:
        """All items, or the latest ``limit``, oldest first."""
        return await self._store.get(self.session_id, limit)

    async def pop_item(self) -> dict[str, Any] | None:
        """Remove and return the newest item."""
        return await self._store.pop(self.session_id)

    async def clear_session(self) -> None:
        """Delete the session and its items."""
        await self._store.clear(self.session_id)


class RawSqlite:
    """aiosqlite: a writer connection behind a lock, a reader connection beside it."""

    def __init__(self, path: str, names: TableNames) -> None:
        self.path = path
        s, m = names.sessions, names.messages
        self.upsert = (
            f"INSERT INTO {s} (session_id, last_position) VALUES (?, ?) ON CONFLICT (session_id) "
            "DO UPDATE SET updated_at = CURRENT_TIMESTAMP, "
            "last_position = last_position + excluded.last_position RETURNING last_position"
        )
        self.insert = f"INSERT INTO {m} (session_id, position, message_data) VALUES (?, ?, ?)"
        self.latest = (
            f"SELECT position, message_data FROM {m} WHERE session_id = ? "
            "ORDER BY position DESC LIMIT ?"
        )
        self.all = f"SELECT position, message_data FROM {m} WHERE session_id = ? ORDER BY position"
        self.pop_sql = (
            f"DELETE FROM {m} WHERE session_id = ? AND position = (SELECT position FROM {m} "
            "WHERE session_id = ? ORDER BY position DESC LIMIT 1) RETURNING message_data"
        )
        self.del_messages = f"DELETE FROM {m} WHERE session_id = ?"
        self.del_session = f"DELETE FROM {s} WHERE session_id = ?"
        self.lock = asyncio.Lock()
        self.opened = 0
        self.writer: aiosqlite.Connection
        self.reader: aiosqlite.Connection

    async def _connect(self) -> aiosqlite.Connection:
        conn = await aiosqlite.connect(self.path)
        self.opened += 1
        for pragma in ("busy_timeout = 30000", "foreign_keys = ON", "journal_mode = WAL"):
            await conn.execute(f"PRAGMA {pragma}")
        return conn

    async def open(self) -> None:
        """Open the writer and the reader connection."""
        self.writer = await self._connect()
        self.reader = await self._connect()

    async def close(self) -> None:
        """Close both connections."""
        await self.writer.close()
        await self.reader.close()

    def session(self, session_id: str) -> RawSession:
        """A session handle (cheap)."""
        return RawSession(self, session_id)

    async def add(self, sid: str, data: list[str]) -> None:
        """Upsert the session and insert the rows in one transaction."""
        if not data:
            return
        w = self.writer
        async with self.lock:
            try:
                ((top,),) = await w.execute_fetchall(self.upsert, (sid, len(data)))
                first = top - len(data) + 1
                await w.executemany(self.insert, [(sid, first + i, d) for i, d in enumerate(data)])
                await w.commit()
            except BaseException:
                await w.rollback()
                raise

    async def get(self, sid: str, limit: int | None) -> list[dict[str, Any]]:
        """One SELECT, decoded oldest first."""
        r = self.reader
        if limit is None:
            rows = await r.execute_fetchall(self.all, (sid,))
            return [_loads(row[1]) for row in rows]
        rows = await r.execute_fetchall(self.latest, (sid, limit))
        return [_loads(row[1]) for row in reversed(list(rows))]

    async def pop(self, sid: str) -> dict[str, Any] | None:
        """Delete and return the newest row."""
        w = self.writer
        async with self.lock:
            try:
                rows = list(await w.execute_fetchall(self.pop_sql, (sid, sid)))
                await w.commit()
            except BaseException:
                await w.rollback()
                raise
        return _loads(rows[0][0]) if rows else None

    async def clear(self, sid: str) -> None:
        """Delete the items and the session row."""
        w = self.writer
        async with self.lock:
            try:
                await w.execute(self.del_messages, (sid,))
                await w.execute(self.del_session, (sid,))
                await w.commit()
            except BaseException:
                await w.rollback()
                raise


async def _no_reset(_conn: asyncpg.Connection) -> None:
    """The store never changes session state, so skip asyncpg's RESET ALL round trip."""


class RawPostgres:
    """asyncpg: one autocommitted statement per operation over a fixed-size pool."""

    def __init__(
        self, url: str, names: TableNames, pool_size: int, *, statement_cache_size: int = 100
    ) -> None:
        self.url = url
        self.pool_size = pool_size
        self.statement_cache_size = statement_cache_size
        """asyncpg's default (100), or 0 through a transaction-pooling PgBouncer."""
        self.opened = 0
        s, m = names.sessions, names.messages
        self.append = (
            f"WITH s AS (INSERT INTO {s} (session_id, last_position) VALUES ($1, $3) "
            "ON CONFLICT (session_id) DO UPDATE SET updated_at = CURRENT_TIMESTAMP, "
            f"last_position = {s}.last_position + $3 RETURNING last_position) "
            f"INSERT INTO {m} (session_id, position, message_data) "
            "SELECT $1, (SELECT last_position FROM s) - $3 + t.o, t.d "
            "FROM unnest($2::text[]) WITH ORDINALITY AS t(d, o) ORDER BY t.o"
        )
        self.latest = (
            f"SELECT position, message_data FROM {m} WHERE session_id = $1 "
            "ORDER BY position DESC LIMIT $2"
        )
        self.all = f"SELECT position, message_data FROM {m} WHERE session_id = $1 ORDER BY position"
        self.pop_sql = (
            f"DELETE FROM {m} WHERE session_id = $1 AND position = (SELECT position FROM {m} "
            "WHERE session_id = $1 ORDER BY position DESC LIMIT 1 FOR UPDATE) "
            "RETURNING message_data"
        )
        self.clear_sql = (
            f"WITH m AS (DELETE FROM {m} WHERE session_id = $1) "
            f"DELETE FROM {s} WHERE session_id = $1"
        )
        self.pool: asyncpg.Pool

    async def open(self) -> None:
        """Open the pool with all its connections."""
        self.pool = await asyncpg.create_pool(
            self.url,
            min_size=self.pool_size,
            max_size=self.pool_size,
            reset=_no_reset,
            init=self._count,
            statement_cache_size=self.statement_cache_size,
        )

    async def _count(self, _conn: asyncpg.Connection) -> None:
        self.opened += 1

    async def close(self) -> None:
        """Close the pool."""
        await self.pool.close()

    def session(self, session_id: str) -> RawSession:
        """A session handle (cheap)."""
        return RawSession(self, session_id)

    async def add(self, sid: str, data: list[str]) -> None:
        """Upsert the session and insert the rows in one transaction."""
        if data:
            await self.pool.execute(self.append, sid, data, len(data))

    async def get(self, sid: str, limit: int | None) -> list[dict[str, Any]]:
        """One SELECT, decoded oldest first."""
        if limit is None:
            rows = await self.pool.fetch(self.all, sid)
            return [_loads(row[1]) for row in rows]
        rows = await self.pool.fetch(self.latest, sid, limit)
        return [_loads(row[1]) for row in reversed(rows)]

    async def pop(self, sid: str) -> dict[str, Any] | None:
        """Delete and return the newest row."""
        row = await self.pool.fetchrow(self.pop_sql, sid)
        return None if row is None else _loads(row[0])

    async def clear(self, sid: str) -> None:
        """Delete the items and the session row."""
        await self.pool.execute(self.clear_sql, sid)


class RawMysql:
    """asyncmy: one transaction per write over a fixed-size pool, autocommitted reads."""

    def __init__(self, url: str, names: TableNames, pool_size: int) -> None:
        self.url = make_url(url)
        self.pool_size = pool_size
        s, m = names.sessions, names.messages
        self.upsert = (
            f"INSERT INTO {s} (session_id, last_position) VALUES (%s, %s) "
            "ON DUPLICATE KEY UPDATE updated_at = CURRENT_TIMESTAMP(6), "
            "last_position = last_position + %s"
        )
        self.counter = f"SELECT last_position FROM {s} WHERE session_id = %s"
        self.insert = f"INSERT INTO {m} (session_id, position, message_data) VALUES (%s, %s, %s)"
        self.latest = (
            f"SELECT position, message_data FROM {m} WHERE session_id = %s "
            "ORDER BY position DESC LIMIT %s"
        )
        self.all = f"SELECT position, message_data FROM {m} WHERE session_id = %s ORDER BY position"
        self.lock_newest = (
            f"SELECT position, message_data FROM {m} WHERE session_id = %s "
            "ORDER BY position DESC LIMIT 1 FOR UPDATE"
        )
        self.delete_one = f"DELETE FROM {m} WHERE session_id = %s AND position = %s"
        self.clear_sql = f"DELETE FROM {s} WHERE session_id = %s"
        self.pool: Any
        self.opened = 0
        self._seen: set[Any] = set()
        """Every connection the pool has handed out (asyncmy's pool has no connect hook)."""

    def _note(self, conn: Any) -> Any:
        if conn not in self._seen:
            self._seen.add(conn)
            self.opened += 1
        return conn

    async def open(self) -> None:
        """Open the pool with all its connections."""
        u = self.url
        self.pool = await asyncmy.create_pool(
            host=u.host or "127.0.0.1",
            port=u.port or 3306,
            user=u.username or "root",
            password=u.password or "",
            db=u.database,
            charset="utf8mb4",
            minsize=self.pool_size,
            maxsize=self.pool_size,
            autocommit=True,
        )

    async def close(self) -> None:
        """Close the pool."""
        self.pool.close()
        await self.pool.wait_closed()
        self._seen.clear()

    def session(self, session_id: str) -> RawSession:
        """A session handle (cheap)."""
        return RawSession(self, session_id)

    async def _write(self, statements: list[tuple[str, Any, bool]]) -> list[Any]:
        async with self.pool.acquire() as conn:
            self._note(conn)
            await conn.begin()
            try:
                out: list[Any] = []
                async with conn.cursor() as cur:
                    for sql, args, many in statements:
                        await (cur.executemany if many else cur.execute)(sql, args)
                        out.append(await cur.fetchall() if cur.description else None)
                await conn.commit()
            except BaseException:
                await conn.rollback()
                raise
        return out

    async def add(self, sid: str, data: list[str]) -> None:
        """Upsert (and lock) the session, insert the rows, commit."""
        if not data:
            return
        n = len(data)
        async with self.pool.acquire() as conn:
            self._note(conn)
            await conn.begin()
            try:
                async with conn.cursor() as cur:
                    await cur.execute(self.upsert, (sid, n, n))
                    await cur.execute(self.counter, (sid,))
                    ((top,),) = await cur.fetchall()
                    first = top - n + 1
                    rows = [(sid, first + i, d) for i, d in enumerate(data)]
                    await cur.executemany(self.insert, rows)
                await conn.commit()
            except BaseException:
                await conn.rollback()
                raise

    async def get(self, sid: str, limit: int | None) -> list[dict[str, Any]]:
        """One SELECT, decoded oldest first."""
        async with self.pool.acquire() as conn, self._note(conn).cursor() as cur:
            if limit is None:
                await cur.execute(self.all, (sid,))
                return [_loads(row[1]) for row in await cur.fetchall()]
            await cur.execute(self.latest, (sid, limit))
            return [_loads(row[1]) for row in reversed(await cur.fetchall())]

    async def pop(self, sid: str) -> dict[str, Any] | None:
        """Lock the newest row, delete it, commit."""
        async with self.pool.acquire() as conn:
            self._note(conn)
            await conn.begin()
            try:
                async with conn.cursor() as cur:
                    await cur.execute(self.lock_newest, (sid,))
                    row = await cur.fetchone()
                    if row is not None:
                        await cur.execute(self.delete_one, (sid, row[0]))
                await conn.commit()
            except BaseException:
                await conn.rollback()
                raise
        return None if row is None else _loads(row[1])

    async def clear(self, sid: str) -> None:
        """Delete the session row; its items go by cascade."""
        await self._write([(self.clear_sql, (sid,), False)])
