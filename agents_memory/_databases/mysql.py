"""MySQL and MariaDB: locking rules, statement size, and asyncmy on detached autocommit connections.

* An append is one transaction that upserts the session row first
  (``INSERT … ON DUPLICATE KEY UPDATE``, which locks it, found or inserted):
  appends to one session queue there, so each batch's ids are drawn after the
  previous batch committed and stay contiguous.
* A pop is a ``SELECT … FOR UPDATE`` of the newest row and a ``DELETE`` of it in
  one transaction (MySQL has no ``DELETE … RETURNING``): a concurrent popper
  waits on the same row and, once it is gone, moves on, so each item is
  claimed once.
* A clear locks the session row (``SELECT … FOR UPDATE``), checks the envelope
  heads, then deletes the row and lets ``ON DELETE CASCADE`` remove its items;
  locking the session row first, as appends do, the two never wait in a cycle,
  and no item can be written between the check and the delete.
* A statement larger than the server's ``max_allowed_packet`` makes the server
  drop the connection ("Lost connection"): items are measured first and a
  ``ValueError`` names the limit instead.

The driver runner keeps its connections in autocommit mode: a read is one
statement and one round trip, with no transaction (and no snapshot) left open;
a write is ``BEGIN`` … ``COMMIT``. A connection the server closed while it sat
idle (``wait_timeout``, a restart) fails before ``COMMIT`` is sent, so nothing
was applied: the operation runs again on a fresh connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import weakref
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import asyncmy
import asyncmy.errors
from sqlalchemy import (
    ColumnElement,
    Executable,
    Table,
    and_,
    bindparam,
    case,
    delete,
    func,
    literal_column,
    null,
    select,
    text,
    update,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import URL, Connection, Dialect, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agents_memory._codec import OnCorrupt, decode_row
from agents_memory._crypto import Keyring
from agents_memory._databases import pool as driver_pool
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
    counted,
    expired,
    expires_param,
    fork_body,
    live,
    numbered,
    observed,
    order_key,
    portable_statements,
    sid_param,
    wrap_driver_error,
)
from agents_memory._errors import AgentsMemoryError
from agents_memory._migrations import _lock as lock_table
from agents_memory._tables import TableNames
from agents_memory.models import current_timestamp

T = TypeVar("T")

STATEMENT_OVERHEAD = 4096
"""Room for the SQL around one row (statement text, session id, protocol header)."""
_DEADLOCK = 1213
_DUPLICATE_KEY = 1062
_LOCK_WAIT_TIMEOUT = 1205
_MISSING_CODES = frozenset({1146, 1054})
"""No such table, unknown column: the schema is missing or out of date."""
MIGRATION_LOCK_TIMEOUT_S = 600
"""How long a migrator waits for another one migrating the same tables."""
_CONNECT_CODES = frozenset({1044, 1045, 1049, 2002, 2003, 2005, 1040})
"""Access denied, unknown database, cannot connect, unknown host, too many connections."""
_UPDATED = 2
"""``INSERT … ON DUPLICATE KEY UPDATE``'s affected rows for an existing row it changed."""
_GONE_CODES = frozenset({2006, 2013, 2014, 2045, 2055})
"""Server gone, lost during query, out of sync, lost while reading, lost at handshake."""


def _upsert_session(sessions: Table, sid: Any, now: ColumnElement[Any]) -> Executable:  # noqa: ANN401
    return mysql.insert(sessions).values(session_id=sid).on_duplicate_key_update(updated_at=now)


UTC_CLOCK: ColumnElement[Any] = func.utc_timestamp(literal_column("6"))
"""The server's UTC time to the microsecond: what expiry deadlines are compared with."""


def _upsert_unless_expired(sessions: Table, sid: Any, now: ColumnElement[Any]) -> Executable:  # noqa: ANN401
    """The head variant's upsert: a live row is touched, renewed and its counter moved.

    Its ``last_position`` is bumped by ``n`` (read next with ``read_counter``, under
    this lock).

    An expired row is locked but left as it is (so the affected-row count is not
    2, "updated"): the append then starts it afresh (``drop_expired``,
    ``restart_session``, which bumps the counter) while holding that lock. The assignments read only
    ``expires_at``, which is assigned last (MySQL applies them left to right).
    """
    expires = expires_param(sessions.c.expires_at.type)
    gone = expired(sessions, UTC_CLOCK)
    n = counted()
    last = sessions.c.last_position
    return (
        mysql.insert(sessions)
        .values(session_id=sid, expires_at=expires, last_position=n)
        .on_duplicate_key_update(
            [
                ("updated_at", case((gone, sessions.c.updated_at), else_=now)),
                ("last_position", case((gone, last), else_=last + n)),
                (
                    "expires_at",
                    case(
                        (gone, sessions.c.expires_at),
                        else_=func.coalesce(expires, sessions.c.expires_at),
                    ),
                ),
            ]
        )
    )


