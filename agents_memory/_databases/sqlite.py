"""SQLite: its statements, its write transactions, its connection set-up and its thread runner.

SQLite allows one writer per file. Every write is one transaction that starts
with ``BEGIN IMMEDIATE`` (the file's write lock is taken, waiting up to the busy
timeout, before anything is read, so a writer never meets the unretryable busy
error of a reader that later writes) and rolls back on any error.

The driver runner talks to the stdlib ``sqlite3`` module on threads of its own:
a file engine gets one writer and one reader connection, each owned by one
thread (:class:`Worker`), and an operation is one job on that thread: one hop
between the event loop and the thread however many statements it runs. Writers
queue on the writer's thread in arrival order, and those queued behind a
commit share the next transaction (group commit, :class:`GroupWriter`); readers
read beside a write under WAL. The stdlib ``SQLiteSession`` runs the same jobs on its own worker.
This is all public API (``sqlite3``, ``concurrent.futures``); aiosqlite serves
only the SQLAlchemy runner (in-memory databases, observed engines, migrations).

The clock: ``CURRENT_TIMESTAMP`` keeps whole seconds, so the time of a write is
taken in the process, to the microsecond, and bound as text in SQLite's own
format (``YYYY-MM-DD HH:MM:SS.ffffff``), which sorts correctly beside the
second-precision text older rows hold.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import datetime as dt
import functools
import itertools
import json
import queue
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from sqlalchemy import (
    Column,
    ColumnElement,
    Executable,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    and_,
    bindparam,
    case,
    cast,
    delete,
    event,
    exists,
    func,
    insert,
    literal,
    literal_column,
    null,
    select,
)
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import URL, Engine
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import StaticPool
from sqlalchemy.schema import CreateIndex, CreateTable

from agents_memory._codec import OnCorrupt, decode_row
from agents_memory._crypto import Keyring
from agents_memory._databases.base import (
    CompiledSQL,
    CoreSyncExecutor,
    Database,
    MetadataFilterValue,
    Row,
    RowReads,
    Statements,
    SyncExecutor,
    check_heads,
    compile_all,
    compile_for,
    counted,
    expired,
    expired_probe,
    expires_param,
    foreign_listeners,
    fork_body_sync,
    group_commit_option,
    numbered,
    observed,
    portable_statements,
    renewed_expiry,
    sid_param,
    tables_for,
    wrap_driver_error,
)
from agents_memory._migrations import _lock as lock_table
from agents_memory._tables import VERSION_KEY_SUFFIX, TableNames
from agents_memory.models import get_models

T = TypeVar("T")

_SQLITE_BUSY = 5
_SQLITE_CANTOPEN = 14
_SQLITE_NOTADB = 26
_SQLITE_DUPLICATE = frozenset({1555, 2067})
"""SQLITE_CONSTRAINT_PRIMARYKEY, SQLITE_CONSTRAINT_UNIQUE."""
BUSY_TIMEOUT_MS = 30_000
"""How long a SQLite writer waits for another *process* holding the file's write lock."""

DIALECT = sqlite_dialect.dialect(paramstyle="qmark")
"""What our statements are compiled for: the stdlib driver's ``?`` placeholders."""


# -- connection set-up --------------------------------------------------------------------------


def _tolerant_text(data: bytes) -> str | bytes:
    """Decode a TEXT value; hand back the raw bytes when it is not valid UTF-8.

    SQLite stores whatever a writer gives it. With the default decoder, one row
    holding invalid UTF-8 (written behind our back) fails the whole read, and a
    pop can never get past it; as bytes it reaches the codec, which reports the
    row as corrupt and skips it like any other.
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data


def configure(dbapi_connection: Any, *, wal: bool = True) -> None:  # noqa: ANN401
    """Set up a connection as all of ours are: tolerant text, busy timeout, foreign keys, WAL.

    The one place for it: the engine's connect hook (an aiosqlite adapter), our
    driver runner's and the stdlib ``SQLiteSession``'s ``sqlite3`` connections.
    """
    getattr(dbapi_connection, "driver_connection", dbapi_connection).text_factory = _tolerant_text
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys = ON")
        if wal:
            cursor.execute("PRAGMA journal_mode = WAL")
    finally:
        cursor.close()


def _on_connect(dbapi_connection: Any, _record: object) -> None:  # noqa: ANN401
    configure(dbapi_connection)


def is_memory(url: URL) -> bool:
    """True for an in-memory database, which lives in its one connection."""
    return url.database in (None, "", ":memory:") or "mode=memory" in str(url)


def stamp(value: dt.datetime) -> str:
    """The text SQLite keeps for a time: ``YYYY-MM-DD HH:MM:SS[.ffffff]`` (naive UTC)."""
    fmt = "%Y-%m-%d %H:%M:%S.%f" if value.microsecond else "%Y-%m-%d %H:%M:%S"
    return value.strftime(fmt)


def now() -> str:
    """The time of a write, to the microsecond, as SQLite text."""
    return stamp(dt.datetime.now(dt.UTC).replace(tzinfo=None))


# -- statements ---------------------------------------------------------------------------------


def _role_of(data: ColumnElement[Any]) -> ColumnElement[Any]:
    """An item's ``role``, or ``NULL`` for a row that is not valid JSON (``json_valid`` first)."""
    return case(
        (func.json_valid(data) == 1, func.json_extract(data, literal_column("'$.role'"))),
        else_=null(),
    )


def _expired_items(
    messages: Table, sessions: Table, which: ColumnElement[bool], clock: ColumnElement[Any]
) -> ColumnElement[bool]:
    """The rows of the sessions ``which`` picks whose deadline has passed (``drop_expired``'s).

    ``session_id IN (the session's id, if expired)``, not ``… AND EXISTS (…)``:
    SQLite evaluates the uncorrelated ``EXISTS`` once but still walks every item
    of the session to test it (a 5,000-item session paid 207 µs per append for
    a delete that deletes nothing), while an ``IN`` list that comes back empty
    visits no item at all (2.3 µs).
    """
    return messages.c.session_id.in_(
        select(sessions.c.session_id).where(which, expired(sessions, clock))
    )


def _as_bytes(data: ColumnElement[Any]) -> ColumnElement[Any]:
    """``message_data`` read as the UTF-8 bytes SQLite stores, not as ``str``.

    The codec decodes a row the fast encoder wrote straight from those bytes
    (``_codec.STORED_MARK``) and turns any other into text itself. As ``str``,
    every value went through the connection's ``text_factory``
    (:func:`_tolerant_text`, a Python call per value): of a read of 20 items
    it was more than half the driver's time (2.1 → 0.9 ms for 64 such reads).
    """
    return cast(data, LargeBinary())


def _upsert_session(sessions: Table, sid: Any, now_: ColumnElement[Any]) -> Executable:  # noqa: ANN401
    """The legacy tables' upsert (no counter: their items take ids from their own sequence)."""
    return (
        sqlite_dialect.insert(sessions)
        .values(session_id=sid, created_at=now_, updated_at=now_)
        .on_conflict_do_update(index_elements=[sessions.c.session_id], set_={"updated_at": now_})
    )


READ_CLOCK: ColumnElement[Any] = func.strftime("%Y-%m-%d %H:%M:%f", "now")
"""SQLite's UTC time as its own text, to the millisecond (sorts beside ``stamp`` text).

What reads compare deadlines with; writes compare them with their client clock
(``now``), as they stamp ``updated_at``.
"""


