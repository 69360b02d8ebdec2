"""What every database module provides, and the parts they share.

The package never asks which database it is on: the backend looks up the
module for an engine once (:func:`database_for`, a registry keyed by
SQLAlchemy's dialect name, as Alembic's ``DefaultImpl`` is) and calls it. A
database module holds its statements (built here from the declarative models,
with the few per-database constructs it overrides), its transaction and pop
rules, its connection set-up and its driver runner.

Two runners execute one set of statements:

* the **driver runner** of each module runs the statements compiled once by
  SQLAlchemy's compiler (:class:`CompiledSQL`) on the driver's own connection;
* the **SQLAlchemy runner** (:class:`CoreRunner`) runs the same ``Executable``
  objects through an ``AsyncConnection``: what an engine with ``echo``, execution
  events or connect-time customisation gets, so what it observes sees every
  statement.

An operation's body is written once per database against :class:`Executor`
(async) or :class:`SyncExecutor` (SQLite's, which runs on a thread); each runner
hands the body an executor of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import importlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ClassVar, Protocol, TypeVar

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Executable,
    Table,
    and_,
    bindparam,
    case,
    delete,
    exists,
    func,
    insert,
    null,
    select,
)
from sqlalchemy.engine import URL, Connection, Dialect, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agents_memory._codec import OnCorrupt
from agents_memory._crypto import ENVELOPE_MARK, Keyring, check_deletable
from agents_memory._errors import SessionNotFoundError, TurnNotFoundError
from agents_memory._tables import TableNames
from agents_memory.models import get_models, legacy_tables

T = TypeVar("T")

Row = Sequence[Any]
"""``(position, message_data)`` (legacy tables: ``(id, message_data)``) as a runner returns it
(a driver row or a SQLAlchemy ``Row``)."""

MetadataFilterValue = str | int | float | bool


# -- statements ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Statements:
    """The protocol's statements for one table-name set on one database, built from the models.

    Every field but the tables is an ``Executable`` whose bind parameter names are
    the contract with the operation bodies: ``sid``, ``data``, ``n``, ``pos``, ``after``,
    ``before``, ``id`` and, where the database takes the clock from the client
    (SQLite), ``now``.
    """

    sessions: Table
    messages: Table
    upsert_session: Executable
    """Create the session row or bump its ``updated_at`` (``sid``); at head it also bumps
    ``last_position`` by ``n`` (the batch's size) and, where the database can, returns it."""
    insert_message: Executable
    """One item row; run with many parameter sets (``sid``, ``data``, at head ``pos``)."""
    select_all: Executable
    """Every ``(position, message_data)`` oldest first (``sid``; legacy tables: ``id``)."""
    select_latest: Executable
    """The newest ``n`` rows, newest first (``sid``, ``n``)."""
    select_after: Executable
    """Up to ``n`` rows above position ``after``, oldest first (``sid``, ``after``, ``n``)."""
    select_older: Executable
    """Up to ``n`` rows below position ``before``, newest first (``sid``, ``before``, ``n``)."""
    pop: Executable
    """Remove and return the newest row, or (MySQL) select and lock it (``sid``)."""
    delete_row: Executable
    """Delete one row of ``sid`` by its position (``id``): MySQL's second half of a pop."""
    delete_messages: Executable
    """All items of a session (``sid``)."""
    delete_session: Executable
    """The session row (``sid``); returns the id where the database can."""
    append: Executable | None = None
    """Postgres: upsert and multi-row insert as one statement (``sid``, ``data``)."""
    clear: Executable | None = None
    """Postgres: both deletes as one statement, returning the session id (``sid``)."""
    limits: Executable | None = None
    """MySQL: the server's statement size limit (``max_allowed_packet``)."""
    replace_rows: Executable | None = None
    """Postgres: delete a session's items, insert new ones, one statement (``sid``, ``data``)."""
    fork_session: Executable | None = None
    """A new session row (``new``) copying the metadata of ``sid``; returns its id where it can."""
    fork_cut: Executable | None = None
    """The position of the ``skip``-th (0-based) user item of ``sid``: where turn ``skip + 1``
    starts."""
    fork_items: Executable | None = None
    """Copy ``sid``'s items below position ``cut`` to ``new``, positions kept, on the database."""
    fork_structure: Executable | None = None
    """After ``fork_items``: the advanced sessions' turn rows of the copied items, for ``new``."""
    fork_usage: Executable | None = None
    """After ``fork_structure``: the usage of each (branch, turn) the fork holds a row of."""
    fork_branches: Executable | None = None
    """The branch names ``sid`` has used, reserved for ``new`` too."""
    share_source: Executable | None = None
    """Postgres: ``SELECT … FOR SHARE`` of the source's session row, a fork's first statement.

    Appends and replaces lock that row first, so they wait for the fork, whose
    statements each see their own snapshot (READ COMMITTED): the turn's cut and
    the copy then see one history. (MySQL's ``INSERT … SELECT`` share-locks what
    it reads already; SQLite has one writer.)
    """
    select_heads: Executable | None = None
    """The first characters of each encrypted row of a session (``sid``): what a clear checks."""
    pop_plain: Executable | None = None
    """Postgres: the one-statement pop, deleting the newest row only if it is not encrypted."""
    clear_plain: Executable | None = None
    """Postgres: the one-statement clear, only for a session holding no encrypted row."""
    drop_expired: Executable | None = None
    """Expiry variant: the items of ``sid`` if its deadline has passed (a write starts afresh)."""
    select_expired: Executable | None = None
    """Expiry variant: whether ``sid``'s deadline has passed (no row: none), by the clock its
    writes compare with (SQLite binds ``now``). What the advanced sessions ask, under the lock."""
    restart_session: Executable | None = None
    """MySQL's expiry variant: an expired row of ``sid`` started afresh (``expires``, its time)."""
    select_latest_locked: Executable | None = None
    """``select_latest`` locking its rows (``FOR UPDATE`` where the database has it): what a
    compaction swap compares its suffix with, under the session's write lock."""
    read_counter: Executable | None = None
    """Head: the session row's ``last_position`` (``sid``), read by a writer holding its lock
    where the upsert cannot return it (MySQL) and by the advanced sessions."""
    lock_session: Executable | None = None
    """Postgres, MySQL: ``SELECT … FOR UPDATE`` of the session row, a checked clear's first step.

    Every writer of a session's items locks that row first (appends and replaces
    upsert it, a rotation batch key-share-locks it), so once a clear holds it no
    row can appear or change under it between the check of the envelope heads and
    the delete: a writer with another keyring cannot slip in an envelope the
    clear's keyring could not open (the cascade would delete it unchecked).
    """


HEAD_CHARS = 120
"""How much of an encrypted row ``select_heads`` reads: the whole envelope header, and more."""


def envelope_heads(messages: Table, sid: Any) -> Executable:  # noqa: ANN401 - a BindParameter
    """``(id, head)`` of a session's rows that start with the envelope mark (see ``_crypto``).

    A clear reads these inside its transaction and refuses, deleting nothing, when
    the keyring could not open one of them.
    """
    return heads_where(messages, messages.c.session_id == sid)


def heads_where(messages: Table, where: ColumnElement[bool]) -> Executable:
    """``(id, head)`` of the encrypted rows among those ``where`` selects (see above).

    Every delete of items (a clear, a replace, a prune's batch) checks these first.
    """
    data = messages.c.message_data
    key = order_key(messages)
    return (
        select(key, func.substr(data, 1, HEAD_CHARS))
        .where(where, func.substr(data, 1, 2) == ENVELOPE_MARK)
        .order_by(messages.c.session_id, key)
    )


def check_heads(rows: Sequence[Row], keyring: Keyring | None) -> None:
    """Raise the typed error if ``keyring`` could not open one of the envelope ``rows``."""
    for row_id, head in rows:
        check_deletable(head, keyring, row_id=row_id)


def sid_param(sessions: Table) -> Any:  # noqa: ANN401 - a BindParameter
    """The ``sid`` bind parameter, typed as the session id column."""
    return bindparam("sid", type_=sessions.c.session_id.type)


def counted() -> Any:  # noqa: ANN401 - a BindParameter
    """The ``n`` bind parameter of a head upsert: how many positions the write takes."""
    return bindparam("n", type_=BigInteger())


def expires_param(type_: Any) -> Any:  # noqa: ANN401 - a BindParameter
    """The ``expires`` bind parameter of a write: the new deadline, or ``None`` (keep it).

    Typed as :meth:`Database.stamp_type` says (SQLite binds its text).
    """
    return bindparam("expires", type_=type_)


def expired(sessions: Table, clock: ColumnElement[Any]) -> ColumnElement[bool]:
    """The session row's deadline has passed (``clock``: UTC, as ``set_ttl`` writes it)."""
    return sessions.c.expires_at <= clock


def renewed_expiry(
    sessions: Table,
    clock: ColumnElement[Any],
    expires: Any,  # noqa: ANN401 - the expires_param
) -> ColumnElement[Any]:
    """What a write leaves in an existing row's ``expires_at``.

    The store's new deadline if it has a ``ttl``; else the row's own, unless it has
    passed (the write starts the session afresh, with no deadline).
    """
    kept = case((expired(sessions, clock), null()), else_=sessions.c.expires_at)
    return func.coalesce(expires, kept)


def live(sessions: Table, sid: Any, clock: ColumnElement[Any]) -> ColumnElement[bool]:  # noqa: ANN401
    """The session ``sid`` has not expired: one primary-key probe (no row counts as live).

    Uncorrelated, so the planner evaluates it once per statement, not once per row.
    """
    return ~exists().where(sessions.c.session_id == sid, expired(sessions, clock))


def expired_probe(sessions: Table, sid: Any, clock: ColumnElement[Any]) -> Executable:  # noqa: ANN401
    """``select_expired``: the session row's "has its deadline passed" (no row, no answer)."""
    return select(expired(sessions, clock)).where(sessions.c.session_id == sid)


def order_key(messages: Table) -> Any:  # noqa: ANN401 - a Column
    """The column that orders a session's items: ``position`` at head, ``id`` on legacy tables.

    Every read, pop and keyset filters by ``session_id`` too, so at head nothing
    orders by a sequence shared across sessions.
    """
    return messages.c.position if "position" in messages.c else messages.c.id


def tables_for(names: TableNames, head: bool) -> tuple[Table, Table]:
    """``(sessions, messages)``: the models' at head, else the legacy shape (``id``-keyed items)."""
    if head:
        models = get_models(names)
        return models.Session.__table__, models.Message.__table__
    return legacy_tables(names)


def numbered(
    sid: str, data: Sequence[str], top: int, extra: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """``insert_message``'s parameter sets: ``data`` at positions ``top - len(data) + 1 … top``.

    ``top`` is the session's ``last_position`` after the write's upsert bumped it by
    ``len(data)`` under the session row's lock, so the batch is contiguous and no
    other writer can hold any of its positions.
    """
    first = top - len(data) + 1
    more = dict(extra or {})
    return [{"sid": sid, "data": d, "pos": first + i, **more} for i, d in enumerate(data)]


async def upsert_counting(conn: AsyncConnection, st: Statements, params: Mapping[str, Any]) -> int:
    """Run ``st.upsert_session`` (bumping ``last_position`` by ``params["n"]``); the counter after.

    For writes through SQLAlchemy (compaction, advanced sessions, bulk copies), under
    the lock the upsert takes: its ``RETURNING`` where the database has one, else
    ``read_counter`` (the row this transaction just locked and changed). On legacy
    tables (no counter) ``n``: their inserts take ids from their own sequence.
    """
    result = await conn.execute(st.upsert_session, dict(params))
    if result.returns_rows:
        return int(result.scalar_one())
    if st.read_counter is None:
        return int(params["n"])
    return int((await conn.execute(st.read_counter, {"sid": params["sid"]})).scalar_one())


def portable_statements(
    names: TableNames,
    *,
    now: ColumnElement[Any],
    upsert_session: Callable[[Table, Any, ColumnElement[Any]], Executable],
    role_of: Callable[[ColumnElement[Any]], ColumnElement[Any]],
    item_time: ColumnElement[Any] | None = None,
    returning: bool = True,
    clock: ColumnElement[Any] | None = None,
    expires_type: Any = None,  # noqa: ANN401
    read_data: Callable[[ColumnElement[Any]], ColumnElement[Any]] | None = None,
) -> Statements:
    """The statements every database shares; a module replaces the few it writes its own way.

    ``now`` is the database's clock expression (or a client-side parameter) and
    ``upsert_session`` builds its create-or-touch statement for the sessions row.
    ``role_of`` reads an item's top-level ``"role"`` in SQL (``NULL`` for a row that
    is not a JSON object), so a fork finds where a turn starts without reading the
    items into Python. ``item_time`` stamps each item where the column default will
    not do (SQLite's keeps whole seconds); left out, the insert is plain
    ``VALUES (?, ?, ?)``, which drivers turn into one multi-row statement (asyncmy's
    ``executemany``). ``returning``: whether the database has ``INSERT … RETURNING``.

    ``clock`` (the UTC time deadlines are compared with) builds the head variant,
    for tables at head: items keyed by ``(session_id, position)`` (``insert_message``
    takes ``pos``, see :func:`numbered`), reads, pops and forks of an expired
    session see nothing, and ``drop_expired`` is there for a write to start it
    afresh; a fork's new row takes the ``expires`` parameter (typed
    ``expires_type``: the store's deadline, or ``None``). Without it, the legacy
    statements (tables created by the Agents SDK or the seed, never migrated:
    ordered by their ``id``, no expiry).
    """
    head = clock is not None
    sessions, messages = tables_for(names, head)
    key = order_key(messages)
    sid = sid_param(sessions)
    data = messages.c.message_data
    cols = (key, data if read_data is None else read_data(data))
    every = messages.c.session_id == sid
    mine = every if clock is None else and_(every, live(sessions, sid, clock))
    newest = select(*cols).where(mine).order_by(key.desc())
    new = bindparam("new", type_=sessions.c.session_id.type)
    source = sessions.c.session_id == sid
    if clock is not None:
        source = and_(source, live(sessions, sid, clock))  # (not ~expired: NULL is live)
    copied = [new, now.label("c"), now.label("u")]
    columns = ["session_id", "created_at", "updated_at"]
    item_columns = ["session_id", "message_data", "created_at"]
    item_values = [new, messages.c.message_data, messages.c.created_at]
    values: dict[str, Any] = {"session_id": bindparam("sid"), "message_data": bindparam("data")}
    fork_structure = fork_usage = fork_branches = None
    if clock is not None:
        kind = sessions.c.expires_at.type if expires_type is None else expires_type
        # The fork keeps each item's position, so its counter starts where the source's is.
        copied += [
            sessions.c["metadata"],
            expires_param(kind).label("e"),
            sessions.c.last_position,
        ]
        columns += ["metadata", "expires_at", "last_position"]
        item_columns.append("position")
        item_values.append(messages.c.position)
        values["position"] = bindparam("pos", type_=messages.c.position.type)
        fork_structure, fork_usage, fork_branches = _fork_advanced(get_models(names), sid, new)
    fork_session: Any = insert(sessions).from_select(columns, select(*copied).where(source))
    if returning:
        fork_session = fork_session.returning(sessions.c.session_id)
    if item_time is not None:
        values["created_at"] = item_time
    return Statements(
        sessions=sessions,
        messages=messages,
        upsert_session=upsert_session(sessions, sid, now),
        insert_message=insert(messages).values(**values),
        select_all=select(*cols).where(mine).order_by(key),
        select_latest=newest.limit(bindparam("n")),
        select_latest_locked=newest.limit(bindparam("n")).with_for_update(),
        select_after=select(*cols)
        .where(mine, key > bindparam("after"))
        .order_by(key)
        .limit(bindparam("n")),
        select_older=newest.where(key < bindparam("before")).limit(bindparam("n")),
        pop=delete(messages)
        .where(every, key == newest.with_only_columns(key).limit(1).scalar_subquery())
        .returning(*cols),
        delete_row=delete(messages).where(every, key == bindparam("id")),
        delete_messages=delete(messages).where(every),
        delete_session=delete(sessions)
        .where(sessions.c.session_id == sid)
        .returning(sessions.c.session_id),
        fork_session=fork_session,
        fork_cut=select(key)
        .where(mine, role_of(messages.c.message_data) == "user")
        .order_by(key)
        .limit(1)
        .offset(bindparam("skip")),
        fork_items=insert(messages).from_select(
            item_columns,
            select(*item_values).where(mine, key < bindparam("cut", type_=key.type)).order_by(key),
        ),
        select_heads=envelope_heads(messages, sid),
        # The session's own key range, then its deadline: a server locks only what the
        # range visits (MariaDB ran ``session_id IN (the id, if expired)`` as a full scan
        # of the items, next-key-locking each); SQLite writes its own (``_expired_items``).
        drop_expired=None
        if clock is None
        else delete(messages).where(
            every, exists().where(sessions.c.session_id == sid, expired(sessions, clock))
        ),
        select_expired=None if clock is None else expired_probe(sessions, sid, clock),
        read_counter=None
        if clock is None
        else select(sessions.c.last_position).where(sessions.c.session_id == sid),
        fork_structure=fork_structure,
        fork_usage=fork_usage,
        fork_branches=fork_branches,
    )


def _fork_advanced(models: Any, sid: Any, new: Any) -> tuple[Executable, Executable, Executable]:  # noqa: ANN401
    """A fork's copies of what advanced sessions keep beside the items, all ``INSERT … SELECT``.

    The copied items keep their positions (``fork_items``), so the structure rows
    of those below the cut are copied as they are, pointing at the same positions
    in the fork. Usage goes with each (branch, turn) the fork holds a structure
    row of; every branch name the source used stays reserved in the fork.
    """
    messages, structure = models.Message.__table__, models.Structure.__table__
    usage, branches = models.TurnUsage.__table__, models.Branch.__table__
    cut = bindparam("cut", type_=messages.c.position.type)
    s, u = structure.c, usage.c
    # every column but the session id, which becomes the fork's
    columns = [c.name for c in structure.columns if c.name != "session_id"]
    copy_structure = insert(structure).from_select(
        ["session_id", *columns],
        select(new, *(s[c] for c in columns))
        .where(s.session_id == sid, s.message_position < cut)
        .order_by(s.branch_id, s.sequence_number),
    )
    held = select(s.sequence_number).where(
        s.session_id == new, s.branch_id == u.branch_id, s.user_turn_number == u.user_turn_number
    )
    counts = [c.name for c in usage.columns if c.name != "session_id"]
    copy_usage = insert(usage).from_select(
        ["session_id", *counts],
        select(new, *(u[c] for c in counts))
        .where(u.session_id == sid, exists(held))
        .order_by(u.branch_id, u.user_turn_number),
    )
    b = branches.c
    copy_branches = insert(branches).from_select(
        ["session_id", "branch_id", "created_at"],
        select(new, b.branch_id, b.created_at).where(b.session_id == sid),
    )
    return copy_structure, copy_usage, copy_branches


GROUP_COMMIT_OPTION = "agents_memory_group_commit"
"""The engine execution option for group commit: one switch, read by each database's module.

``create_engine(url, execution_options={"agents_memory_group_commit": False})`` turns
it off. On by default on SQLite (one writer per file: callers queue anyway) and for
Postgres appends (they group only once every pooled connection holds one: callers wait
for a connection anyway). An engine setting, set with SQLAlchemy's own keyword, so no
public signature changes.
"""


def group_commit_option(engine: AsyncEngine, *, default: bool) -> bool:
    """The engine's :data:`GROUP_COMMIT_OPTION`, or ``default`` when it does not say."""
    return bool(engine.sync_engine.get_execution_options().get(GROUP_COMMIT_OPTION, default))


@dataclasses.dataclass(frozen=True, slots=True)
class CompiledSQL:
    """One statement compiled for a driver: its text and how to order the parameters.

    SQLAlchemy's compiler quotes identifiers and renders the driver's
    placeholder style; constants of the statement (``LIMIT 1``, ``OFFSET 0``)
    are bind parameters whose values are taken from the compiled form once.
    """

    sql: str
    order: tuple[str, ...]
    constants: Mapping[str, Any]

    def positional(self, params: Mapping[str, Any]) -> tuple[Any, ...]:
        """The parameters in placeholder order (for ``?``, ``$n`` and ``%s`` drivers).

        ``map`` over the mapping's own lookup, not a generator: this runs for every
        row of every write (half the time, on a four-item append's six calls).
        """
        if self.constants:
            params = {**self.constants, **params}
        return tuple(map(params.__getitem__, self.order))


def compile_for(statement: Executable, dialect: Dialect) -> CompiledSQL:
    """Compile ``statement`` once for ``dialect`` (the engine's: same quoting, same style)."""
    compiled: Any = statement.compile(dialect=dialect)  # type: ignore[attr-defined]
    order = tuple(compiled.positiontup or ())
    constants = {key: bind.value for key, bind in compiled.binds.items() if bind.value is not None}
    return CompiledSQL(str(compiled), order, constants)


def compile_all(st: Statements, dialect: Dialect) -> dict[str, CompiledSQL]:
    """Every statement of ``st`` compiled once for ``dialect``, by field name (the tables aside)."""
    return {
        field: compile_for(value, dialect)
        for field in st.__dataclass_fields__
        if field not in ("sessions", "messages") and (value := getattr(st, field)) is not None
    }


# -- executors and runners ----------------------------------------------------------------------


class Executor(Protocol):
    """Runs statements (by ``Statements`` field name) on one connection, within one operation."""

    async def rows(self, key: str, params: Mapping[str, Any]) -> Sequence[Row]:
        """Run a statement and return all its rows."""
        ...

    async def run(self, key: str, params: Mapping[str, Any]) -> int:
        """Run a statement for its effect; the number of rows it changed."""
        ...

    async def runmany(self, key: str, params: Sequence[Mapping[str, Any]]) -> None:
        """Run a statement once per parameter set."""
        ...


class SyncExecutor(Protocol):
    """:class:`Executor` for bodies that run on a thread (SQLite's)."""

    def rows(self, key: str, params: Mapping[str, Any]) -> Sequence[Row]:
        """Run a statement and return all its rows."""
        ...

    def run(self, key: str, params: Mapping[str, Any]) -> int:
        """Run a statement for its effect; the number of rows it changed."""
        ...

    def runmany(self, key: str, params: Sequence[Mapping[str, Any]]) -> None:
        """Run a statement once per parameter set."""
        ...


class CoreExecutor:
    """:class:`Executor` over an ``AsyncConnection``: the statements as SQLAlchemy runs them."""

    __slots__ = ("_conn", "_st")

    def __init__(self, conn: AsyncConnection, st: Statements) -> None:
        self._conn = conn
        self._st = st

    async def rows(self, key: str, params: Mapping[str, Any]) -> Sequence[Row]:
        return (await self._conn.execute(getattr(self._st, key), dict(params))).all()

    async def run(self, key: str, params: Mapping[str, Any]) -> int:
        result = await self._conn.execute(getattr(self._st, key), dict(params))
        return int(result.rowcount)

    async def runmany(self, key: str, params: Sequence[Mapping[str, Any]]) -> None:
        await self._conn.execute(getattr(self._st, key), [dict(p) for p in params])


class CoreSyncExecutor:
    """:class:`SyncExecutor` over a sync ``Connection`` (inside ``AsyncConnection.run_sync``)."""

    __slots__ = ("_conn", "_st")

    def __init__(self, conn: Connection, st: Statements) -> None:
        self._conn = conn
        self._st = st

    def rows(self, key: str, params: Mapping[str, Any]) -> Sequence[Row]:
        return self._conn.execute(getattr(self._st, key), dict(params)).all()

    def run(self, key: str, params: Mapping[str, Any]) -> int:
        result = self._conn.execute(getattr(self._st, key), dict(params))
        return int(result.rowcount)

    def runmany(self, key: str, params: Sequence[Mapping[str, Any]]) -> None:
        self._conn.execute(getattr(self._st, key), [dict(p) for p in params])


class Runner(Protocol):
    """Hands an operation body an executor: for a read, or inside one write transaction."""

    async def read(self, body: Callable[[Any], Awaitable[T]]) -> T:
        """Run ``body(executor)`` for a read."""
        ...

    async def write(self, body: Callable[[Any], Awaitable[T]], *, single: bool = False) -> T:
        """Run ``body(executor)`` as one transaction (``single``: it is one statement)."""
        ...


class CoreRunner:
    """The SQLAlchemy runner: a connection from the engine's pool per operation.

    ``autocommit_single`` lets a one-statement write run without BEGIN/COMMIT
    where the database makes a single statement atomic on its own (Postgres).
    """

    def __init__(self, engine: AsyncEngine, st: Statements, *, autocommit_single: bool) -> None:
        self._engine = engine
        self._st = st
        self._autocommit = (
            engine.execution_options(isolation_level="AUTOCOMMIT") if autocommit_single else None
        )

    async def read(self, body: Callable[[Any], Awaitable[T]]) -> T:
        async with (self._autocommit or self._engine).connect() as conn:
            return await body(CoreExecutor(conn, self._st))

    async def write(self, body: Callable[[Any], Awaitable[T]], *, single: bool = False) -> T:
        if single and self._autocommit is not None:
            async with self._autocommit.connect() as conn:
                return await body(CoreExecutor(conn, self._st))
        async with self._engine.begin() as conn:
            return await body(CoreExecutor(conn, self._st))


def observed(engine: AsyncEngine) -> bool:
    """Whether ``engine`` logs or intercepts statements, so they must run through SQLAlchemy.

    Checked when a backend picks its runner and before each operation (listeners
    may be added at any time); a few attribute reads.
    """
    sync_engine = engine.sync_engine
    events = sync_engine.dispatch
    dialect_events = sync_engine.dialect.dispatch
    return bool(
        sync_engine.echo
        or events.before_execute
        or events.after_execute
        or events.before_cursor_execute
        or events.after_cursor_execute
        or dialect_events.handle_error
        or dialect_events.do_execute
        or dialect_events.do_executemany
    )


def foreign_listeners(sync_engine: Engine, event_name: str, ours: Sequence[object]) -> bool:
    """Whether someone else listens for a pool/dialect event we would bypass (``connect``…).

    SQLAlchemy's own listeners (the dialect's connect hook) do not count.
    """
    target: Any = (
        sync_engine.dialect.dispatch if event_name.startswith("do_") else sync_engine.pool.dispatch
    )
    return any(
        fn not in ours and not str(getattr(fn, "__module__", "")).startswith("sqlalchemy.")
        for fn in getattr(target, event_name)
    )


def wrap_driver_error(
    exc: Exception,
    engine: AsyncEngine,
    statement: str,
    params: object,
    *,
    gone: bool,
) -> Exception:
    """A driver's exception as SQLAlchemy's execution would raise it: a ``sqlalchemy.exc`` class.

    Callers and the rest of the package see one kind of error whichever runner
    ran the statement; parameters are hidden when the engine says so.
    """
    wrapped: Exception = DBAPIError.instance(
        statement,
        None if params is None else dict(params) if isinstance(params, Mapping) else None,
        exc,
        Exception,
        hide_parameters=engine.sync_engine.hide_parameters,
        connection_invalidated=gone,
        dialect=engine.dialect,
    )
    return wrapped


# -- the database interface ---------------------------------------------------------------------


class Operations(Protocol):
    """The protocol's operations on one engine and name set, as a database module runs them."""

    async def add(self, session_id: str, data: Sequence[str], expires: object = None) -> None:
        """Upsert the session and append the encoded items, atomically and contiguously.

        ``expires`` (a :meth:`Database.stamp` value) is the session's new deadline (a
        store with a ``ttl``); ``None`` keeps the one it has. On the expiry variant a
        session whose deadline has passed starts afresh: its old items are deleted
        in the same transaction.
        """
        ...

    async def latest(self, session_id: str, n: int) -> Sequence[Row]:
        """The newest ``n`` rows, newest first."""
        ...

    async def everything(self, session_id: str) -> Sequence[Row]:
        """Every row, oldest first."""
        ...

    async def after(self, session_id: str, after: int, n: int) -> Sequence[Row]:
        """Up to ``n`` rows above ``after``, oldest first."""
        ...

    async def older(self, session_id: str, before: int, n: int) -> Sequence[Row]:
        """Up to ``n`` rows below ``before``, newest first."""
        ...

    async def pop(self, session_id: str) -> dict[str, Any] | None:
        """Remove and return the newest valid item (corrupt rows on the way: ``on_corrupt``)."""
        ...

    async def clear(self, session_id: str, *, checked: bool = True) -> bool:
        """Delete the session row and its items; whether the session existed.

        ``checked``: first refuse (the typed error) if the keyring could not open an
        encrypted row of the session; ``False`` deletes them anyway (a lost key).
        """
        ...

    async def replace(self, session_id: str, data: Sequence[str], expires: object = None) -> None:
        """Swap the session's items for ``data`` in one transaction (the row upserted first).

        ``expires`` as for :meth:`add`.
        """
        ...

    async def fork(
        self, session_id: str, new_session_id: str, skip: int | None, expires: object = None
    ) -> None:
        """Copy the session (row and items, or the items before user turn ``skip + 1``).

        One transaction; on the expiry variant the new session's deadline is
        ``expires`` (the store's ``ttl``) and an expired source is not found. Raises
        :class:`~agents_memory.SessionNotFoundError` when the source does not exist,
        :class:`~agents_memory.TurnNotFoundError` when it has no such turn, and the
        driver's unique-key error when the target exists (:meth:`Database.duplicate_key`).
        """
        ...


NO_CUT = 2**63 - 1
"""The ``cut`` of a fork that copies every item (no position or id reaches it)."""


def _no_source(session_id: str) -> SessionNotFoundError:
    return SessionNotFoundError(
        f"session {session_id!r} does not exist, so there is nothing to fork; "
        "check the id (SessionStore.get_session or list_sessions)"
    )


def _no_turn(session_id: str, skip: int) -> TurnNotFoundError:
    return TurnNotFoundError(
        f"session {session_id!r} has fewer than {skip + 1} user turns; at_turn counts the "
        "items whose role is 'user' from 1 (SessionStore.get_session shows its item count)"
    )


async def fork_body(
    ex: Executor,
    session_id: str,
    new_session_id: str,
    skip: int | None,
    *,
    returning: bool,
    share_source: bool = False,
    expires: object = None,
    advanced: bool = True,
) -> None:
    """A fork on a server, one transaction (the caller's): the session row, the cut, the items.

    The new row is an ``INSERT … SELECT`` of the source's: none inserted means no
    source; a target that exists fails on the primary key (the race of two forks
    to one target is the key's to settle: the second waits for the first, then fails).
    ``advanced``: copy the advanced sessions' rows too (tables at head; legacy tables
    have none).
    """
    params = {"sid": session_id, "new": new_session_id, "expires": expires}
    if share_source:
        await ex.rows("share_source", {"sid": session_id})
    if returning:
        created = len(await ex.rows("fork_session", params))
    else:
        created = await ex.run("fork_session", params)
    if not created:
        raise _no_source(session_id)
    cut = NO_CUT
    if skip is not None:
        rows = await ex.rows("fork_cut", {"sid": session_id, "skip": skip})
        if not rows:
            raise _no_turn(session_id, skip)
        cut = int(rows[0][0])
    await ex.run("fork_items", {**params, "cut": cut})
    if advanced:
        await ex.run("fork_structure", {**params, "cut": cut})
        await ex.run("fork_usage", params)
        await ex.run("fork_branches", params)


def fork_body_sync(  # noqa: PLR0917 - fork_body's arguments, and the clock
    ex: SyncExecutor,
    session_id: str,
    new_session_id: str,
    skip: int | None,
    now: str,
    expires: object = None,
    *,
    advanced: bool = True,
) -> None:
    """:func:`fork_body` on a thread (SQLite: ``RETURNING``, and the client clock ``now``)."""
    params = {"sid": session_id, "new": new_session_id, "now": now, "expires": expires}
    if not ex.rows("fork_session", params):
        raise _no_source(session_id)
    cut = NO_CUT
    if skip is not None:
        rows = ex.rows("fork_cut", {"sid": session_id, "skip": skip})
        if not rows:
            raise _no_turn(session_id, skip)
        cut = int(rows[0][0])
    ex.run("fork_items", {**params, "cut": cut})
    if advanced:
        ex.run("fork_structure", {**params, "cut": cut})
        ex.run("fork_usage", params)
        ex.run("fork_branches", params)


class RowReads:
    """The four reads of :class:`Operations`, written once over one method: ``_rows``."""

    async def _rows(self, key: str, params: dict[str, Any]) -> Sequence[Row]:
        """Run the read statement ``key`` with ``params``; all its rows."""
        raise NotImplementedError

    async def latest(self, session_id: str, n: int) -> Sequence[Row]:
        """The newest ``n`` rows, newest first."""
        return await self._rows("select_latest", {"sid": session_id, "n": n})

    async def everything(self, session_id: str) -> Sequence[Row]:
        """Every row, oldest first."""
        return await self._rows("select_all", {"sid": session_id})

    async def after(self, session_id: str, after: int, n: int) -> Sequence[Row]:
        """Up to ``n`` rows above ``after``, oldest first."""
        return await self._rows("select_after", {"sid": session_id, "after": after, "n": n})

    async def older(self, session_id: str, before: int, n: int) -> Sequence[Row]:
        """Up to ``n`` rows below ``before``, newest first."""
        return await self._rows("select_older", {"sid": session_id, "before": before, "n": n})


class Database:
    """One database's rules. Subclasses register themselves by SQLAlchemy dialect name."""

    name: ClassVar[str]
    """Our name for the family (``sqlite``, ``postgresql``, ``mysql``)."""
    dialect_names: ClassVar[tuple[str, ...]]
    """SQLAlchemy dialect names served (MariaDB's ``mariadb`` is MySQL's family)."""
    serialize_writes: ClassVar[bool] = False
    """Whether writers of one engine must queue (SQLite: one writer per file)."""
    loop_bound: ClassVar[bool] = True
    """Whether the driver's connections belong to the event loop that opened them."""
    label: ClassVar[str]
    """The family's name in messages (``SQLite``, ``Postgres``, ``MySQL/MariaDB``)."""
    hash_partitions: ClassVar[bool] = False
    """Whether the messages table can be hash-partitioned by session id (``partitions=N``)."""

    _registry: ClassVar[dict[str, type[Database]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:  # noqa: ANN401
        super().__init_subclass__(**kwargs)
        for dialect_name in cls.dialect_names:
            Database._registry[dialect_name] = cls

    # -- engine set-up ------------------------------------------------------------------------

    @classmethod
    def engine_defaults(cls, url: URL, kwargs: dict[str, Any]) -> None:
        """Fill in ``create_engine`` keyword defaults for this database (pool, connect args)."""

    @classmethod
    def configure_engine(cls, sync_engine: Engine) -> None:
        """Install connection set-up events on an engine, once, at first sight."""

    @classmethod
    def one_connection(cls, url: URL) -> bool:  # noqa: ARG003 - the interface
        """Whether the whole database lives in one connection (in-memory SQLite)."""
        return False

    # -- statements -----------------------------------------------------------------------------

    @classmethod
    @functools.cache
    def statements(cls, names: TableNames, expiry: bool = False) -> Statements:
        """The statements of ``names`` on this database (built once per name set and variant).

        ``expiry``: the head variant (revision 0006): items keyed by ``(session_id,
        position)`` from the session row's counter, expired sessions read as empty and
        a write renews or restarts them. ``False``: the legacy statements, for tables
        the Agents SDK or the seed created and nobody migrated (items keyed by a
        global ``id``, no expiry).
        """
        return cls._build_statements(names, expiry)

    @classmethod
    def _build_statements(cls, names: TableNames, expiry: bool) -> Statements:
        raise NotImplementedError

    @classmethod
    def partition_count(cls, connection: Connection, table: str) -> int | None:  # noqa: ARG003
        """How many hash partitions ``table`` has; ``None``: a plain table (or no such table)."""
        return None

    @classmethod
    def upsert_metadata(cls, sessions: Table) -> Executable:
        """Create the session row with metadata, or replace its metadata (``sid``, ``meta``)."""
        raise NotImplementedError

    @classmethod
    def upsert_expiry(cls, sessions: Table) -> Executable:
        """Create the session row with an expiry, or set its expiry (``sid``, ``expires``).

        ``expires`` is a :meth:`stamp` value or ``None`` (never). Setting it is not a
        write to the conversation: an existing row's ``updated_at`` is left alone.
        Takes :meth:`metadata_params` too (SQLite's clock, for a new row).
        """
        raise NotImplementedError

    @classmethod
    def bump_generation(cls, generations: Table) -> Executable:
        """Count one more clear of the advanced session ``sid``: 1 for a new row, else + 1.

        One statement (the database's upsert), so two clears of sessions without a
        row yet never both insert, nor wait on each other's gap.
        """
        raise NotImplementedError

    @classmethod
    def metadata_filter(
        cls, sessions: Table, wanted: Mapping[str, MetadataFilterValue]
    ) -> ColumnElement[bool]:
        """Sessions whose metadata has every key of ``wanted`` with exactly that scalar value."""
        raise NotImplementedError

    @classmethod
    def metadata_params(cls) -> dict[str, Any]:
        """Extra parameters :meth:`upsert_metadata` needs (SQLite: the client clock)."""
        return {}

    @classmethod
    def clock_params(cls) -> dict[str, Any]:
        """Parameters a write's statements take for the time (SQLite: the client clock, ``now``).

        For statements run through SQLAlchemy outside the operations (the advanced
        sessions' ``upsert_session`` and ``insert_message``); empty where the
        database's own clock fills the columns.
        """
        return {}

    @classmethod
    def stamp(cls, value: dt.datetime) -> object:
        """A naive UTC time as this database's timestamp column takes it as a parameter."""
        return value

    @classmethod
    def byte_length(cls, column: ColumnElement[Any]) -> ColumnElement[int]:
        """The size in bytes of a text column's value (``stats``: how big a session is)."""
        return func.octet_length(column)

    @classmethod
    def stamp_type(cls, column_type: Any) -> Any:  # noqa: ANN401
        """The bind type for :meth:`stamp` values (the column's own, except SQLite's text)."""
        return column_type

    # -- operations -----------------------------------------------------------------------------

    @classmethod
    def operations(
        cls,
        engine: AsyncEngine,
        names: TableNames,
        on_corrupt: OnCorrupt,
        keyring: Keyring | None = None,
        *,
        expiry: bool = False,
    ) -> Operations:
        """The operations on ``engine``: on the driver where possible, else through SQLAlchemy.

        ``keyring`` opens encrypted rows where an operation must read one before it
        deletes it (pop) or must know it could (clear). ``expiry``: run the head
        variant's statements (:meth:`statements`), chosen by the schema check.
        """
        raise NotImplementedError

    # -- migrations -----------------------------------------------------------------------------

    @classmethod
    def migration_lock(
        cls, connection: Connection, key: int, what: str, row: Table | None = None
    ) -> contextlib.AbstractContextManager[None]:
        """Serialise migrators of one lineage (``key``) across processes, inside its transaction.

        ``row``: the lineage's migration lock table, whose one row is locked
        instead of the advisory lock (made first, race-safe, if missing).
        """
        raise NotImplementedError

    @classmethod
    def advisory_locks_exclude(cls, engine: Engine) -> bool:  # noqa: ARG003
        """Whether this server's advisory lock, taken on two connections, really excludes.

        Asked once per URL by ``lock="auto"``; ``False`` (granted twice, or no such
        function) makes migrations lock a row instead.
        """
        return True

    @classmethod
    async def check_item_sizes(
        cls,
        conn: AsyncConnection,  # noqa: ARG003
        statements: Statements,  # noqa: ARG003
        data: Sequence[str],  # noqa: ARG003
    ) -> None:
        """Refuse encoded items the server could not take in one statement (none, by default).

        The bulk path (copy, import) calls it before writing a batch, as ``add`` does.
        """
        return

    @classmethod
    def rebuild_guard(cls, connection: Connection) -> contextlib.AbstractContextManager[None]:  # noqa: ARG003
        """What must hold around a migration that may rebuild tables (nothing, by default)."""
        return contextlib.nullcontext()

    @classmethod
    def compare_type(
        cls,
        dialect: Dialect,  # noqa: ARG003
        inspected_type: Any,  # noqa: ANN401, ARG003
        metadata_type: Any,  # noqa: ANN401, ARG003
    ) -> bool | None:
        """A type difference Alembic's comparison misses (``None``: leave it to Alembic)."""
        return None

    # -- errors ---------------------------------------------------------------------------------

    @classmethod
    def duplicate_key(cls, orig: BaseException) -> bool:  # noqa: ARG003
        """Whether a driver error is a primary-key/unique violation (a fork's target exists)."""
        return False

    @classmethod
    def classify(cls, orig: BaseException) -> str | None:  # noqa: ARG003
        """What a driver error means.

        ``busy``, ``lost``, ``connect``, ``deadlock`` (the server rolled the whole
        transaction back to resolve a conflict: a deadlock victim or a serialization
        failure; safe to run again), ``missing`` (a table or column: the schema is not
        at head), ``notadb`` (a file that is not this database's) or ``None`` (nothing
        we name).
        """
        return None

    @classmethod
    def describe(cls, url: URL) -> str:
        """The database as an error message names it (never with its password)."""
        from agents_memory._urls import mask_url  # noqa: PLC0415

        host = f"{url.host or 'localhost'}:{url.port}" if url.port else (url.host or "localhost")
        return f"{host} ({mask_url(url)})"

    @classmethod
    def cannot_open_advice(cls, database: str | None, kind: str) -> str | None:  # noqa: ARG003
        """How to fix a database file that cannot be opened; ``None`` for servers.

        ``kind`` is :meth:`classify`'s ``connect`` or ``notadb``; both SQLite classes
        (through ``_faults`` and ``SQLiteSession``) word the failure with it.
        """
        return None


_MODULES = {"sqlite": "sqlite", "postgresql": "postgres", "mysql": "mysql", "mariadb": "mysql"}
"""Which module serves a SQLAlchemy dialect: only that one is imported (and its driver)."""

_EXTRAS = {"asyncpg": "postgres", "asyncmy": "mysql"}
"""The package extra that installs each optional driver."""


def database_for(dialect_name: str) -> type[Database]:
    """The module for a SQLAlchemy dialect name, imported on first use (which registers it).

    Only the module asked for is imported, so SQLite never needs the server drivers;
    a server driver that is not installed is a ``ModuleNotFoundError`` naming the
    extra that installs it.
    """
    module = _MODULES.get(dialect_name)
    if module is None:
        msg = f"no database module for SQLAlchemy dialect {dialect_name!r}"
        raise LookupError(msg)
    try:
        importlib.import_module(f"agents_memory._databases.{module}")
    except ModuleNotFoundError as exc:
        extra = _EXTRAS.get((exc.name or "").partition(".")[0])
        if extra is None:
            raise
        msg = (
            f"{dialect_name} URLs need the {exc.name} driver, which is not installed: "
            f"pip install 'agents-memory[{extra}]'"
        )
        raise ModuleNotFoundError(msg, name=exc.name) from exc
    return Database._registry[dialect_name]  # noqa: SLF001 - the registry's own module