def _role_of(data: ColumnElement[Any]) -> ColumnElement[Any]:
    """An item's ``role``, or ``NULL`` for a row that is not valid JSON (``JSON_VALID`` first)."""
    return case(
        (
            func.json_valid(data) == 1,
            func.json_unquote(func.json_extract(data, literal_column("'$.role'"))),
        ),
        else_=null(),
    )


def check_packet_size(data: Sequence[str], limit: int) -> None:
    """Raise ``ValueError`` if an encoded item cannot fit in one statement under ``limit``.

    The driver escapes quotes and backslashes, so those count twice. A cheap
    bound (4 bytes a character) skips the exact count for all ordinary items.
    """
    room = limit - STATEMENT_OVERHEAD
    for index, item in enumerate(data):
        if len(item) * 8 <= room:
            continue
        size = len(item.encode("utf-8")) + item.count('"') + item.count("\\") + item.count("'")
        if size > room:
            msg = (
                f"item {index} is {size} bytes as sent, more than this MySQL/MariaDB server "
                f"accepts in one statement (max_allowed_packet = {limit}); raise "
                "max_allowed_packet on the server (e.g. SET GLOBAL max_allowed_packet = "
                "1073741824, and in its config file) or store smaller items"
            )
            raise ValueError(msg)


def _lock_held(what: str) -> str:
    return (
        f"another migration of {what} held its lock for {MIGRATION_LOCK_TIMEOUT_S} s; "
        "wait for it to finish (or end that connection), then run the migration again"
    )


