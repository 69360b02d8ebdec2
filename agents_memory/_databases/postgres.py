"""Postgres: one statement per operation, asyncpg on detached connections, safe behind PgBouncer.

Every operation is a single statement, atomic on its own, so it runs outside
any explicit transaction: one round trip. ``add_items`` is a data-modifying CTE
(the session row upserted, and row-locked, before the first item id is drawn,
so concurrent batches to one session stay contiguous); a pop deletes the newest
row found by a ``FOR UPDATE`` sub-select (a concurrent popper waits, then moves
to the next row: each item is claimed once); a clear deletes both in one CTE.

**Prepared statements and poolers.** asyncpg names the statements it caches
``__asyncpg_stmt_N__``, numbered per process. Behind PgBouncer in transaction
pooling mode a client's next statement may run on a server connection another
process prepared, where that name means *another* statement: executed with
our arguments, a read of one session ran another process's ``DELETE``. So:

* our statements are prepared under names derived from their text
  (``__agents_memory_<sha1>__``): the same name is always the same statement,
  whichever process prepared it, so running whatever a server holds under that
  name is running ours. On a direct connection that is one round trip per
  operation, as with asyncpg's own cache;
* behind a transaction pooler the server may not hold the name (SQLSTATE
  26000) or already hold it (42P05): nothing ran, and from then on that engine
  runs unnamed statements, which asyncpg parses and binds on one server
  connection (with its statement cache off, as ``create_engine`` sets for
  Postgres: ``statement_cache_size=0``; on an engine whose cache may be on, the
  unnamed statement runs inside a transaction instead);
* ``create_engine`` turns asyncpg's own statement cache off, so SQLAlchemy's
  statements and asyncpg's type introspection are unnamed too;
* on a messages table hash-partitioned into at most ``GENERIC_PLANS_UP_TO``, each
  new connection of ours pins generic plans for our statements (else the server
  plans every call afresh there), but only when the server process answering is
  the one it connected to: never through a transaction pooler (``_adopter``).
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import asyncpg
from sqlalchemy import (
    ColumnElement,
    Executable,
    Integer,
    Table,
    Text,
    and_,
    bindparam,
    cast,
    delete,
    event,
    func,
    insert,
    literal_column,
    select,
    text,
    type_coerce,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.ext.asyncio import AsyncEngine

from agents_memory._codec import OnCorrupt, decode_row
from agents_memory._crypto import ENVELOPE_MARK, Keyring
from agents_memory._databases import pool as driver_pool
from agents_memory._databases import postgres_groups
from agents_memory._databases.base import (
    CompiledSQL,
    CoreRunner,
    Database,
    Executor,
    MetadataFilterValue,
    Row,
    RowReads,
    Statements,
    check_heads,
    compile_all,
    compile_for,
    counted,
    expires_param,
    fork_body,
    live,
    observed,
    order_key,
    portable_statements,
    renewed_expiry,
    sid_param,
    wrap_driver_error,
)
from agents_memory._errors import AgentsMemoryError
from agents_memory._migrations import _lock as lock_table
from agents_memory._tables import TableNames

T = TypeVar("T")

_POOLER_SQLSTATES = frozenset({"26000", "42P05"})
"""Prepared statement missing / already there: we are not alone on this server connection."""
_ROLLED_BACK_WHOLE = frozenset({"40P01", "40001"})
"""Deadlock victim, serialization failure: the server aborted the whole transaction, so
nothing of it was written and running it again is safe. Postgres raises 40001 only
under REPEATABLE READ or SERIALIZABLE; CockroachDB and YugabyteDB (Postgres wire) raise
it on ordinary contention and ask clients to retry."""
_UNIQUE_VIOLATION = "23505"
_MISSING_SQLSTATES = frozenset({"42P01", "42703"})
"""Undefined table, undefined column: the schema is missing or out of date."""
_ENDED_SQLSTATES = frozenset({"57P01", "57P02"})
"""The server ended this connection (admin shutdown, crash shutdown)."""
_CONNECT_SQLSTATES = frozenset({"28000", "28P01", "3D000", "57P03", "53300"})
"""Could not connect (auth, no such database, starting up, too many connections)."""


def _upsert_session(sessions: Table, sid: Any, now: ColumnElement[Any]) -> Any:  # noqa: ANN401
    return (
        postgresql.insert(sessions)
        .values(session_id=sid)
        .on_conflict_do_update(index_elements=[sessions.c.session_id], set_={"updated_at": now})
    )


UTC_CLOCK: ColumnElement[Any] = func.timezone("UTC", func.current_timestamp())
"""The transaction's time in UTC as a ``timestamp``: what expiry deadlines are compared with."""