def _renewing(sessions: Table, sid: Any, now_: ColumnElement[Any]) -> Any:  # noqa: ANN401
    """The head variant's upsert: ``updated_at``, the deadline and ``last_position`` moved.

    The deadline is renewed (``expires``); ``last_position`` is bumped by ``n``.
    Run after ``drop_expired`` in the same transaction, so an expired deadline is
    cleared (or replaced by the store's ``ttl``) once its items are gone.
    """
    expires = expires_param(String())
    n = counted()
    return (
        sqlite_dialect.insert(sessions)
        .values(
            session_id=sid, created_at=now_, updated_at=now_, expires_at=expires, last_position=n
        )
        .on_conflict_do_update(
            index_elements=[sessions.c.session_id],
            set_={
                "updated_at": now_,
                "expires_at": renewed_expiry(sessions, now_, expires),
                "last_position": sessions.c.last_position + n,
            },
        )
    )


def _upsert_renewing(sessions: Table, sid: Any, now_: ColumnElement[Any]) -> Executable:  # noqa: ANN401
    """:func:`_renewing`, returning the bumped ``last_position`` (where the batch's rows end)."""
    return _renewing(sessions, sid, now_).returning(sessions.c.last_position)  # type: ignore[no-any-return]


@functools.cache
def compiled(names: TableNames, expiry: bool = False) -> dict[str, CompiledSQL]:
    """Every statement of ``names`` compiled once for ``sqlite3`` (by field name)."""
    return compile_all(SQLite.statements(names, expiry), DIALECT)


@dataclasses.dataclass(frozen=True)
class Folded:
    """What a group runs for several appends to one table set at once (:func:`fold_appends`).

    The group's session ids are bound as one JSON array and read with ``json_each``
    (JSON1, which the metadata filters already need): one statement text whatever
    the group's size, so ``sqlite3`` prepares each once.
    """

    drop: CompiledSQL
    """Every expired session's old items, of all the group's sessions (``drop_expired``'s)."""
    upsert: CompiledSQL
    """``upsert_session`` without ``RETURNING``: ``executemany`` runs it once per batch."""
    counters: CompiledSQL
    """Each session's ``last_position`` after the group's upserts."""
    insert: CompiledSQL
    """``insert_message``, for every row of the group in one ``executemany``."""


@functools.cache
def folded(names: TableNames) -> Folded:
    """:class:`Folded` for the head tables of ``names``, built from the models, compiled once."""
    sessions, messages = tables_for(names, head=True)
    when = bindparam("now", type_=String())
    ids = func.json_each(bindparam("sids", type_=String())).table_valued("value")
    in_group = sessions.c.session_id.in_(select(ids.c.value))
    drop = delete(messages).where(_expired_items(messages, sessions, in_group, when))
    counters = select(sessions.c.session_id, sessions.c.last_position).where(in_group)
    return Folded(
        drop=compile_for(drop, DIALECT),
        upsert=compile_for(_renewing(sessions, sid_param(sessions), when), DIALECT),
        counters=compile_for(counters, DIALECT),
        insert=compiled(names, expiry=True)["insert_message"],
    )


def has_expiry(conn: sqlite3.Connection, names: TableNames) -> bool:
    """Whether the tables of ``names`` are at head (items keyed by position, with expiry).

    Tables the seed or the Agents SDK created, used without migrating, are not
    (nor are ours at a revision before 0006): they get the legacy statements,
    ordered by ``id``. Asked with Core's ``SELECT position … LIMIT 0``.
    """
    messages = get_models(names).Message.__table__
    probe = compile_for(select(messages.c.position).limit(0), DIALECT)
    try:
        conn.execute(probe.sql, probe.positional({})).fetchall()
    except sqlite3.OperationalError:
        return False
    return True


@functools.cache
def schema_sql(names: TableNames, head: str) -> tuple[tuple[str, ...], str, tuple[str, ...]]:
    """What the stdlib ``SQLiteSession`` runs to create a fresh file's schema at ``head``.

    ``(create tables and indexes, "does the sessions table exist" query, stamp the
    lineage's version table at head)``, all compiled from the models and an
    Alembic-shaped version table, so quoting is the compiler's.
    """
    ddl: list[str] = []
    for table in get_models(names).metadata.sorted_tables:
        ddl.append(str(CreateTable(table, if_not_exists=True).compile(dialect=DIALECT)).strip())
        ddl.extend(
            str(CreateIndex(index, if_not_exists=True).compile(dialect=DIALECT)).strip()
            for index in sorted(table.indexes, key=lambda ix: str(ix.name))
        )
    version = Table(
        names.version_table,
        MetaData(),
        Column("version_num", String(32), nullable=False),
        PrimaryKeyConstraint("version_num", name=f"{names.version_table}{VERSION_KEY_SUFFIX}"),
    )
    master = Table("sqlite_master", MetaData(), Column("type", String()), Column("name", String()))
    exists_query = select(literal(1)).where(
        master.c.type == literal("table", literal_execute=True),
        master.c.name == literal(names.sessions, literal_execute=True),
    )
    stamp_head = insert(version).from_select(
        ["version_num"],
        select(literal(head, literal_execute=True)).where(~exists(select(version.c.version_num))),
    )
    lit = {"literal_binds": True}
    return (
        tuple(ddl),
        str(exists_query.compile(dialect=DIALECT, compile_kwargs=lit)),
        (
            str(CreateTable(version, if_not_exists=True).compile(dialect=DIALECT)).strip(),
            str(stamp_head.compile(dialect=DIALECT, compile_kwargs=lit)),
        ),
    )


# -- the transactions (one body each, for both runners) -----------------------------------------