def _code(exc: BaseException) -> int | None:
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def is_gone(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection is unusable (the server closed it, the socket broke)."""
    return _code(exc) in _GONE_CODES or isinstance(
        exc, (OSError, ConnectionError, asyncio.IncompleteReadError)
    )


class _PrimaryKeyNameNotes(logging.Filter):
    """Drop MariaDB's note that a PRIMARY KEY's name is ignored (its key is always ``PRIMARY``).

    Our naming convention names every constraint, and Alembic names its version
    table's key; MariaDB notes for each that the name was dropped, and asyncmy logs
    every server note as a warning, which lands on stderr (three lines per table
    set) for anyone who has not configured logging. Nothing is lost: the keys exist.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return "ignored for PRIMARY key" not in record.getMessage()


class _LockTableNotes(_PrimaryKeyNameNotes):
    """Also drop the note that the migration lock table already exists (``IF NOT EXISTS``)."""

    def __init__(self, table: str) -> None:
        super().__init__()
        self.table = table

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return super().filter(record) and not (
            self.table in message and "already exists" in message
        )


_DRIVER_LOGGER = logging.getLogger("asyncmy")


class _Facts:
    """What one engine's operations learn once: the server's statement size limit."""

    __slots__ = ("max_packet",)

    def __init__(self) -> None:
        self.max_packet: int | None = None


_facts: weakref.WeakKeyDictionary[Engine, _Facts] = weakref.WeakKeyDictionary()


def _facts_for(engine: AsyncEngine) -> _Facts:
    found = _facts.get(engine.sync_engine)
    if found is None:
        found = _facts[engine.sync_engine] = _Facts()
    return found


class DriverExecutor:
    """:class:`Executor` on one asyncmy connection, running the compiled statements."""

    __slots__ = ("_conn", "_sql", "last")

    def __init__(self, conn: Any, sql: Mapping[str, CompiledSQL]) -> None:  # noqa: ANN401
        self._conn = conn
        self._sql = sql
        self.last = ""
        """The text of the statement running now (for error messages)."""

    async def rows(self, key: str, params: Mapping[str, Any]) -> Sequence[Row]:
        c = self._sql[key]
        self.last = c.sql
        async with self._conn.cursor() as cur:
            await cur.execute(c.sql, c.positional(params))
            return await cur.fetchall()  # type: ignore[no-any-return]

    async def run(self, key: str, params: Mapping[str, Any]) -> int:
        c = self._sql[key]
        self.last = c.sql
        async with self._conn.cursor() as cur:
            return await cur.execute(c.sql, c.positional(params))  # type: ignore[no-any-return]

    async def runmany(self, key: str, params: Sequence[Mapping[str, Any]]) -> None:
        c = self._sql[key]
        self.last = c.sql
        async with self._conn.cursor() as cur:
            await cur.executemany(c.sql, [c.positional(p) for p in params])


async def _adopt(conn: Any) -> None:  # noqa: ANN401
    """Autocommit: reads leave no transaction (and no snapshot) open; writes say BEGIN."""
    await conn.autocommit(True)  # noqa: FBT003 - asyncmy's signature


def _abort(conn: Any) -> None:  # noqa: ANN401
    conn.close()


class DriverRunner:
    """Operations on detached asyncmy connections (see the module docstring)."""

    def __init__(self, engine: AsyncEngine, names: TableNames, *, expiry: bool = False) -> None:
        self._engine = engine
        self._sql = compile_all(MySQL.statements(names, expiry), engine.dialect)
        size = driver_pool.engine_pool_size(engine)
        self._pools: driver_pool.Pools[Any] = driver_pool.pools_for(
            engine,
            lambda: driver_pool.DriverPool(
                engine,
                size=size,
                adopt=_adopt,
                is_closed=lambda c: not c.connected,
                abort=_abort,
            ),
        )

    async def _op(self, body: Callable[[Executor], Awaitable[T]], *, transaction: bool) -> T:
        pool = self._pools.current()
        for attempt in (1, 2):
            lease = await pool.acquire()
            conn = lease.driver
            ex = DriverExecutor(conn, self._sql)
            committing = False
            try:
                if not transaction:
                    result = await body(ex)
                else:
                    ex.last = "BEGIN"
                    await conn.begin()
                    try:
                        result = await body(ex)
                    except BaseException as exc:
                        if not is_gone(exc) and not isinstance(exc, asyncio.CancelledError):
                            await conn.rollback()
                        raise
                    committing = True
                    ex.last = "COMMIT"
                    await conn.commit()
            except AgentsMemoryError:  # ours (strict pop, fork, decryption): rolled back above
                pool.release(lease)
                raise
            except Exception as exc:
                # The server's own errors leave the connection usable; any other failure
                # (lost, closed, a protocol out of step) does not.
                gone = is_gone(exc)
                broken = gone or not isinstance(exc, asyncmy.errors.MySQLError)
                pool.release(lease, broken=broken, gone=gone)
                if gone and attempt == 1 and not committing:
                    continue  # the server had closed it: nothing was applied; a fresh one
                raise wrap_driver_error(exc, self._engine, ex.last, None, gone=gone) from exc
            except BaseException:
                # Cancelled mid-operation: an open transaction dies with the connection.
                pool.release(lease, broken=True)
                raise
            pool.release(lease)
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    async def read(self, body: Callable[[Executor], Awaitable[T]]) -> T:
        return await self._op(body, transaction=False)

    async def write(self, body: Callable[[Executor], Awaitable[T]], *, single: bool = False) -> T:  # noqa: ARG002
        """Always a transaction: even one statement needs ``BEGIN`` on an autocommit connection."""
        return await self._op(body, transaction=True)


class Operations(RowReads):
    """The protocol's operations on MySQL/MariaDB, on either runner."""

    settles = True
    """Whether a cancel may be raised as it arrives (the backend runs it to completion if not)."""

    def __init__(
        self,
        engine: AsyncEngine,
        runner: Any,  # noqa: ANN401
        on_corrupt: OnCorrupt,
        keyring: Keyring | None = None,
        *,
        expiry: bool = False,
    ) -> None:
        self._runner = runner
        self._on_corrupt: OnCorrupt = on_corrupt
        self._keyring = keyring
        self._facts = _facts_for(engine)
        self._expiry = expiry

    async def _max_packet(self) -> int:
        limit = self._facts.max_packet
        if limit is None:
            rows = await self._runner.read(lambda ex: ex.rows("limits", {}))
            limit = self._facts.max_packet = int(rows[0][0])
        return limit

    async def add(self, session_id: str, data: Sequence[str], expires: object = None) -> None:
        check_packet_size(data, await self._max_packet())
        expiry = self._expiry

        async def body(ex: Executor) -> None:
            params = {"sid": session_id, "expires": expires, "n": len(data)}
            touched = await ex.run("upsert_session", params)
            if not expiry:
                await ex.runmany("insert_message", [{"sid": session_id, "data": d} for d in data])
                return
            if touched != _UPDATED:  # a new row, or an expired one (locked)
                await ex.run("drop_expired", params)
                await ex.run("restart_session", params)
            top = await ex.rows("read_counter", params)  # (the row this transaction holds)
            await ex.runmany("insert_message", numbered(session_id, data, int(top[0][0])))

        await self._runner.write(body)

    async def _rows(self, key: str, params: dict[str, Any]) -> Sequence[Row]:
        return await self._runner.read(lambda ex: ex.rows(key, params))  # type: ignore[no-any-return]

    async def pop(self, session_id: str) -> dict[str, Any] | None:
        on_corrupt = self._on_corrupt

        keyring = self._keyring

        async def body(ex: Executor) -> tuple[bool, dict[str, Any] | None]:
            rows = await ex.rows("pop", {"sid": session_id})
            if not rows:
                return False, None
            # Decoded (and decrypted) before the delete: one that cannot be read raises,
            # the transaction rolls back, and the row stays.
            item = decode_row(rows[0][1], row_id=rows[0][0], on_corrupt=on_corrupt, keyring=keyring)
            await ex.run("delete_row", {"sid": session_id, "id": rows[0][0]})
            return True, item

        while True:
            found: bool
            item: dict[str, Any] | None
            found, item = await self._runner.write(body)
            if not found or item is not None:
                return item

    async def clear(self, session_id: str, *, checked: bool = True) -> bool:
        """Delete the session (its items go by cascade) once every encrypted row was checked.

        A row the keyring could not open refuses the clear with the typed error.
        """
        params = {"sid": session_id}
        keyring = self._keyring

        async def body(ex: Executor) -> bool:
            if checked:
                # Lock the session row first, as every writer of its items does: an append
                # waiting there commits before the heads are read (the read view is made at
                # that first plain read, after the lock), or lands after the delete.
                await ex.rows("lock_session", params)
                check_heads(await ex.rows("select_heads", params), keyring)
            return bool(await ex.run("delete_session", params))

        return await self._runner.write(body)  # type: ignore[no-any-return]

    async def replace(self, session_id: str, data: Sequence[str], expires: object = None) -> None:
        """Lock (upsert) the session row first, as appends do, then delete and insert.

        The two never wait in a cycle, and an append queued behind the lock lands
        after the new items.
        """
        check_packet_size(data, await self._max_packet())

        expiry = self._expiry

        async def body(ex: Executor) -> None:
            params = {"sid": session_id, "expires": expires, "n": len(data)}
            touched = await ex.run("upsert_session", params)
            if expiry and touched != _UPDATED:  # (its items all go below anyway)
                await ex.run("restart_session", params)
            # as a clear does: nothing is deleted that the keyring could not open
            check_heads(await ex.rows("select_heads", {"sid": session_id}), self._keyring)
            await ex.run("delete_messages", {"sid": session_id})
            if not data:
                return
            if expiry:
                top = int((await ex.rows("read_counter", params))[0][0])
                await ex.runmany("insert_message", numbered(session_id, data, top))
            else:
                await ex.runmany("insert_message", [{"sid": session_id, "data": d} for d in data])

        await self._runner.write(body)

    async def fork(
        self, session_id: str, new_session_id: str, skip: int | None, expires: object = None
    ) -> None:
        await self._runner.write(
            lambda ex: fork_body(
                ex,
                session_id,
                new_session_id,
                skip,
                returning=False,
                expires=expires,
                advanced=self._expiry,
            )
        )


class MySQL(Database):
    """MySQL 8 and MariaDB through asyncmy."""

    name: ClassVar[str] = "mysql"
    label: ClassVar[str] = "MySQL/MariaDB"
    dialect_names: ClassVar[tuple[str, ...]] = ("mysql", "mariadb")

    @classmethod
    async def check_item_sizes(
        cls, conn: AsyncConnection, statements: Statements, data: Sequence[str]
    ) -> None:
        """The ``ValueError`` naming ``max_allowed_packet`` that ``add_items`` gives.

        Without it, an oversized item in a copy or import is sent anyway and the
        server drops the connection ("lost the connection (2006)").
        """
        if statements.limits is None or not data:
            return
        limit = (await conn.execute(statements.limits)).scalar_one()
        check_packet_size(data, int(limit))

    @classmethod
    def engine_defaults(cls, url: URL, kwargs: dict[str, Any]) -> None:  # noqa: ARG003
        """Ping a pooled connection at checkout: MySQL gives no sign of one closed while idle.

        (Postgres' driver knows, and is checked for free at checkout; the hot path's own
        connections here are replaced when they fail before ``COMMIT``.) Only the
        SQLAlchemy runner's checkouts (listings, metadata, migrations) pay the ping.
        """
        kwargs.setdefault("pool_pre_ping", True)

    @classmethod
    def _build_statements(cls, names: TableNames, expiry: bool) -> Statements:
        now = current_timestamp()
        base = portable_statements(
            names,
            now=now,
            upsert_session=_upsert_unless_expired if expiry else _upsert_session,
            role_of=_role_of,
            returning=False,
            clock=UTC_CLOCK if expiry else None,
        )
        sessions, messages = base.sessions, base.messages
        sid = sid_param(sessions)
        mine = messages.c.session_id == sid
        key = order_key(messages)
        newest = (
            select(key, messages.c.message_data)
            .where(mine if not expiry else and_(mine, live(sessions, sid, UTC_CLOCK)))
            .order_by(key.desc())
            .limit(1)
            .with_for_update()
        )
        fields = {f: getattr(base, f) for f in base.__dataclass_fields__}
        fields.update(
            pop=newest,
            delete_session=delete(sessions).where(sessions.c.session_id == sid),
            lock_session=select(sessions.c.session_id)
            .where(sessions.c.session_id == sid)
            .with_for_update(),
            limits=select(literal_column("@@max_allowed_packet")),
        )
        if expiry:
            fields["restart_session"] = (
                update(sessions)
                .where(sessions.c.session_id == sid, expired(sessions, UTC_CLOCK))
                .values(
                    updated_at=now,
                    expires_at=expires_param(sessions.c.expires_at.type),
                    last_position=sessions.c.last_position + counted(),
                )
            )
        return Statements(**fields)

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
        if not observed(engine):
            runner: Any = DriverRunner(engine, names, expiry=expiry)
            return Operations(engine, runner, on_corrupt, keyring, expiry=expiry)
        ops = Operations(
            engine,
            CoreRunner(engine, cls.statements(names, expiry), autocommit_single=False),
            on_corrupt,
            keyring,
            expiry=expiry,
        )
        # Through SQLAlchemy's asyncmy adapter a cancel mid-transaction is not contained
        # the way the driver runner contains it (by closing its connection): run to the end.
        ops.settles = False
        return ops

    @classmethod
    def upsert_metadata(cls, sessions: Table) -> Executable:
        sid = bindparam("sid", type_=sessions.c.session_id.type)
        meta = bindparam("meta", type_=sessions.c["metadata"].type)
        return (
            mysql.insert(sessions)
            .values(session_id=sid, metadata=meta)
            .on_duplicate_key_update(metadata=meta, updated_at=current_timestamp())
        )

    @classmethod
    def upsert_expiry(cls, sessions: Table) -> Executable:
        sid = bindparam("sid", type_=sessions.c.session_id.type)
        expires = bindparam("expires", type_=sessions.c.expires_at.type)
        return (
            mysql.insert(sessions)
            .values(session_id=sid, expires_at=expires)
            .on_duplicate_key_update(expires_at=expires)
        )

    @classmethod
    def bump_generation(cls, generations: Table) -> Executable:
        sid = bindparam("sid", type_=generations.c.session_id.type)
        return (
            mysql.insert(generations)
            .values(session_id=sid, generation=1)
            .on_duplicate_key_update(generation=generations.c.generation + 1)
        )

    @classmethod
    def metadata_filter(
        cls, sessions: Table, wanted: Mapping[str, MetadataFilterValue]
    ) -> ColumnElement[bool]:
        """``JSON_CONTAINS`` of ``{key: value}`` at the root, and not of ``{key: []}``.

        Containment compares keys and values as JSON (exact strings, numbers by
        value, ``true`` never ``1``, escaped and literal characters alike); the
        second test drops a value that is an array (containment would look inside
        it). No JSON path is built from the key: MariaDB's path parser refuses some
        quoted keys (``$."-1"``) and compares others as written, so ``naïve`` missed
        a document that stores it escaped. Works on MySQL's JSON type
        and on MariaDB's JSON-checked ``LONGTEXT`` alike.
        """
        column = sessions.c["metadata"]
        conditions: list[ColumnElement[bool]] = []
        for key, value in wanted.items():
            conditions += [
                func.json_contains(column, json.dumps({key: value})) == 1,
                func.json_contains(column, json.dumps({key: []})) == 0,
            ]
        return and_(*conditions)

    @classmethod
    @contextlib.contextmanager
    def migration_lock(
        cls, connection: Connection, key: int, what: str, row: Table | None = None
    ) -> Iterator[None]:
        """A named ``GET_LOCK`` held by the connection (there is no transactional DDL), or the row.

        Released on the way out, since a pooled connection outlives the migration.
        With ``row``, the lock table's row is locked ``FOR UPDATE`` by a second
        connection whose transaction stays open for the whole migration: the
        migrating connection's DDL commits implicitly, which would release a row
        lock of its own. A holder that dies (SIGKILL) loses its connection, and
        InnoDB releases the row. MariaDB's notes that a PRIMARY KEY's name is
        ignored stay off stderr meanwhile.
        """
        if row is not None:
            quiet_too = _LockTableNotes(row.name)
            _DRIVER_LOGGER.addFilter(quiet_too)
            try:
                with connection.engine.connect() as holder:
                    lock_table.ensure_row(holder, row)
                    holder.execute(
                        text("SET SESSION innodb_lock_wait_timeout = :s"),
                        {"s": MIGRATION_LOCK_TIMEOUT_S},
                    )
                    try:
                        try:
                            holder.execute(lock_table.lock_row(row))
                        except DBAPIError as exc:
                            if _code(exc.orig or exc) != _LOCK_WAIT_TIMEOUT:
                                raise
                            raise RuntimeError(_lock_held(what)) from None
                        yield
                    finally:
                        holder.rollback()
                        holder.execute(text("SET SESSION innodb_lock_wait_timeout = DEFAULT"))
            finally:
                _DRIVER_LOGGER.removeFilter(quiet_too)
            return
        quiet = _PrimaryKeyNameNotes()
        # GET_LOCK names are at most 64 characters: a digest of the lineage fits any set.
        name = f"agents_memory:{key & 0xFFFFFFFFFFFFFFFF:016x}"
        got = connection.execute(select(func.get_lock(name, MIGRATION_LOCK_TIMEOUT_S))).scalar()
        if got != 1:
            raise RuntimeError(_lock_held(what))
        _DRIVER_LOGGER.addFilter(quiet)
        try:
            yield
        finally:
            _DRIVER_LOGGER.removeFilter(quiet)
            connection.execute(select(func.release_lock(name)))

    @classmethod
    def advisory_locks_exclude(cls, engine: Engine) -> bool:
        """Two connections ``GET_LOCK`` one random name without waiting; the second must fail.

        A no-op ``GET_LOCK`` (older TiDB releases returned 1 to everyone) or none
        at all answers ``False``.
        """
        name = f"agents_memory:probe:{secrets.token_hex(8)}"
        try:
            with engine.connect() as first, engine.connect() as second:
                got_first = first.execute(select(func.get_lock(name, 0))).scalar()
                try:
                    got_second = second.execute(select(func.get_lock(name, 0))).scalar()
                finally:
                    first.execute(select(func.release_lock(name)))
                if got_second == 1:
                    second.execute(select(func.release_lock(name)))
                first.rollback()
                second.rollback()
        except DBAPIError:
            return False
        return got_first == 1 and got_second == 0

    @classmethod
    def compare_type(cls, dialect: Dialect, inspected_type: Any, metadata_type: Any) -> bool | None:  # noqa: ANN401
        """The fractional seconds of a ``DATETIME``, which Alembic's comparison skips.

        Alembic compares type arguments only when both sides have the same number
        of them, so ``DATETIME`` against ``DATETIME(6)`` would pass, and a column
        that lost its microseconds would go unnoticed. (MariaDB's ``JSON``,
        reflected as ``LONGTEXT``, needs nothing: Alembic treats the two as synonyms.)
        """
        wanted = metadata_type.dialect_impl(dialect)
        if isinstance(wanted, mysql.DATETIME) and isinstance(inspected_type, mysql.DATETIME):
            return bool((inspected_type.fsp or 0) != (wanted.fsp or 0))
        return None

    @classmethod
    def duplicate_key(cls, orig: BaseException) -> bool:
        return _code(orig) == _DUPLICATE_KEY

    @classmethod
    def classify(cls, orig: BaseException) -> str | None:
        code = _code(orig)
        if code == _DEADLOCK:
            return "deadlock"
        if code in _MISSING_CODES:
            return "missing"
        if code in _GONE_CODES:
            return "lost"
        if code in _CONNECT_CODES or isinstance(orig, OSError):
            return "connect"
        return None