def _upsert_renewing(sessions: Table, sid: Any, now: ColumnElement[Any]) -> Any:  # noqa: ANN401
    """The head variant's upsert: ``updated_at``, the deadline and ``last_position`` moved.

    The deadline is renewed (``expires``); ``last_position`` is bumped by ``n`` and
    returned.

    ``SET`` reads the existing row as locked (its newest version, after any writer
    ahead of it committed), so an expired deadline is cleared (the session starts
    afresh) unless the store's ``ttl`` gives a new one, and two writers never get
    the same positions, whatever their snapshots saw.
    """
    expires = expires_param(sessions.c.expires_at.type)
    n = counted()
    return (
        postgresql.insert(sessions)
        .values(session_id=sid, expires_at=expires, last_position=n)
        .on_conflict_do_update(
            index_elements=[sessions.c.session_id],
            set_={
                "updated_at": now,
                "expires_at": renewed_expiry(sessions, UTC_CLOCK, expires),
                "last_position": sessions.c.last_position + n,
            },
        )
        .returning(sessions.c.last_position)
    )


def _role_of(data: ColumnElement[Any]) -> ColumnElement[Any]:
    """An item's ``role`` (``jsonb ->> 'role'``).

    Postgres 15 has no "is this valid JSON" test, so a row that is not JSON (only
    ever written behind the library's back) fails the statement that reads its role.
    """
    return cast(data, postgresql.JSONB()).op("->>")(literal_column("'role'"))


def _drop_closed_connection(dbapi_connection: Any, _record: object, _proxy: object) -> None:  # noqa: ANN401
    """On checkout, replace a pooled connection the server has already closed.

    After a restart, a failover or ``pg_terminate_backend`` the driver knows its
    idle connections are closed: a local flag, not a round trip (``pool_pre_ping``).
    """
    driver = getattr(dbapi_connection, "driver_connection", None)
    if driver is not None and driver.is_closed():
        msg = "pooled connection was closed by the server"
        raise DisconnectionError(msg)


def statement_name(sql: str) -> str:
    """The prepared-statement name of ``sql``: the same text always gets the same name."""
    return "__agents_memory_" + hashlib.sha1(sql.encode(), usedforsecurity=False).hexdigest()


class _EngineFacts:
    """What one engine's operations learn as they run (shared by every loop's pool)."""

    __slots__ = ("cache_off", "messages_tables", "pooled")

    def __init__(self, cache_off: bool) -> None:
        self.pooled = False
        """A transaction pooler sits in front: run unnamed statements from now on."""
        self.cache_off = cache_off
        """asyncpg's statement cache is off on this engine's connections (ours: yes)."""
        self.messages_tables: frozenset[str] = frozenset()
        """The messages tables of this engine's stores (whether to pin generic plans)."""


_cache_off_engines: weakref.WeakSet[Engine] = weakref.WeakSet()


class _PoolerRestart(Exception):  # noqa: N818 - a signal, not an error anyone sees
    """A pooler's prepared-statement clash inside a transaction: it is aborted, run it again.

    Outside a transaction the failed statement is simply run again unnamed; inside
    one, Postgres has aborted the transaction (nothing of it was applied), so the
    whole body runs again, on unnamed statements from the start.
    """