@contextlib.contextmanager
def write_transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction on a ``sqlite3`` connection: committed, or rolled back on any error.

    The connection runs with ``isolation_level=None``: the transaction is exactly ours.
    """
    if conn.in_transaction:  # someone else's leftover: never commit their work with ours
        conn.rollback()
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.commit()
    except BaseException:
        conn.rollback()
        raise


def add_body(
    ex: SyncExecutor, sid: str, data: Sequence[str], expires: object = None, *, expiry: bool = False
) -> None:
    """Upsert the session, then insert every item: one transaction (the caller's).

    At head the upsert hands out the batch's positions (``last_position`` bumped by
    its size, under ``BEGIN IMMEDIATE``: one writer); an expired session first loses
    its old items (the write starts it afresh), and the upsert renews its deadline
    to ``expires``.
    """
    when = now()
    if not expiry:
        ex.run("upsert_session", {"sid": sid, "now": when})
        ex.runmany("insert_message", [{"sid": sid, "data": d, "now": when} for d in data])
        return
    ex.run("drop_expired", {"sid": sid, "now": when})
    top = ex.rows("upsert_session", {"sid": sid, "now": when, "expires": expires, "n": len(data)})
    ex.runmany("insert_message", numbered(sid, data, int(top[0][0]), {"now": when}))


@dataclasses.dataclass(frozen=True, slots=True)
class Append:
    """An append (head tables) as a job that is also data, so that a group may run several together.

    Called on a connection it is :func:`add_body`: what runs when its batch is
    alone, or when a group's folded run failed and each batch runs again on its
    own; as data it goes into :func:`fold_appends`. One object, so the two can
    never describe different writes.
    """

    names: TableNames
    sid: str
    data: Sequence[str]
    expires: object

    def __call__(self, conn: sqlite3.Connection) -> None:
        ex = LiteExecutor(conn, compiled(self.names, expiry=True))
        add_body(ex, self.sid, self.data, self.expires, expiry=True)


def fold_appends(conn: sqlite3.Connection, appends: Sequence[Append]) -> None:
    """:func:`add_body` for each of ``appends`` in turn (one table set), in four statements.

    The same effect, in order, as one ``add_body`` after another at one clock:
    every expired session among them loses its old items first (a session
    appended to twice is renewed by the first upsert, so the second would have
    dropped nothing), then one upsert per batch in arrival order bumps each
    counter, and each batch's rows take the positions just below what its
    session's later batches took. Per batch that is one row of an ``executemany``
    instead of five statements (savepoint, drop, upsert, insert, release): the
    writer thread's share of a 64-session burst.
    """
    st = folded(appends[0].names)
    when = now()
    ids = json.dumps(list(dict.fromkeys(a.sid for a in appends)))
    conn.execute(st.drop.sql, st.drop.positional({"sids": ids, "now": when}))
    conn.executemany(
        st.upsert.sql,
        [
            st.upsert.positional(
                {"sid": a.sid, "now": when, "expires": a.expires, "n": len(a.data)}
            )
            for a in appends
        ],
    )
    tops: dict[str, int] = dict(
        conn.execute(st.counters.sql, st.counters.positional({"sids": ids})).fetchall()
    )
    firsts: list[int] = []
    for a in reversed(appends):  # the last batch of a session ends at its counter
        tops[a.sid] -= len(a.data)
        firsts.append(tops[a.sid] + 1)
    firsts.reverse()
    columns: dict[str, Iterable[Any]] = {
        **{key: itertools.repeat(value) for key, value in st.insert.constants.items()},
        "sid": [a.sid for a in appends for _ in a.data],
        "pos": [
            p
            for a, first in zip(appends, firsts, strict=True)
            for p in range(first, first + len(a.data))
        ],
        "data": [d for a in appends for d in a.data],
        "now": itertools.repeat(when),
    }
    # (strict=False: the constant columns repeat; the row columns decide how many rows)
    conn.executemany(st.insert.sql, zip(*(columns[key] for key in st.insert.order), strict=False))


def pop_body(
    ex: SyncExecutor, sid: str, on_corrupt: OnCorrupt, keyring: Keyring | None = None
) -> dict[str, Any] | None:
    """Pop the newest valid item; corrupt rows on the way are removed (or, raising, kept).

    A row that cannot be decrypted raises inside the transaction, which rolls back:
    nothing is deleted because it could not be read.
    """
    while True:
        rows = ex.rows("pop", {"sid": sid})
        if not rows:
            return None
        item = decode_row(rows[0][1], row_id=rows[0][0], on_corrupt=on_corrupt, keyring=keyring)
        if item is not None:
            return item


def clear_body(
    ex: SyncExecutor, sid: str, keyring: Keyring | None = None, *, checked: bool = True
) -> bool:
    """Delete the items, then the session row; whether the session existed.

    First, in the same transaction, every encrypted row is checked against
    ``keyring``: one it could not open refuses the whole clear (the typed error).
    """
    if checked:
        check_heads(ex.rows("select_heads", {"sid": sid}), keyring)
    ex.run("delete_messages", {"sid": sid})
    return bool(ex.rows("delete_session", {"sid": sid}))


def replace_body(
    ex: SyncExecutor,
    sid: str,
    data: Sequence[str],
    keyring: Keyring | None = None,
    expires: object = None,
    *,
    expiry: bool = False,
) -> None:
    """Upsert the session (``updated_at`` bumped), delete its items, insert ``data``.

    One transaction (the caller's; in a group, one savepoint): the history is
    the old one or the new one, never a mix or nothing. As a clear does, it first
    refuses (the typed error, nothing changed) when ``keyring`` could not open
    one of the items it would delete.
    """
    when = now()
    params = {"sid": sid, "now": when, "expires": expires, "n": len(data)}
    top = ex.rows("upsert_session", params) if expiry else ex.run("upsert_session", params)
    check_heads(ex.rows("select_heads", {"sid": sid}), keyring)
    ex.run("delete_messages", {"sid": sid})
    if not data:
        return
    if isinstance(top, int):  # legacy tables: ids from their own sequence
        ex.runmany("insert_message", [{"sid": sid, "data": d, "now": when} for d in data])
    else:
        ex.runmany("insert_message", numbered(sid, data, int(top[0][0]), {"now": when}))


def fork_body(  # noqa: PLR0917 - fork_body_sync's arguments
    ex: SyncExecutor,
    sid: str,
    new: str,
    skip: int | None,
    expires: object = None,
    expiry: bool = False,
) -> None:
    """Copy the session row and its items (before user turn ``skip + 1``): one transaction."""
    fork_body_sync(ex, sid, new, skip, now(), expires, advanced=expiry)


class LiteExecutor:
    """:class:`SyncExecutor` over a ``sqlite3`` connection, running the compiled statements."""

    __slots__ = ("_conn", "_sql")

    def __init__(self, conn: sqlite3.Connection, sql: Mapping[str, CompiledSQL]) -> None:
        self._conn = conn
        self._sql = sql

    def rows(self, key: str, params: Mapping[str, Any]) -> Sequence[Row]:
        c = self._sql[key]
        # fetchall, not fetchone: a statement must be finished before COMMIT.
        return self._conn.execute(c.sql, c.positional(params)).fetchall()

    def run(self, key: str, params: Mapping[str, Any]) -> int:
        c = self._sql[key]
        return self._conn.execute(c.sql, c.positional(params)).rowcount

    def runmany(self, key: str, params: Sequence[Mapping[str, Any]]) -> None:
        c = self._sql[key]
        self._conn.executemany(c.sql, [c.positional(p) for p in params])


# -- threads ------------------------------------------------------------------------------------


class _Job:
    """One job on a worker's queue: what to run, where its result goes, and whether it started.

    ``started`` (set by the thread) and ``withdrawn`` (set by a cancelled caller)
    are each written before the other side's is read, so exactly one of the two
    wins: a withdrawn job never runs, a started one is never withdrawn.
    """

    __slots__ = ("delivered", "finished", "fn", "future", "loop", "started", "withdrawn")

    def __init__(
        self,
        fn: Callable[[sqlite3.Connection], Any],
        future: asyncio.Future[Any],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.fn = fn
        self.future = future
        self.loop = loop
        self.started = False
        self.withdrawn = False
        self.delivered = False
        self.finished: asyncio.Future[None] | None = None
        """Made by a caller cancelled while the job ran: resolved when the job is done."""


def _resolve(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:  # noqa: ANN401
    """On the caller's loop: hand over an outcome, unless the caller has gone."""
    if future.cancelled():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


def _deliver(
    job: _Job | _Batch,
    future: asyncio.Future[Any],
    result: Any,  # noqa: ANN401
    error: BaseException | None,
) -> None:
    """On the caller's loop: hand over the job's outcome (or, cancelled, say it is done)."""
    job.delivered = True
    if future.cancelled() and job.finished is not None and not job.finished.done():
        job.finished.set_result(None)
    _resolve(future, result, error)


class _Mailbox:
    """Outcomes on their way from our threads to one event loop.

    A thread posts; the first post since the loop last emptied the box schedules
    one ``call_soon_threadsafe``, and whatever is posted before the loop runs it
    rides along. Each wake-up is a write to the loop's socket (a system call on
    the thread, a read and one more pass on the loop): a group of 32 batches from
    one loop paid 32 of them on the writer thread, and 64 reads queued together
    64 on the reader. An outcome is never held back: it leaves with the next
    wake-up, which is already scheduled or is scheduled now.
    """

    __slots__ = ("__weakref__", "_lock", "_posted", "_scheduled")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._posted: list[tuple[Any, ...]] = []
        self._scheduled = False

    def post(self, loop: asyncio.AbstractEventLoop, deliveries: Iterable[tuple[Any, ...]]) -> None:
        """From a thread: :func:`_deliver` each ``(job, future, result, error)`` on ``loop``.

        The loop is passed, not kept: a mailbox holding its loop would keep its own
        key in the weak mapping alive.
        """
        with self._lock:
            self._posted.extend(deliveries)
            if self._scheduled:
                return
            self._scheduled = True
        try:
            loop.call_soon_threadsafe(self._deliver_all)
        except RuntimeError:  # the callers' loop has closed: nobody is waiting
            with self._lock:
                self._posted.clear()
                self._scheduled = False

    def _deliver_all(self) -> None:
        with self._lock:
            posted, self._posted = self._posted, []
            self._scheduled = False
        for delivery in posted:
            _deliver(*delivery)


_mailboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Mailbox] = (
    weakref.WeakKeyDictionary()
)
_mailboxes_guard = threading.Lock()


