"""SQL statements for one table-name set and dialect, built once and reused.

Building a statement per call costs more than running it on SQLite, so each
set is built once (cached by names and dialect). Where SQL allows it, a write
is a single statement, so it is atomic on its own and costs one round trip.

The hot path on SQLite and Postgres runs plain SQL text on the driver
(:class:`DriverSQL`); each text is written once here with ``:name`` placeholders,
which SQLAlchemy's ``text()`` and sqlite3 take as they are and asyncpg gets
renumbered as ``$1..$n``.
"""

from __future__ import annotations

import dataclasses
import functools
import re

from sqlalchemy import (
    BindParameter,
    Delete,
    Executable,
    Table,
    TextClause,
    bindparam,
    delete,
    func,
    insert,
    select,
    text,
)
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.sql.dml import Insert

from agents_memory._tables import TableNames
from agents_memory.models import current_timestamp, get_models

_PLACEHOLDER = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


def _sql(numbered: bool, template: str, *params: str) -> str:
    """Render ``template`` as written or numbered (``$1``); ``params`` is the positional order.

    The order is checked against the text, so a statement and the arguments the
    driver path passes to it cannot drift apart silently.
    """
    seen: list[str] = []
    for name in _PLACEHOLDER.findall(template):
        if name not in seen:
            seen.append(name)
    if tuple(seen) != params:  # pragma: no cover - a programming error in this module
        msg = f"placeholders {seen} do not match the declared order {params}"
        raise AssertionError(msg)
    if not numbered:
        return template
    return _PLACEHOLDER.sub(lambda m: f"${seen.index(m[1]) + 1}", template)


@dataclasses.dataclass(frozen=True, slots=True)
class DriverSQL:
    """The hot path's SQL text for one table-name set, in its driver's placeholder style.

    Positional drivers (asyncpg) take the parameters in the order listed; sqlite3
    takes a dict by name.
    """

    upsert_session: str
    """Create the session row or bump ``updated_at`` (``sid``)."""
    insert_message: str
    """One item row, for executemany (``sid``, ``data``)."""
    append: str
    """Postgres: session upsert and multi-row insert as one statement (``sid``, ``data``)."""
    select_all: str
    """Every item oldest first (``sid``)."""
    select_latest: str
    """Newest first (``sid``, ``n``); callers reverse."""
    select_after: str
    """Oldest first from an id on (``sid``, ``after``, ``n``), for streaming."""
    select_older: str
    """Newest first below an id (``sid``, ``before``, ``n``): refills past corrupt rows."""
    pop: str
    """Delete and return the newest item (``sid``); Postgres locks the row first."""
    delete_messages: str
    """All items of a session (``sid``)."""
    delete_session: str
    """The session row (``sid``)."""
    clear: str
    """Postgres: both deletes as one statement (``sid``)."""