class DriverExecutor:
    """:class:`Executor` on one asyncpg connection, running the compiled statements."""

    __slots__ = ("_facts", "_lease", "_sql", "in_transaction", "last")

    def __init__(
        self,
        lease: driver_pool.Lease[Any],
        sql: Mapping[str, CompiledSQL],
        facts: _EngineFacts,
    ) -> None:
        self._lease = lease
        self._sql = sql
        self._facts = facts
        self.last = ""
        """The text of the statement running now (for error messages)."""
        self.in_transaction = False

    async def _fetch(self, c: CompiledSQL, args: tuple[Any, ...]) -> Sequence[Row]:
        conn = self._lease.driver
        if self._facts.pooled:
            if self._facts.cache_off:
                return await conn.fetch(c.sql, *args)  # type: ignore[no-any-return]
            async with conn.transaction():  # one server connection for parse and bind
                unnamed = await conn.prepare(c.sql, name="")
                return await unnamed.fetch(*args)  # type: ignore[no-any-return]
        prepared = self._lease.extra
        statement = prepared.get(c.sql)
        if statement is None:
            statement = prepared[c.sql] = await conn.prepare(c.sql, name=statement_name(c.sql))
        return await statement.fetch(*args)  # type: ignore[no-any-return]

    async def rows(self, key: str, params: Mapping[str, Any]) -> Sequence[Row]:
        c = self._sql[key]
        self.last = c.sql
        args = c.positional(params)
        try:
            return await self._fetch(c, args)
        except asyncpg.PostgresError as exc:
            if exc.sqlstate not in _POOLER_SQLSTATES:
                raise
            # Nothing ran (the statement was never bound): a pooler shares this connection.
            self._facts.pooled = True
            self._lease.extra.clear()
            if self.in_transaction:
                raise _PoolerRestart from exc
            return await self._fetch(c, args)

    async def run(self, key: str, params: Mapping[str, Any]) -> int:
        return len(await self.rows(key, params))

    async def runmany(self, key: str, params: Sequence[Mapping[str, Any]]) -> None:
        for p in params:  # (not used: Postgres appends in one statement)
            await self.rows(key, p)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """A transaction on this connection, for the one body of several statements."""
        async with self._lease.driver.transaction():
            self.in_transaction = True
            try:
                yield
            finally:
                self.in_transaction = False


def _is_gone(exc: BaseException, conn: Any) -> bool:  # noqa: ANN401
    """Whether the server ended the connection (or the client can no longer use it)."""
    if isinstance(exc, asyncpg.PostgresError):
        return Postgres.classify(exc) == "lost" or conn.is_closed()
    return True


GENERIC_PLANS_UP_TO = 32
"""The most hash partitions a messages table may have for our connections to pin generic plans.

On a partitioned messages table the server plans our named statements afresh on every
call: a generic plan keeps all the partitions (pruned only when it runs), so its
estimate is a multiple of a custom plan's, and the plan cache never switches to it
(``pg_prepared_statements``: 0 generic, 9 custom of 9, where the plain table's switch
after five). Planning is then most of the partitioned layout's cost: a clear's
statement planned in 0.142 ms against 0.008 ms plain, for 0.134 ms against 0.112 ms of
execution (8 partitions, ``EXPLAIN (ANALYZE, SUMMARY) EXECUTE``). A generic plan instead
locks every partition when it starts (PostgreSQL 15), which costs less than planning up
to a few dozen partitions and more past that (benchmarks/README.md: the workloads at 8,
32 and 128 partitions)."""

_PIN_GENERIC = text(
    "SELECT set_config('plan_cache_mode', 'force_generic_plan', false) FROM ("
    "SELECT max((SELECT count(*) FROM pg_catalog.pg_inherits i WHERE i.inhparent = c.oid)) "
    "AS most FROM pg_catalog.pg_class c "
    "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
    "WHERE c.relname = ANY(:names) AND n.nspname = current_schema() AND c.relkind = 'p'"
    ") p WHERE p.most <= :up_to AND pg_catalog.pg_backend_pid() = :pid"
).bindparams(
    bindparam("names", type_=postgresql.ARRAY(Text())),
    bindparam("up_to", type_=Integer()),
    bindparam("pid", type_=Integer()),
)
"""Pin generic plans on this connection if one of the named messages tables is hash
partitioned and none has more than ``up_to`` partitions, and the server process
answering is the one the connection started with (``pid``): else change nothing."""