def _wake(deliveries: Iterable[tuple[asyncio.AbstractEventLoop, tuple[Any, ...]]]) -> None:
    """From a thread: post each ``(loop, (job, future, result, error))`` to its loop's mailbox."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Any, ...]]] = {}
    for loop, delivery in deliveries:
        by_loop.setdefault(loop, []).append(delivery)
    for loop, each in by_loop.items():
        _mailbox(loop).post(loop, each)


def _mailbox(loop: asyncio.AbstractEventLoop) -> _Mailbox:
    """``loop``'s mailbox (made on first use; our threads post from several threads)."""
    box = _mailboxes.get(loop)
    if box is None:
        with _mailboxes_guard:
            box = _mailboxes.get(loop)
            if box is None:
                box = _mailboxes[loop] = _Mailbox()
    return box


async def _settle(job: _Job | _Batch, loop: asyncio.AbstractEventLoop) -> None:
    """A cancelled caller's side of the handshake: withdraw ``job``, or wait until it is done.

    Withdrawn before the thread started it, it never runs and the cancel is raised
    at once. Started, it cannot be stopped: the caller waits (through further
    cancels) until the thread's outcome has been delivered, then raises its cancel.
    """
    job.withdrawn = True
    if not job.started or job.delivered:
        return
    job.finished = loop.create_future()  # resolved by _deliver once the job is done
    while not job.finished.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(job.finished)


def _serve(jobs: queue.SimpleQueue[_Job | None], connect: Callable[[], sqlite3.Connection]) -> None:
    """A worker thread's life: open the connection on first use, run jobs in order, close.

    It holds the queue, not the :class:`Worker`, so a worker nobody references
    any more is collected, and its finalizer's ``None`` ends the thread.
    """
    conn: sqlite3.Connection | None = None
    try:
        while (job := jobs.get()) is not None:
            job.started = True
            if job.withdrawn:
                continue
            result: Any = None
            error: BaseException | None = None
            try:
                if conn is None:
                    conn = connect()
                result = job.fn(conn)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting caller
                error = exc
            _mailbox(job.loop).post(job.loop, ((job, job.future, result, error),))
    finally:
        if conn is not None:
            conn.close()


class Worker:
    """One ``sqlite3`` connection owned by one thread; jobs run on it in arrival order.

    One queue, and at most one ``call_soon_threadsafe`` per job (outcomes that
    finish before the loop runs share one, :class:`_Mailbox`): the hop between
    the event loop and the thread costs at most what aiosqlite's does.
    """

    def __init__(self, connect: Callable[[], sqlite3.Connection], name: str) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=_serve, args=(self._jobs, connect), name=name, daemon=True
        )
        self._thread.start()
        self._stopper = weakref.finalize(self, self._jobs.put, None)

    async def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(connection)`` on the thread.

        A cancel withdraws a job that has not started (it never runs). One already
        running cannot be stopped: the transaction runs on to its COMMIT (or
        rollback), and the caller's cancel is raised after that, so the session is
        left fully before or fully after the operation when the caller sees it.
        """
        if not self._stopper.alive:
            msg = "this SQLite connection was closed"
            raise RuntimeError(msg)
        loop = asyncio.get_running_loop()
        job = _Job(fn, loop.create_future(), loop)
        self._jobs.put(job)
        try:
            return await job.future  # type: ignore[no-any-return]
        except asyncio.CancelledError:
            await _settle(job, loop)
            raise

    def stop(self, *, wait: bool) -> None:
        """Close the connection after the queued jobs, and end the thread."""
        self._stopper()
        if wait and self._thread is not threading.current_thread():
            self._thread.join()


# -- group commit -------------------------------------------------------------------------------

GROUP_MAX_BATCHES = 64
"""The most callers' batches one grouped transaction holds.

A group holds the file's write lock from ``BEGIN IMMEDIATE`` to the end of its
``COMMIT``: its batches' statements and one disk flush. Measured
(``python -m benchmarks.group_commit``, 2-CPU VM, ext4): a full group of 64
turns of 4 items holds the lock 5.5 ms at the median, one turn alone 0.9 ms;
the throughput gain comes from callers sharing a flush, and 64 already covers
a 64-session burst in one or two groups. A larger bound would only lengthen
what another process writing the file waits for (readers are never blocked:
WAL).
"""

GROUP_MAX_BYTES = 4 * 1024 * 1024
"""The most encoded item bytes one grouped transaction holds (a bigger batch runs alone)."""

GROUP_MAX_HOLD = 0.010
"""Seconds a group may hold the write lock before it stops taking in batches.

The batch and byte limits bound a group by what it holds; this bounds it by the
clock, whatever the batches cost on a slow or loaded machine: once a group has
held the lock (from ``BEGIN IMMEDIATE``) this long, the batches it has not yet
run go back to the head of the queue, not joined (a cancel still withdraws
them), and it commits. So a group holds the lock at most this, plus the one
batch running when it passed, plus its ``COMMIT``. 10 ms is about twice what a
full group of 64 turns took on an idle 2-CPU VM; ``python -m benchmarks.group_commit``
reports the holds the writer really had under load.
"""

FOLD_MAX_BYTES = 256 * 1024
"""The most item bytes of appends one group runs together (:func:`fold_appends`).