@functools.cache
def driver_sql(names: TableNames, dialect: str, *, named: bool = False) -> DriverSQL:
    """Build (once) the SQL text for ``names`` on ``dialect``.

    Placeholders suit the dialect's driver (``$n`` for asyncpg), or stay ``:name``
    with ``named`` (for SQLAlchemy's ``text()``).
    """
    s, m = names.sessions, names.messages  # validated identifiers (agents_memory._tables)
    d = dialect == "postgresql" and not named
    cols = f"SELECT id, message_data FROM {m} WHERE session_id = :sid"
    # Postgres: FOR UPDATE makes a concurrent popper wait, then move on to the next row, so
    # each item is claimed exactly once. SQLite: callers hold the engine's write lock.
    lock = " FOR UPDATE" if dialect == "postgresql" else ""
    return DriverSQL(
        upsert_session=_sql(
            d,
            f"INSERT INTO {s} (session_id) VALUES (:sid) "
            "ON CONFLICT (session_id) DO UPDATE SET updated_at = CURRENT_TIMESTAMP",
            "sid",
        ),
        insert_message=_sql(
            d, f"INSERT INTO {m} (session_id, message_data) VALUES (:sid, :data)", "sid", "data"
        ),
        # The uncorrelated sub-select is a one-time filter evaluated before the first row,
        # so the session row is upserted (and row-locked) before any id is drawn: batches
        # written concurrently to one session queue on that lock and stay contiguous.
        append=_sql(
            d,
            f"WITH s AS (INSERT INTO {s} (session_id) VALUES (:sid) "
            "ON CONFLICT (session_id) DO UPDATE SET updated_at = CURRENT_TIMESTAMP "
            "RETURNING 1) "
            f"INSERT INTO {m} (session_id, message_data) "
            "SELECT :sid, t.d FROM unnest(CAST(:data AS TEXT[])) WITH ORDINALITY AS t(d, o) "
            "WHERE (SELECT count(*) FROM s) = 1 ORDER BY t.o",
            "sid",
            "data",
        ),
        select_all=_sql(d, f"{cols} ORDER BY id", "sid"),
        select_latest=_sql(d, f"{cols} ORDER BY id DESC LIMIT :n", "sid", "n"),
        select_after=_sql(d, f"{cols} AND id > :after ORDER BY id LIMIT :n", "sid", "after", "n"),
        select_older=_sql(
            d, f"{cols} AND id < :before ORDER BY id DESC LIMIT :n", "sid", "before", "n"
        ),
        pop=_sql(
            d,
            f"DELETE FROM {m} WHERE id = (SELECT id FROM {m} WHERE session_id = :sid "
            f"ORDER BY id DESC LIMIT 1{lock}) RETURNING id, message_data",
            "sid",
        ),
        delete_messages=_sql(d, f"DELETE FROM {m} WHERE session_id = :sid", "sid"),
        delete_session=_sql(d, f"DELETE FROM {s} WHERE session_id = :sid", "sid"),
        clear=_sql(
            d,
            f"WITH m AS (DELETE FROM {m} WHERE session_id = :sid) "
            f"DELETE FROM {s} WHERE session_id = :sid",
            "sid",
        ),
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Statements:
    """Every statement the hot path runs, for one table-name set on one dialect."""

    sessions: Table
    messages: Table
    upsert_session: Executable
    """Create the session row or bump ``updated_at`` (params: ``sid``)."""
    insert_messages: Insert
    """Executemany insert (params: ``sid``, ``data``)."""
    append: TextClause | None
    """Postgres only: session upsert and multi-row insert as one statement."""
    select_all: Executable
    select_latest: Executable
    """Newest first (params: ``sid``, ``n``); callers reverse."""
    select_after: Executable
    """Oldest first from an id on (params: ``sid``, ``after``, ``n``), for streaming."""
    select_older: Executable
    """Newest first below an id (``sid``, ``before``, ``n``): refills a limit past corrupt rows."""
    pop: TextClause
    """Delete and return the newest item (``sid``); MySQL: select and lock it (``pop_delete``)."""
    delete_messages: Delete
    delete_session: Delete
    clear: TextClause | None
    """Postgres: both deletes as one statement; MySQL: the session row's, cascading (``sid``)."""
    pop_delete: TextClause | None = None
    """MySQL only (no ``DELETE … RETURNING``): delete the row ``pop`` locked (``id``)."""
    driver: DriverSQL | None = None
    """SQLite and Postgres: the same operations as SQL text for the driver (the hot path)."""


@functools.cache
def statements_for(names: TableNames, dialect: str) -> Statements:
    """Build (once) the statements for ``names`` on ``dialect``."""
    models = get_models(names)
    sessions: Table = models.Session.__table__
    messages: Table = models.Message.__table__
    sid = bindparam("sid", type_=sessions.c.session_id.type)

    upsert_session: Executable
    if dialect == "postgresql":
        pg = postgresql.insert(sessions).values(session_id=sid)
        upsert_session = pg.on_conflict_do_update(
            index_elements=[sessions.c.session_id],
            set_={"updated_at": func.current_timestamp()},
        )
    elif dialect == "mysql":
        upsert_session = _mysql_upsert_session(sessions, sid)
    else:
        lite = sqlite.insert(sessions).values(session_id=sid)
        upsert_session = lite.on_conflict_do_update(
            index_elements=[sessions.c.session_id],
            set_={"updated_at": func.current_timestamp()},
        )

    append = None
    clear = None
    pop_delete = None
    driver = None
    if dialect == "mysql":
        pop, pop_delete, clear = _mysql_pop_and_clear(names)
    else:
        # The same texts as the driver path's (see driver_sql), so both paths run one SQL.
        driver = driver_sql(names, dialect)
        named = driver_sql(names, dialect, named=True)
        pop = text(named.pop)
        if dialect == "postgresql":
            array = postgresql.ARRAY(postgresql.TEXT())
            append = text(named.append).bindparams(bindparam("data", type_=array))
            clear = text(named.clear)

    cols = (messages.c.id, messages.c.message_data)
    by_session = messages.c.session_id == sid
    return Statements(
        sessions=sessions,
        messages=messages,
        upsert_session=upsert_session,
        insert_messages=insert(messages).values(
            session_id=bindparam("sid"), message_data=bindparam("data")
        ),
        append=append,
        select_all=select(*cols).where(by_session).order_by(messages.c.id),
        select_latest=select(*cols)
        .where(by_session)
        .order_by(messages.c.id.desc())
        .limit(bindparam("n")),
        select_after=select(*cols)
        .where(by_session, messages.c.id > bindparam("after"))
        .order_by(messages.c.id)
        .limit(bindparam("n")),
        select_older=select(*cols)
        .where(by_session, messages.c.id < bindparam("before"))
        .order_by(messages.c.id.desc())
        .limit(bindparam("n")),
        pop=pop,
        delete_messages=delete(messages).where(by_session),
        delete_session=delete(sessions).where(sessions.c.session_id == sid),
        clear=clear,
        pop_delete=pop_delete,
        driver=driver,
    )


# -- MySQL / MariaDB ----------------------------------------------------------------------------


def _mysql_upsert_session(sessions: Table, sid: BindParameter[str]) -> Executable:
    """Create the session row or bump ``updated_at``, to the microsecond.

    Run first in an append's transaction, it row-locks the session (exclusively,
    found or inserted) until commit: appends to one session queue there, so
    each batch's ids are drawn after the previous batch committed and stay
    contiguous in that session's order.
    """
    return (
        mysql.insert(sessions)
        .values(session_id=sid)
        .on_duplicate_key_update(updated_at=current_timestamp())
    )


def _mysql_pop_and_clear(names: TableNames) -> tuple[TextClause, TextClause, TextClause]:
    """Pop as a locking read then a delete (MySQL has no ``DELETE … RETURNING``); clear by cascade.

    ``FOR UPDATE`` makes a concurrent popper wait on the same newest row; once
    it is deleted and committed, the waiter's locking read moves on to the next
    one, so each item is claimed exactly once. Clearing deletes only the session
    row and lets ``ON DELETE CASCADE`` remove its items: locking the session row
    first, as appends do, means the two never wait on each other in a cycle.
    """
    s, m = names.sessions, names.messages  # validated identifiers (agents_memory._tables)
    pop = text(
        f"SELECT id, message_data FROM {m} WHERE session_id = :sid "
        "ORDER BY id DESC LIMIT 1 FOR UPDATE"
    )
    pop_delete = text(f"DELETE FROM {m} WHERE id = :id")
    clear = text(f"DELETE FROM {s} WHERE session_id = :sid")
    return pop, pop_delete, clear