def _adopter(
    engine: AsyncEngine, facts: _EngineFacts, pin: CompiledSQL
) -> Callable[[Any], Awaitable[None]]:
    """What a new driver connection runs first: maybe pin generic plans, nothing else.

    Every statement is its own transaction, so there is no session state to set,
    except that on a partitioned messages table (``GENERIC_PLANS_UP_TO``) our named
    statements run generic plans (``plan_cache_mode``, a setting of this connection
    only: these connections run nothing but our statements). The plan changes, never
    what a statement does. Never behind a transaction pooler, where a setting would
    stay on a server connection that other clients get next: such a pooler hands
    its clients its own cancellation key, so the process id asyncpg got at connect
    (``get_server_pid``) is not the server process's (``pg_backend_pid()``), and
    the statement sets nothing; nor once one is found (``pooled``).
    """

    async def adopt(conn: Any) -> None:  # noqa: ANN401
        if facts.pooled or not facts.messages_tables:
            return
        args = pin.positional(
            {
                "names": sorted(facts.messages_tables),
                "up_to": GENERIC_PLANS_UP_TO,
                "pid": conn.get_server_pid(),
            }
        )
        try:
            if facts.cache_off:
                await conn.fetch(pin.sql, *args)
                return
            async with conn.transaction():  # unnamed, as DriverExecutor runs it behind a pooler
                unnamed = await conn.prepare(pin.sql, name="")
                await unnamed.fetch(*args)
        except Exception as exc:  # (the pool aborts the connection) as any operation's error
            gone = _is_gone(exc, conn)
            raise wrap_driver_error(exc, engine, pin.sql, None, gone=gone) from exc

    return adopt


def _abort(conn: Any) -> None:  # noqa: ANN401
    conn.terminate()


class DriverRunner:
    """Operations on detached asyncpg connections (see the module docstring)."""

    def __init__(self, engine: AsyncEngine, names: TableNames, *, expiry: bool = False) -> None:
        self._engine = engine
        self._sql = compile_all(Postgres.statements(names, expiry), engine.dialect)
        self._facts = _facts_for(engine)
        self._facts.messages_tables |= {names.messages}  # (replaced whole: read by any loop)
        adopt = _adopter(engine, self._facts, compile_for(_PIN_GENERIC, engine.dialect))
        size = driver_pool.engine_pool_size(engine)
        # Appends at head group (postgres_groups) once `size` are in flight, unless turned off.
        self._appends = None
        if expiry and postgres_groups.grouping_on(engine):
            self._appends = postgres_groups.appenders_for(engine, names, slots=size)
            self._sql[postgres_groups.GROUP_KEY] = postgres_groups.compiled_group(
                names, engine.dialect
            )
        self._pools: driver_pool.Pools[Any] = driver_pool.pools_for(
            engine,
            lambda: driver_pool.DriverPool(
                engine,
                size=size,
                adopt=adopt,
                is_closed=lambda c: c.is_closed(),
                abort=_abort,
            ),
        )

    async def _op(self, body: Callable[[Executor], Awaitable[T]]) -> T:
        pool = self._pools.current()
        lease = await pool.acquire()
        ex = DriverExecutor(lease, self._sql, self._facts)
        try:
            result = await body(ex)
        except (
            AgentsMemoryError,
            _PoolerRestart,
        ):  # ours (strict pop, decryption, fork): rolled back
            pool.release(lease)
            raise
        except Exception as exc:
            # The server's own errors leave the connection usable; any other failure
            # (lost, closed, terminated, a protocol in a bad state) does not.
            gone = _is_gone(exc, lease.driver)
            pool.release(lease, broken=not isinstance(exc, asyncpg.PostgresError), gone=gone)
            raise wrap_driver_error(exc, self._engine, ex.last, None, gone=gone) from exc
        except BaseException:
            # Cancelled mid-statement: the connection's state is unknown; it is not reused.
            pool.release(lease, broken=True)
            raise
        pool.release(lease)
        return result

    async def read(self, body: Callable[[Executor], Awaitable[T]]) -> T:
        return await self._op(body)

    async def _statement(self, key: str, params: Mapping[str, Any]) -> Sequence[Row]:
        return await self._op(lambda ex: ex.rows(key, params))

    async def append(self, session_id: str, data: Sequence[str], expires: object) -> None:
        """One append, grouped with the appends queued beside it (``postgres_groups``)."""
        if self._appends is None:
            params = postgres_groups.append_params(session_id, data, expires)
            await self._op(lambda ex: ex.run("append", params))
            return
        await self._appends.current().add(self._statement, session_id, list(data), expires)

    async def write(self, body: Callable[[Executor], Awaitable[T]], *, single: bool = True) -> T:
        """One statement is its own transaction; a body of several (strict pop) gets one."""
        if single:
            return await self._op(body)

        async def in_transaction(ex: Executor) -> T:
            async with ex.transaction():  # type: ignore[attr-defined]
                return await body(ex)

        try:
            return await self._op(in_transaction)
        except _PoolerRestart:  # rolled back whole; unnamed statements from now on
            return await self._op(in_transaction)