The hold limit is checked between such runs, as between batches: a run of
64 turns of 4 items (about 200 KiB of the benchmarks' items) took 2.2 ms at the
median (``fold_appends`` in its savepoint, 2-CPU VM), so a group still stops
taking in batches close to :data:`GROUP_MAX_HOLD`. A run is at least one batch,
whatever it weighs.
"""

HOLDS_KEPT = 4096
"""How many of the latest groups' write-lock holds a queue keeps (for benchmarks and tests)."""

_SAVEPOINT = "agents_memory_batch"
_POP_OR_CLEAR_BYTES = 64


class _Batch:
    """One caller's write: its job (run inside an open transaction), its weight, its outcome.

    ``started`` (set by the thread running the group) and ``withdrawn`` (set by a
    cancelled caller) are each written before the other side's is read, so
    exactly one of the two wins: a withdrawn batch never runs, a started one is
    never withdrawn (the same handshake as :class:`Worker`'s jobs).
    """

    __slots__ = (
        "append",
        "caller",
        "delivered",
        "error",
        "finished",
        "fn",
        "result",
        "settled",
        "size",
        "started",
        "withdrawn",
    )

    def __init__(
        self,
        fn: Callable[[sqlite3.Connection], Any],
        size: int,
        caller: tuple[asyncio.AbstractEventLoop, asyncio.Future[Any]] | None = None,
    ) -> None:
        self.fn = fn
        self.size = max(size, _POP_OR_CLEAR_BYTES)
        self.append = fn if type(fn) is Append else None
        """The job when it is an :class:`Append` (a group may fold it), else None."""
        self.caller = caller
        """An awaiting caller's loop and future (the writer thread's); None for a thread's own."""
        self.started = False
        self.withdrawn = False
        self.settled = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.delivered = False
        self.finished: asyncio.Future[None] | None = None
        """Made by a caller cancelled after its batch joined: resolved once it is delivered."""

    def join(self) -> bool:
        """Join the open transaction, unless the caller withdrew first."""
        self.started = True
        return not self.withdrawn

    def finish(self, result: Any, error: BaseException | None) -> None:  # noqa: ANN401
        """Record the outcome (after the group's COMMIT, or the error) and tell the caller."""
        _finish_all([(self, result, error)])


def _finish_all(outcomes: Iterable[tuple[_Batch, Any, BaseException | None]]) -> None:
    """Record each batch's outcome, then wake each caller's loop once for all of its batches."""
    deliveries: list[tuple[asyncio.AbstractEventLoop, tuple[Any, ...]]] = []
    for batch, result, error in outcomes:
        if batch.settled:
            continue
        batch.result, batch.error, batch.settled = result, error, True
        if batch.caller is not None:
            loop, future = batch.caller
            deliveries.append((loop, (batch, future, result, error)))
    _wake(deliveries)


def _rollback(conn: sqlite3.Connection) -> None:
    """End whatever is left of a failed transaction (nothing to do if SQLite already did)."""
    with contextlib.suppress(sqlite3.Error):
        if conn.in_transaction:
            conn.rollback()


def _undo_savepoint(conn: sqlite3.Connection) -> bool:
    """Roll back to the batch's savepoint; False when the transaction itself is lost.

    Some errors (disk full, I/O, an interrupted statement) make SQLite roll back
    the whole transaction: then the batches before it in the group are gone too.
    """
    if not conn.in_transaction:
        return False
    try:
        conn.execute(f"ROLLBACK TO {_SAVEPOINT}")
        conn.execute(f"RELEASE {_SAVEPOINT}")
    except sqlite3.Error:
        return False
    return conn.in_transaction


def _fail_all(group: Sequence[_Batch], exc: BaseException) -> None:
    """Hand ``exc`` to every batch of ``group`` that joined or joins now (not withdrawn first).

    One that had already joined gets it even if its caller cancelled since: that
    caller is waiting for the outcome before raising its cancel.
    """
    _finish_all((batch, None, exc) for batch in group if batch.started or batch.join())


def commit_group(conn: sqlite3.Connection, group: Sequence[_Batch], batches: _Queue) -> None:
    """One transaction for ``group`` on ``conn``: begin, each batch in turn, commit, results.

    The caller holds the right to write (the writer thread, or the file's lock).
    A batch joins once the transaction holds the file's lock; batches that never
    joined, because the transaction was lost or had held the lock for
    ``batches.max_hold``, go back to the head of ``batches``.
    """
    try:
        if conn.in_transaction:  # someone else's leftover: never commit their work with ours
            conn.rollback()
        conn.execute("BEGIN IMMEDIATE")
    except BaseException as exc:  # noqa: BLE001 - handed to the callers
        _fail_all(group, exc)
        return
    begun = time.perf_counter()
    try:
        done = _run_batches(conn, group, batches, begun + batches.max_hold)
        if done is None:
            return
        try:
            conn.commit()
        except BaseException as exc:  # noqa: BLE001 - handed to the callers
            _rollback(conn)
            _finish_all((batch, None, exc) for batch, _ in done)
            return
    finally:
        batches.holds.append(time.perf_counter() - begun)
    _finish_all((batch, result, None) for batch, result in done)


def _run_batches(
    conn: sqlite3.Connection, group: Sequence[_Batch], batches: _Queue, deadline: float
) -> list[tuple[_Batch, Any]] | None:
    """Run each batch that joins; the batches to commit, or None when the transaction is lost.

    In a group of several, each batch runs in its own savepoint and one that
    fails is rolled back alone. Consecutive appends to one table set run
    together first (:func:`fold_appends`, in one savepoint); if that fails, it
    is rolled back and each of them runs again on its own, so only a batch that
    fails alone fails. When the transaction itself is lost (a lone batch failed,
    or SQLite rolled everything back), every batch that had joined gets the
    error and those that had not go back to ``batches``. Past ``deadline``
    (``time.perf_counter``) no further batch joins: the rest go back to the
    queue and the group commits what it ran.
    """
    requeue = batches.requeue
    alone = len(group) == 1
    done: list[tuple[_Batch, Any]] = []
    i = 0
    while i < len(group):
        if i and time.perf_counter() >= deadline:
            requeue(group[i:])  # not joined: they lead the next group (or are withdrawn)
            break
        run = 1 if alone else _appends_at(group, i)
        joined = [batch for batch in group[i : i + run] if batch.join()]  # withdrawn: never run
        i += run
        if len(joined) > 1:
            appends = [batch.append for batch in joined if batch.append is not None]
            try:
                _in_savepoint(conn, functools.partial(fold_appends, appends=appends))
            except BaseException as exc:  # noqa: BLE001 - handed to the callers, or tried again
                batches.unfolded += 1
                if not _undo_savepoint(conn):
                    _lost(conn, exc, joined, done)
                    requeue(group[i:])
                    return None
            else:
                batches.folds += 1
                done.extend((batch, None) for batch in joined)
                continue
        for k, batch in enumerate(joined):
            try:
                result = batch.fn(conn) if alone else _in_savepoint(conn, batch.fn)
            except BaseException as exc:  # noqa: BLE001 - handed to its caller
                if not alone and _undo_savepoint(conn):
                    batch.finish(None, exc)  # rolled back alone; the others go on
                    continue
                _lost(conn, exc, joined[k:], done)  # the rest joined: they were in it too
                requeue(group[i:])
                return None
            done.append((batch, result))
    return done


def _appends_at(group: Sequence[_Batch], i: int) -> int:
    """How many batches from ``group[i]`` on run together: appends to one table set (at least 1).

    Up to :data:`FOLD_MAX_BYTES` of items: the hold limit is checked between runs.
    """
    first = group[i].append
    end = i + 1
    if first is None:
        return 1
    weight = group[i].size
    while end < len(group):
        a, size = group[end].append, group[end].size
        if a is None or a.names != first.names or weight + size > FOLD_MAX_BYTES:
            break
        weight += size
        end += 1
    return end - i


def _lost(
    conn: sqlite3.Connection,
    exc: BaseException,
    failed: Sequence[_Batch],
    done: Sequence[tuple[_Batch, Any]],
) -> None:
    """The transaction is gone: ``exc`` for the batches that failed with it and those run before."""
    _rollback(conn)
    _finish_all([*((batch, None, exc) for batch in failed), *((b, None, exc) for b, _ in done)])


def _in_savepoint(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    """``fn(conn)`` in the batch savepoint (rolled back by :func:`_undo_savepoint` on error)."""
    conn.execute(f"SAVEPOINT {_SAVEPOINT}")
    result = fn(conn)
    conn.execute(f"RELEASE {_SAVEPOINT}")
    return result


class _Queue:
    """Batches waiting for a transaction, taken in arrival order within the group limits."""

    def __init__(self, max_batches: int, max_bytes: int, max_hold: float) -> None:
        self.max_batches = max_batches
        self.max_bytes = max_bytes
        self.max_hold = max_hold
        self.holds: collections.deque[float] = collections.deque(maxlen=HOLDS_KEPT)
        """Seconds each of the latest transactions held the write lock (``BEGIN`` to its end)."""
        self.cond = threading.Condition(threading.Lock())
        self.batches: collections.deque[_Batch] = collections.deque()
        self.stopping = False
        self.groups = 0
        """Transactions run (for tests, reliability notes and benchmarks)."""
        self.folds = 0
        """Runs of appends run together (:func:`fold_appends`) inside a transaction."""
        self.unfolded = 0
        """Such runs that failed and whose batches ran again one by one."""

    def put(self, batch: _Batch) -> None:
        with self.cond:
            self.batches.append(batch)
            self.cond.notify()

    def requeue(self, batches: Sequence[_Batch]) -> None:
        """Put batches that never joined back at the head, in order."""
        with self.cond:
            self.batches.extendleft(reversed(batches))

    def stop(self) -> None:
        """Let the thread end once the queue is empty."""
        with self.cond:
            self.stopping = True
            self.cond.notify()

    def take_now(self) -> list[_Batch]:
        """The next group from what is queued (the caller holds ``cond``); may be empty."""
        group: list[_Batch] = []
        weight = 0
        while self.batches and len(group) < self.max_batches:
            batch = self.batches[0]
            if batch.withdrawn:  # cancelled while queued: never runs
                self.batches.popleft()
                continue
            if group and weight + batch.size > self.max_bytes:
                break
            group.append(self.batches.popleft())
            weight += batch.size
        return group

    def take(self) -> list[_Batch] | None:
        """Wait for the next group; None once stopped and empty."""
        with self.cond:
            while True:
                group = self.take_now()
                if group:
                    return group
                if self.stopping:
                    return None
                self.cond.wait()


def _serve_groups(batches: _Queue, connect: Callable[[], sqlite3.Connection]) -> None:
    """The writer thread's life: open the connection on first use, commit groups, close.

    It holds the queue, not the :class:`GroupWriter`, so a writer nobody references
    any more is collected, and its finalizer's stop ends the thread.
    """
    conn: sqlite3.Connection | None = None
    try:
        while (group := batches.take()) is not None:
            batches.groups += 1
            try:
                if conn is None:
                    conn = connect()
                commit_group(conn, group, batches)
            except BaseException as exc:  # noqa: BLE001 - never strand a caller
                if conn is not None:
                    _rollback(conn)
                _fail_all([b for b in group if not b.settled], exc)
    finally:
        if conn is not None:
            conn.close()


class _Counted:
    """What the two group-commit front ends report on their queue (tests, benchmarks)."""

    _batches: _Queue

    @property
    def groups(self) -> int:
        """Transactions run so far (a group of one included)."""
        return self._batches.groups

    @property
    def folds(self) -> int:
        """Runs of appends run together so far (several batches in four statements)."""
        return self._batches.folds

    @property
    def unfolded(self) -> int:
        """Runs of appends that failed together and ran again one batch at a time."""
        return self._batches.unfolded

    def pending(self) -> int:
        """Batches queued and not yet taken into a transaction (withdrawn ones included)."""
        with self._batches.cond:
            return len(self._batches.batches)

    def holds(self) -> list[float]:
        """Seconds each of the latest transactions (up to :data:`HOLDS_KEPT`) held the lock."""
        return list(self._batches.holds)


class GroupWriter(_Counted):
    """The writer thread of a file engine: batches queued behind a commit share the next one.

    SQLite allows one writer per file, and a durable ``COMMIT`` waits for the
    disk (``synchronous=FULL``), so one transaction per caller caps a busy
    process at one caller per flush. Here, whatever queued while the thread was
    busy goes into the next transaction together (up to :data:`GROUP_MAX_BATCHES`
    and :data:`GROUP_MAX_BYTES`, taking in no batch once it has held the lock for
    :data:`GROUP_MAX_HOLD`): one ``BEGIN IMMEDIATE``, each batch in its own
    ``SAVEPOINT`` (a batch that fails rolls back alone, and only its caller gets
    the error), one ``COMMIT``, then every caller gets its own result. Appends
    queued one after another (to one table set) share a savepoint and four
    statements (:func:`fold_appends`); if that fails, each runs again in its own,
    as above. A caller alone in the queue gets a transaction of its own, exactly
    as without grouping.

    A batch *joins* once its transaction holds the file's lock, just before its
    savepoint: cancelled before that (queued, or waiting for the lock), it is
    withdrawn and never runs; after that, the cancel is raised once the group has
    committed (or rolled back). An error of ``BEGIN`` reaches every batch of the
    group not withdrawn by then; an error of ``COMMIT``, exactly the batches that
    joined (and had not failed alone). ``grouped=False`` gives one transaction
    per batch (no savepoints).
    """

    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        name: str,
        *,
        grouped: bool = True,
        max_batches: int = GROUP_MAX_BATCHES,
        max_bytes: int = GROUP_MAX_BYTES,
        max_hold: float | None = None,
    ) -> None:
        hold = GROUP_MAX_HOLD if max_hold is None else max_hold  # (read now: tests may set it)
        self._batches = _Queue(max_batches if grouped else 1, max_bytes, hold)
        self._thread = threading.Thread(
            target=_serve_groups, args=(self._batches, connect), name=name, daemon=True
        )
        self._thread.start()
        self._stopper = weakref.finalize(self, self._batches.stop)

    @property
    def grouped(self) -> bool:
        """Whether batches queued together share a transaction."""
        return self._batches.max_batches > 1

    async def call(self, fn: Callable[[sqlite3.Connection], T], size: int = 0) -> T:
        """Run ``fn(connection)`` inside a write transaction, grouped with what queued beside it.

        ``size`` is the batch's weight against :data:`GROUP_MAX_BYTES`. An
        :class:`Append` may run together with the appends queued beside it.
        """
        if not self._stopper.alive:
            msg = "this SQLite connection was closed"
            raise RuntimeError(msg)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        batch = _Batch(fn, size, (loop, future))
        self._batches.put(batch)
        try:
            return await future
        except asyncio.CancelledError:
            await _settle(batch, loop)  # (the same handshake as Worker's jobs)
            raise

    def stop(self, *, wait: bool) -> None:
        """Commit what is queued, close the connection, and end the thread."""
        self._stopper()
        if wait and self._thread is not threading.current_thread():
            self._thread.join()


class SharedWrites(_Counted):
    """Group commit for threads that each own a connection to one file (the stdlib session).

    Every ``SQLiteSession`` of a process on one file has its own worker thread and
    connection, and they take turns on the file's lock. A writer queues its batch
    here, then takes the lock: if its batch is still queued, it leads, running
    whatever is queued (up to the same limits as :class:`GroupWriter`) on its own
    connection in one transaction (:func:`commit_group`); if a leader already
    ran it, it returns that result. Same guarantees as the writer thread's groups.
    """

    def __init__(
        self,
        *,
        max_batches: int = GROUP_MAX_BATCHES,
        max_bytes: int = GROUP_MAX_BYTES,
        max_hold: float | None = None,
    ) -> None:
        hold = GROUP_MAX_HOLD if max_hold is None else max_hold
        self._batches = _Queue(max_batches, max_bytes, hold)

    def run(
        self,
        write_lock: threading.Lock,
        conn: sqlite3.Connection,
        fn: Callable[[sqlite3.Connection], T],
        size: int = 0,
    ) -> T:
        """Run ``fn`` in a write transaction on this file, led by us or by another writer."""
        batch = _Batch(fn, size)
        self._batches.put(batch)
        while not batch.settled:
            with write_lock:
                if batch.settled:
                    break
                with self._batches.cond:
                    group = self._batches.take_now()
                if group:
                    self._batches.groups += 1
                    commit_group(conn, group, self._batches)
        if batch.error is not None:
            raise batch.error
        result: T = batch.result
        return result


def open_connection(args: Sequence[Any], kwargs: Mapping[str, Any]) -> sqlite3.Connection:
    """A ``sqlite3`` connection of ours: no implicit transactions, usable from its worker."""
    conn: sqlite3.Connection = sqlite3.connect(
        *args, **{**kwargs, "isolation_level": None, "check_same_thread": False}
    )
    try:
        configure(conn)
    except BaseException:
        conn.close()
        raise
    return conn


class _Threads:
    """The writer and reader workers of one file engine; renewed after ``dispose()``."""

    def __init__(self, engine: AsyncEngine) -> None:
        args, kwargs = engine.dialect.create_connect_args(engine.url)
        kwargs.pop("timeout", None)  # ours: the busy timeout pragma
        connect = functools.partial(open_connection, tuple(args), dict(kwargs))
        grouped = group_commit_option(engine, default=True)  # (the writer is the engine's)
        self.writer = GroupWriter(connect, "agents_memory-sqlite-writer", grouped=grouped)
        self.reader = Worker(connect, "agents_memory-sqlite-reader")
        self.stopped = False

    def stop(self, *, wait: bool) -> None:
        self.stopped = True
        self.writer.stop(wait=wait)
        self.reader.stop(wait=wait)


_threads: weakref.WeakKeyDictionary[Engine, _Threads] = weakref.WeakKeyDictionary()
_threads_guard = threading.Lock()


def _threads_for(engine: AsyncEngine) -> _Threads:
    sync_engine = engine.sync_engine
    found = _threads.get(sync_engine)  # (the usual case: no lock)
    if found is None:
        with _threads_guard:
            found = _threads.get(sync_engine)
            if found is None:
                found = _threads[sync_engine] = _Threads(engine)
    return found


def _on_dispose(sync_engine: Engine) -> None:
    """``engine.dispose()``: stop its workers; the next operation starts fresh ones."""
    with _threads_guard:
        found = _threads.pop(sync_engine, None)
    if found is not None:
        found.stop(wait=False)


def release_threads(sync_engine: Engine) -> None:
    """Stop the workers of an engine being abandoned (a store collected without ``close()``)."""
    _on_dispose(sync_engine)


class ThreadOperations(RowReads):
    """The protocol's operations as jobs on an engine's writer and reader threads.

    A job settles before a cancel is raised (:func:`settle`).
    """

    settles = True

    def __init__(
        self,
        engine: AsyncEngine,
        names: TableNames,
        on_corrupt: OnCorrupt,
        keyring: Keyring | None = None,
        *,
        expiry: bool = False,
    ) -> None:
        self._engine = engine
        self._names = names
        self._sql = compiled(names, expiry)
        self._expiry = expiry
        self._on_corrupt: OnCorrupt = on_corrupt
        self._keyring = keyring
        self._threads_seen: _Threads | None = None

    def _threads(self) -> _Threads:
        """The engine's workers (looked up again only after ``dispose()`` stopped them)."""
        found = self._threads_seen
        if found is None or found.stopped:
            found = self._threads_seen = _threads_for(self._engine)
        return found

    def _fail(self, exc: Exception, statement: str) -> Exception:
        return wrap_driver_error(exc, self._engine, statement, None, gone=False)

    async def _write(self, key: str, job: Callable[[LiteExecutor], T], size: int = 0) -> T:
        """Run ``job`` in a write transaction, grouped with others queued beside it."""
        sql = self._sql
        return await self._call(key, lambda conn: job(LiteExecutor(conn, sql)), size)

    async def _call(self, key: str, fn: Callable[[sqlite3.Connection], T], size: int) -> T:
        """:meth:`_write` for a job on the connection itself (an :class:`Append`)."""
        try:
            return await self._threads().writer.call(fn, size)
        except sqlite3.Error as exc:
            raise self._fail(exc, self._sql[key].sql) from exc

    async def _rows(self, key: str, params: dict[str, Any]) -> Sequence[Row]:
        c = self._sql[key]
        args = c.positional(params)
        try:
            return await self._threads().reader.call(
                lambda conn: conn.execute(c.sql, args).fetchall()
            )
        except sqlite3.Error as exc:
            raise self._fail(exc, c.sql) from exc

    async def add(self, session_id: str, data: Sequence[str], expires: object = None) -> None:
        size = sum(map(len, data))
        if self._expiry:  # an Append: a group may run it with the appends beside it
            await self._call("insert_message", Append(self._names, session_id, data, expires), size)
            return
        await self._write(
            "insert_message", lambda ex: add_body(ex, session_id, data, expires), size
        )

    async def pop(self, session_id: str) -> dict[str, Any] | None:
        on_corrupt, keyring = self._on_corrupt, self._keyring
        return await self._write("pop", lambda ex: pop_body(ex, session_id, on_corrupt, keyring))

    async def clear(self, session_id: str, *, checked: bool = True) -> bool:
        keyring = self._keyring
        return await self._write(
            "delete_session", lambda ex: clear_body(ex, session_id, keyring, checked=checked)
        )

    async def replace(self, session_id: str, data: Sequence[str], expires: object = None) -> None:
        size, keyring = sum(map(len, data)), self._keyring
        await self._write(
            "insert_message",
            lambda ex: replace_body(ex, session_id, data, keyring, expires, expiry=self._expiry),
            size,
        )

    async def fork(
        self, session_id: str, new_session_id: str, skip: int | None, expires: object = None
    ) -> None:
        await self._write(
            "fork_items",
            lambda ex: fork_body(ex, session_id, new_session_id, skip, expires, self._expiry),
        )


class CoreOperations(RowReads):
    """The same bodies through SQLAlchemy (aiosqlite): in-memory databases and observed engines.

    Writers of one engine queue on its asyncio lock (the one connection of an
    in-memory database is also shared by readers, which then queue too). A
    statement started on aiosqlite's thread cannot be stopped, so the backend
    runs these to completion before a cancel is raised (``settles`` is False).
    """

    settles = False

    def __init__(
        self,
        engine: AsyncEngine,
        names: TableNames,
        on_corrupt: OnCorrupt,
        lock: Callable[[], asyncio.Lock],
        keyring: Keyring | None = None,
        *,
        expiry: bool = False,
    ) -> None:
        self._engine = engine
        self._st = SQLite.statements(names, expiry)
        self._expiry = expiry
        self._on_corrupt: OnCorrupt = on_corrupt
        self._keyring = keyring
        self._lock = lock
        self._readers_queue = is_memory(engine.url)

    async def _write(self, job: Callable[[CoreSyncExecutor], T]) -> T:
        st = self._st
        async with self._lock(), self._engine.begin() as conn:
            return await conn.run_sync(lambda c: job(CoreSyncExecutor(c, st)))

    async def _rows(self, key: str, params: dict[str, Any]) -> Sequence[Row]:
        statement = getattr(self._st, key)
        if not self._readers_queue:
            async with self._engine.connect() as conn:
                return (await conn.execute(statement, params)).all()
        async with self._lock(), self._engine.connect() as conn:
            return (await conn.execute(statement, params)).all()

    async def add(self, session_id: str, data: Sequence[str], expires: object = None) -> None:
        expiry = self._expiry
        await self._write(lambda ex: add_body(ex, session_id, data, expires, expiry=expiry))

    async def pop(self, session_id: str) -> dict[str, Any] | None:
        on_corrupt, keyring = self._on_corrupt, self._keyring
        return await self._write(lambda ex: pop_body(ex, session_id, on_corrupt, keyring))

    async def clear(self, session_id: str, *, checked: bool = True) -> bool:
        keyring = self._keyring
        return await self._write(lambda ex: clear_body(ex, session_id, keyring, checked=checked))

    async def replace(self, session_id: str, data: Sequence[str], expires: object = None) -> None:
        keyring = self._keyring
        expiry = self._expiry
        await self._write(
            lambda ex: replace_body(ex, session_id, data, keyring, expires, expiry=expiry)
        )

    async def fork(
        self, session_id: str, new_session_id: str, skip: int | None, expires: object = None
    ) -> None:
        expiry = self._expiry
        await self._write(
            lambda ex: fork_body(ex, session_id, new_session_id, skip, expires, expiry)
        )


# -- the module ---------------------------------------------------------------------------------


class SQLite(Database):
    """SQLite through aiosqlite (SQLAlchemy) and the stdlib ``sqlite3`` (the driver runner)."""

    name: ClassVar[str] = "sqlite"
    label: ClassVar[str] = "SQLite"
    dialect_names: ClassVar[tuple[str, ...]] = ("sqlite",)
    serialize_writes: ClassVar[bool] = True
    loop_bound: ClassVar[bool] = False  # aiosqlite and our threads serve any loop

    @classmethod
    def engine_defaults(cls, url: URL, kwargs: dict[str, Any]) -> None:
        """In memory: one shared connection (else each sees its own empty database).

        A file keeps SQLAlchemy's pool: the hot path runs on the runner's own
        threads, and the pool serves listings, migrations and engines whose
        statements must go through SQLAlchemy (``echo``, tracing, connect listeners).
        """
        if "poolclass" in kwargs or "creator" in kwargs:
            return
        if is_memory(url):
            kwargs["poolclass"] = StaticPool

    @classmethod
    def one_connection(cls, url: URL) -> bool:
        return is_memory(url)

    @classmethod
    def configure_engine(cls, sync_engine: Engine) -> None:
        if not event.contains(sync_engine, "connect", _on_connect):
            event.listen(sync_engine, "connect", _on_connect)
        if not event.contains(sync_engine, "engine_disposed", _on_dispose):
            event.listen(sync_engine, "engine_disposed", _on_dispose)

    @classmethod
    def _build_statements(cls, names: TableNames, expiry: bool) -> Statements:
        when = bindparam("now", type_=String())
        base = portable_statements(
            names,
            now=when,
            upsert_session=_upsert_renewing if expiry else _upsert_session,
            role_of=_role_of,
            item_time=when,
            clock=READ_CLOCK if expiry else None,
            expires_type=String(),
            read_data=_as_bytes,
        )
        if not expiry:
            return base
        # A write compares deadlines with its own clock, the time it stamps (``now``).
        sessions, messages = base.sessions, base.messages
        sid = sid_param(sessions)
        drop = delete(messages).where(
            _expired_items(messages, sessions, sessions.c.session_id == sid, when)
        )
        probe = expired_probe(sessions, sid, when)
        return dataclasses.replace(base, drop_expired=drop, select_expired=probe)

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
        from agents_memory._sqlalchemy._engine import engine_state  # noqa: PLC0415

        state = engine_state(engine)
        if cls.thread_runner_allowed(engine):
            return ThreadOperations(engine, names, on_corrupt, keyring, expiry=expiry)
        return CoreOperations(engine, names, on_corrupt, state.lock, keyring, expiry=expiry)

    @staticmethod
    def thread_runner_allowed(engine: AsyncEngine) -> bool:
        """Our own threads may serve a file engine nobody observes or customises at connect.

        Our connections are opened from the engine's URL (``create_connect_args``)
        and set up as the engine's are; an engine with its own connect listeners
        or ``creator`` would set them up otherwise, so it keeps the SQLAlchemy runner.
        """
        sync_engine = engine.sync_engine
        return not (
            is_memory(engine.url)
            or observed(engine)
            or foreign_listeners(sync_engine, "connect", [_on_connect])
            or foreign_listeners(sync_engine, "first_connect", [])
            or foreign_listeners(sync_engine, "do_connect", [])
        )

    @classmethod
    def upsert_metadata(cls, sessions: Table) -> Executable:
        sid = bindparam("sid", type_=sessions.c.session_id.type)
        meta = bindparam("meta", type_=sessions.c["metadata"].type)
        when = bindparam("now", type_=String())
        return (
            sqlite_dialect.insert(sessions)
            .values(session_id=sid, metadata=meta, created_at=when, updated_at=when)
            .on_conflict_do_update(
                index_elements=[sessions.c.session_id],
                set_={"metadata": meta, "updated_at": when},
            )
        )

    @classmethod
    def upsert_expiry(cls, sessions: Table) -> Executable:
        sid = bindparam("sid", type_=sessions.c.session_id.type)
        expires = bindparam("expires", type_=String())
        when = bindparam("now", type_=String())
        return (
            sqlite_dialect.insert(sessions)
            .values(session_id=sid, expires_at=expires, created_at=when, updated_at=when)
            .on_conflict_do_update(
                index_elements=[sessions.c.session_id], set_={"expires_at": expires}
            )
        )

    @classmethod
    def metadata_params(cls) -> dict[str, Any]:
        """The client clock for :meth:`upsert_metadata`."""
        return {"now": now()}

    @classmethod
    def clock_params(cls) -> dict[str, Any]:
        """The client clock (SQLite's ``CURRENT_TIMESTAMP`` keeps whole seconds)."""
        return {"now": now()}

    @classmethod
    def bump_generation(cls, generations: Table) -> Executable:
        sid = bindparam("sid", type_=generations.c.session_id.type)
        return (
            sqlite_dialect.insert(generations)
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
        column = sessions.c["metadata"]
        conditions: list[ColumnElement[bool]] = []
        for key, value in wanted.items():
            path = "$." + json.dumps(key)
            kind = func.json_type(column, path)
            if isinstance(value, bool):
                conditions.append(kind == ("true" if value else "false"))
            elif isinstance(value, str):
                conditions += [kind == "text", func.json_extract(column, path) == value]
            else:
                conditions += [
                    kind.in_(["integer", "real"]),
                    func.json_extract(column, path) == value,
                ]
        return and_(*conditions)

    @classmethod
    @contextlib.contextmanager
    def migration_lock(
        cls,
        connection: Any,  # noqa: ANN401
        key: int,  # noqa: ARG003
        what: str,  # noqa: ARG003
        row: Table | None = None,
    ) -> Iterator[None]:
        """``BEGIN IMMEDIATE``: the file's write lock, up front (also with ``row``).

        It also makes the DDL transactional (the sqlite3 module would otherwise
        run DDL outside any transaction). SQLite has no advisory locks to lack:
        the file lock is the lock in every mode. With ``row`` the lock table and
        its row are made and read under it too (one writer at a time, so no race),
        so a lineage has the same tables in every mode and on every database.
        """
        if not connection.connection.driver_connection.in_transaction:
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        if row is not None:
            for statement in (*lock_table.create_statements(row), lock_table.lock_row(row)):
                connection.execute(statement)
        yield

    @classmethod
    @contextlib.contextmanager
    def rebuild_guard(cls, connection: Any) -> Iterator[None]:  # noqa: ANN401
        """Foreign keys off while tables are rebuilt, and back on after.

        Batch mode rebuilds a table by copying it and dropping the original; with
        foreign keys on, dropping the sessions table would cascade-delete every
        message. SQLite ignores the pragma inside an open transaction, so that case
        is refused rather than risked.
        """
        connection.exec_driver_sql("PRAGMA foreign_keys = OFF")
        if connection.exec_driver_sql("PRAGMA foreign_keys").scalar():
            msg = (
                "cannot migrate agents_memory tables on SQLite inside an open transaction "
                "(foreign keys cannot be switched off there, and rebuilding a table would "
                "cascade-delete messages); run the migration before any other write on "
                "this connection"
            )
            raise RuntimeError(msg)
        try:
            yield
        finally:
            connection.exec_driver_sql("PRAGMA foreign_keys = ON")

    @classmethod
    def duplicate_key(cls, orig: BaseException) -> bool:
        return getattr(orig, "sqlite_errorcode", None) in _SQLITE_DUPLICATE

    @classmethod
    def classify(cls, orig: BaseException) -> str | None:
        code = getattr(orig, "sqlite_errorcode", None) or 0
        if code & 0xFF == _SQLITE_BUSY:  # extended codes (recovery, snapshot, timeout) too
            return "busy"
        text = str(orig)
        if text.startswith(("no such table", "no such column")) or " has no column named " in text:
            return "missing"
        if code == _SQLITE_CANTOPEN:
            return "connect"
        if code == _SQLITE_NOTADB:
            return "notadb"
        return None

    @classmethod
    def byte_length(cls, column: ColumnElement[Any]) -> ColumnElement[int]:
        """``length()`` of the UTF-8 bytes (``octet_length`` came only in SQLite 3.43)."""
        return func.length(cast(column, LargeBinary))

    @classmethod
    def describe(cls, url: URL) -> str:
        return f"the SQLite database {url.database or ':memory:'!r}"

    @classmethod
    def cannot_open_advice(cls, database: str | None, kind: str) -> str | None:
        if kind == "notadb":
            return (
                "it is not a SQLite database file: give the path of a database file, or of "
                "one that does not exist yet"
            )
        if database and Path(database).is_dir():
            return "it is a directory: give the path of a database file (in it, say)"
        return "check that its directory exists and is writable by this process"

    @classmethod
    def stamp(cls, value: dt.datetime) -> object:
        """SQLite keeps times as text: bind it in SQLite's format, not SQLAlchemy's."""
        return stamp(value)

    @classmethod
    def stamp_type(cls, column_type: Any) -> Any:  # noqa: ANN401, ARG003
        return String()