_facts: weakref.WeakKeyDictionary[Engine, _EngineFacts] = weakref.WeakKeyDictionary()


def _facts_for(engine: AsyncEngine) -> _EngineFacts:
    sync_engine = engine.sync_engine
    found = _facts.get(sync_engine)
    if found is None:
        found = _facts[sync_engine] = _EngineFacts(cache_off=sync_engine in _cache_off_engines)
    return found


class Operations(RowReads):
    """The protocol's operations on Postgres, on either runner."""

    def __init__(
        self,
        runner: Any,  # noqa: ANN401
        on_corrupt: OnCorrupt,
        keyring: Keyring | None = None,
        *,
        head: bool = False,
    ) -> None:
        self._runner = runner
        self._on_corrupt: OnCorrupt = on_corrupt
        self._keyring = keyring
        self._head = head
        self._append = getattr(runner, "append", None)  # the driver runner's (grouping) append

    async def add(self, session_id: str, data: Sequence[str], expires: object = None) -> None:
        if self._append is not None:
            await self._append(session_id, data, expires)
            return
        params = postgres_groups.append_params(session_id, data, expires)
        await self._runner.write(lambda ex: ex.run("append", params), single=True)

    async def _rows(self, key: str, params: dict[str, Any]) -> Sequence[Row]:
        return await self._runner.read(lambda ex: ex.rows(key, params))  # type: ignore[no-any-return]

    async def pop(self, session_id: str) -> dict[str, Any] | None:
        """Delete and return the newest row; a corrupt one is skipped (or, raising, kept).

        Without a keyring, the one-statement pop deletes the newest row only when it
        is not encrypted; when it deletes nothing (an empty session, or an encrypted
        newest row), or with ``on_corrupt="raise"`` or a keyring, the delete runs in
        a transaction that rolls back when the row does not decode or decrypt:
        nothing is deleted because it could not be read.
        """
        params = {"sid": session_id}
        on_corrupt, keyring = self._on_corrupt, self._keyring
        if on_corrupt == "skip" and keyring is None:
            while True:
                rows = await self._runner.write(
                    lambda ex: ex.rows("pop_plain", params), single=True
                )
                if not rows:
                    break
                item = decode_row(rows[0][1], row_id=rows[0][0], on_corrupt="skip")
                if item is not None:
                    return item

        async def checked(ex: Executor) -> dict[str, Any] | None:
            while True:
                rows = await ex.rows("pop", params)
                if not rows:
                    return None
                item = decode_row(
                    rows[0][1], row_id=rows[0][0], on_corrupt=on_corrupt, keyring=keyring
                )
                if item is not None:
                    return item

        return await self._runner.write(checked, single=False)  # type: ignore[no-any-return]

    async def clear(self, session_id: str, *, checked: bool = True) -> bool:
        """Both deletes in one statement, after checking (same transaction) every encrypted row.

        A row the keyring could not open refuses the clear with the typed error.
        """
        params = {"sid": session_id}
        keyring = self._keyring
        if not checked:
            rows = await self._runner.write(lambda ex: ex.rows("clear", params), single=True)
            return bool(rows)

        if await self._runner.write(lambda ex: ex.rows("clear_plain", params), single=True):
            return True  # no encrypted row, nothing changed under it: one statement

        async def body(ex: Executor) -> bool:
            # Lock the session row first: writers queue there, so the heads read next (a
            # new snapshot, READ COMMITTED) are every row the delete will remove.
            await ex.rows("lock_session", params)
            check_heads(await ex.rows("select_heads", params), keyring)
            return bool(await ex.rows("clear", params))

        return await self._runner.write(body, single=False)  # type: ignore[no-any-return]

    async def replace(self, session_id: str, data: Sequence[str], expires: object = None) -> None:
        """Lock (upsert) the session row, then swap its items: two statements, one transaction.

        Appends lock the same row first, so one that started before the replace
        commits before the swap reads the rows (and is replaced); one that starts
        after waits and lands after the new items.
        """
        n = len(data)

        async def body(ex: Executor) -> None:
            await ex.run("upsert_session", {"sid": session_id, "expires": expires, "n": n})
            # as a clear does: nothing is deleted that the keyring could not open
            check_heads(await ex.rows("select_heads", {"sid": session_id}), self._keyring)
            await ex.run("replace_rows", {"sid": session_id, "data": list(data), "n": n})

        await self._runner.write(body, single=False)

    async def fork(
        self, session_id: str, new_session_id: str, skip: int | None, expires: object = None
    ) -> None:
        await self._runner.write(
            lambda ex: fork_body(
                ex,
                session_id,
                new_session_id,
                skip,
                returning=True,
                share_source=True,
                expires=expires,
                advanced=self._head,
            ),
            single=False,
        )


_PARTITION_COUNT = text(
    "SELECT (SELECT count(*) FROM pg_catalog.pg_inherits i WHERE i.inhparent = c.oid) "
    "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
    "WHERE c.relname = :name AND n.nspname = current_schema() AND c.relkind = 'p'"
)
"""The partition count of a partitioned table, by name bound as a value (no row: plain)."""


class Postgres(Database):
    """Postgres through asyncpg."""

    name: ClassVar[str] = "postgresql"
    label: ClassVar[str] = "Postgres"
    hash_partitions: ClassVar[bool] = True

    @classmethod
    def partition_count(cls, connection: Connection, table: str) -> int | None:
        """The hash partitions of ``table`` in the current schema (``None``: not partitioned)."""
        count = connection.execute(_PARTITION_COUNT, {"name": table}).scalar()
        return None if count is None else int(count)

    dialect_names: ClassVar[tuple[str, ...]] = ("postgresql",)

    @classmethod
    def engine_defaults(cls, url: URL, kwargs: dict[str, Any]) -> None:  # noqa: ARG003
        """The asyncpg statement cache off: SQLAlchemy's statements are unnamed (PgBouncer-safe)."""
        connect_args = kwargs.setdefault("connect_args", {})
        connect_args.setdefault("statement_cache_size", 0)

    @classmethod
    def configure_engine(cls, sync_engine: Engine) -> None:
        if not event.contains(sync_engine, "checkout", _drop_closed_connection):
            event.listen(sync_engine, "checkout", _drop_closed_connection)

    @staticmethod
    def mark_cache_off(sync_engine: Engine) -> None:
        """``create_engine`` turned asyncpg's statement cache off on this engine's connections."""
        _cache_off_engines.add(sync_engine)

    @classmethod
    def _build_statements(cls, names: TableNames, expiry: bool) -> Statements:
        now = func.current_timestamp()
        upsert_session = _upsert_renewing if expiry else _upsert_session
        base = portable_statements(
            names,
            now=now,
            upsert_session=upsert_session,
            role_of=_role_of,
            clock=UTC_CLOCK if expiry else None,
        )
        sessions, messages = base.sessions, base.messages
        sid = sid_param(sessions)
        # The uncorrelated sub-select is a one-time filter evaluated before the first row,
        # so the session row is upserted (and row-locked) before any item is inserted; at
        # head it hands out the positions (the counter bumped by ``n``, as locked).
        upserting: Any = upsert_session(sessions, sid, now)
        if not expiry:
            upserting = upserting.returning(literal_column("1"))
        upsert = upserting.cte("s")
        locked = select(func.count()).select_from(upsert).scalar_subquery() == 1
        ctes: list[Any] = [upsert]
        if expiry:
            # Still one statement: an expired session's old items go with the write that
            # starts it afresh. Ordered after the upsert (it waits for the row lock first);
            # its snapshot is the statement's, so it sees the row as it was before the
            # write and never the items this statement or a later writer inserts.
            ctes.append(
                delete(messages)
                .where(messages.c.session_id == sid, ~live(sessions, sid, UTC_CLOCK), locked)
                .cte("x")
            )
        rows = (
            func.unnest(cast(bindparam("data"), postgresql.ARRAY(Text())))
            .table_valued("d", with_ordinality="o")
            .render_derived(name="t")
        )
        n = counted()
        key = order_key(messages)
        if expiry:
            top = select(upsert.c.last_position).scalar_subquery()
            append = insert(messages).from_select(
                ["session_id", "position", "message_data"],
                select(sid, top - n + rows.c.o, rows.c.d).order_by(rows.c.o),
            )
        else:
            append = insert(messages).from_select(
                ["session_id", "message_data"],
                select(sid, rows.c.d).where(locked).order_by(rows.c.o),
            )
        append = append.add_cte(*ctes)
        mine = messages.c.session_id == sid
        newest = (
            select(key)
            .where(mine if not expiry else and_(mine, live(sessions, sid, UTC_CLOCK)))
            .order_by(key.desc())
            .limit(1)
            .with_for_update()
            .scalar_subquery()
        )
        pop = delete(messages).where(mine, key == newest).returning(key, messages.c.message_data)
        # A replace's second statement (the session row is already locked by the first, so
        # its snapshot, taken after that lock, sees every append committed before it; one
        # statement could not: its snapshot would predate the wait for the lock). The CTE's
        # delete sees only the old rows, the insert adds the new: one atomic swap.
        old = delete(messages).where(messages.c.session_id == sid).cte("old")
        if expiry:  # the positions below the counter the upsert just moved (and holds)
            held_top = (
                select(sessions.c.last_position)
                .where(sessions.c.session_id == sid)
                .scalar_subquery()
            )
            replace_rows = insert(messages).from_select(
                ["session_id", "position", "message_data"],
                select(sid, held_top - n + rows.c.o, rows.c.d).order_by(rows.c.o),
            )
        else:
            replace_rows = insert(messages).from_select(
                ["session_id", "message_data"], select(sid, rows.c.d).order_by(rows.c.o)
            )
        replace_rows = replace_rows.add_cte(old)
        gone = delete(messages).where(messages.c.session_id == sid).cte("m")
        clear = (
            delete(sessions)
            .where(sessions.c.session_id == sid)
            .returning(sessions.c.session_id)
            .add_cte(gone)
        )
        # The same as one statement, only for a session holding no encrypted row. One
        # statement has one snapshot, taken before it can lock anything: a writer (with
        # another keyring, say) that commits an envelope after that snapshot is invisible
        # to any check in it, yet the session row's delete would cascade to its rows. So
        # it deletes only what it has proven is all there is, and otherwise deletes
        # nothing (then the checked clear above runs):
        # * ``locked``: the session row, FOR UPDATE; every writer of items holds that row
        #   while it writes (appends upsert it, rotation key-share-locks it), so from here
        #   nothing new can be written until this commits;
        # * the version locked is the version in the snapshot (``xmin`` unchanged): no
        #   append committed between the snapshot and the lock (each upsert makes a new
        #   version);
        # * ``plain``: every item row, FOR UPDATE, and still not an envelope in its latest
        #   version (READ COMMITTED re-checks a locked row's newest version), as many as the
        #   snapshot holds: none was encrypted (rotation), added or removed meanwhile.
        held = sessions.alias("held")
        seen = sessions.alias("seen")
        version: ColumnElement[Any] = literal_column("xmin")
        held_version = (
            select(version.label("v"))
            .select_from(held)
            .where(held.c.session_id == sid)
            .with_for_update()
            .cte("locked")
        )
        locked_v = select(held_version.c.v).scalar_subquery()
        plain = (
            select(key)
            .where(
                messages.c.session_id == sid,
                func.substr(messages.c.message_data, 1, 2) != ENVELOPE_MARK,
                locked_v.is_not(None),  # the session row is locked before any item row
            )
            .with_for_update()
            .cte("plain")
        )
        in_snapshot = (
            select(func.count())
            .select_from(messages)
            .where(messages.c.session_id == sid)
            .scalar_subquery()
        )
        unchanged = and_(
            locked_v
            == select(version).select_from(seen).where(seen.c.session_id == sid).scalar_subquery(),
            select(func.count()).select_from(plain).scalar_subquery() == in_snapshot,
        )
        gone_plain = delete(messages).where(messages.c.session_id == sid, unchanged).cte("m")
        clear_plain = (
            delete(sessions)
            .where(sessions.c.session_id == sid, unchanged)
            .returning(sessions.c.session_id)
            .add_cte(gone_plain)
        )
        lock_session = (
            select(sessions.c.session_id).where(sessions.c.session_id == sid).with_for_update()
        )
        return Statements(
            **{
                **{f: getattr(base, f) for f in base.__dataclass_fields__},
                "pop": pop,
                "pop_plain": pop.where(func.substr(messages.c.message_data, 1, 2) != ENVELOPE_MARK),
                "append": append,
                "clear": clear,
                "clear_plain": clear_plain,
                "lock_session": lock_session,
                "replace_rows": replace_rows,
                "share_source": select(sessions.c.session_id)
                .where(sessions.c.session_id == sid)
                .with_for_update(read=True),
            }
        )

    @classmethod
    def operations(
        cls,
        engine: AsyncEngine,
        names: TableNames,
        on_corrupt: OnCorrupt,
        keyring: Keyring | None = None,
        *,
        expiry: bool = False,
    ) -> Any:  # noqa: ANN401
        runner: Any
        if observed(engine):
            runner = CoreRunner(engine, cls.statements(names, expiry), autocommit_single=True)
        else:
            runner = DriverRunner(engine, names, expiry=expiry)
        return Operations(runner, on_corrupt, keyring, head=expiry)

    @classmethod
    def upsert_metadata(cls, sessions: Table) -> Executable:
        sid = bindparam("sid", type_=sessions.c.session_id.type)
        meta = bindparam("meta", type_=sessions.c["metadata"].type)
        return (
            postgresql.insert(sessions)
            .values(session_id=sid, metadata=meta)
            .on_conflict_do_update(
                index_elements=[sessions.c.session_id],
                set_={"metadata": meta, "updated_at": func.current_timestamp()},
            )
        )

    @classmethod
    def upsert_expiry(cls, sessions: Table) -> Executable:
        sid = bindparam("sid", type_=sessions.c.session_id.type)
        expires = bindparam("expires", type_=sessions.c.expires_at.type)
        return (
            postgresql.insert(sessions)
            .values(session_id=sid, expires_at=expires)
            .on_conflict_do_update(
                index_elements=[sessions.c.session_id], set_={"expires_at": expires}
            )
        )

    @classmethod
    def bump_generation(cls, generations: Table) -> Executable:
        sid = bindparam("sid", type_=generations.c.session_id.type)
        return (
            postgresql.insert(generations)
            .values(session_id=sid, generation=1)
            .on_conflict_do_update(
                index_elements=[generations.c.session_id],
                set_={"generation": generations.c.generation + 1},
            )
        )

    @classmethod
    def metadata_filter(
        cls, sessions: Table, wanted: Mapping[str, MetadataFilterValue]
    ) -> ColumnElement[bool]:
        """JSONB ``@>`` containment (a GIN index on the column would serve it)."""
        return type_coerce(sessions.c["metadata"], postgresql.JSONB()).contains(dict(wanted))

    @classmethod
    @contextlib.contextmanager
    def migration_lock(
        cls,
        connection: Connection,
        key: int,
        what: str,  # noqa: ARG003
        row: Table | None = None,
    ) -> Iterator[None]:
        """A transaction-scoped advisory lock (kept by transaction pooling too), or the row.

        With ``row``, the lock table and its row are made (if missing) on a
        connection of their own, committed, then the migrating transaction locks
        the row with ``FOR UPDATE``: held until it commits or rolls back, released
        by the server when the holder's connection dies.
        """
        if row is None:
            connection.execute(select(func.pg_advisory_xact_lock(key)))
        else:
            with connection.engine.connect() as side:
                lock_table.ensure_row(side, row)
            connection.execute(lock_table.lock_row(row))
        yield

    @classmethod
    def advisory_locks_exclude(cls, engine: Engine) -> bool:
        """Two connections try one random key in two open transactions; the second must fail.

        Through a transaction pooler each transaction has its own server
        connection, so a transaction-scoped lock excludes there; a stub that
        grants it twice (or no such function) answers ``False``.
        """
        key = secrets.randbits(62)
        try:
            with engine.connect() as first, engine.connect() as second:
                got_first = first.execute(select(func.pg_try_advisory_xact_lock(key))).scalar()
                got_second = second.execute(select(func.pg_try_advisory_xact_lock(key))).scalar()
                second.rollback()
                first.rollback()
        except DBAPIError:
            return False
        return bool(got_first) and not got_second

    @classmethod
    def duplicate_key(cls, orig: BaseException) -> bool:
        return str(getattr(orig, "sqlstate", None) or "") == _UNIQUE_VIOLATION

    @classmethod
    def classify(cls, orig: BaseException) -> str | None:
        sqlstate = str(getattr(orig, "sqlstate", None) or "")
        if sqlstate in _ROLLED_BACK_WHOLE:
            return "deadlock"
        if sqlstate in _MISSING_SQLSTATES:  # ("prepared statement … does not exist" is not)
            return "missing"
        if sqlstate in _ENDED_SQLSTATES or sqlstate.startswith("08"):
            return "lost"
        if sqlstate in _CONNECT_SQLSTATES or isinstance(orig, OSError):
            return "connect"
        return None
