"""Which lock serialises migrators: the database's advisory lock, or a row of our own.

Advisory locks (``pg_advisory_xact_lock``, ``GET_LOCK``) are what a migration
takes by default, but not every server that speaks a wire protocol has them
for real: CockroachDB and some YugabyteDB versions ship no-op stubs (or none
at all), older TiDB releases answered ``GET_LOCK`` as a no-op, and a pooler
may hand two clients one server session. There a one-row table of the lineage
(``<sessions>_migration_lock``) is locked instead, with ``SELECT … FOR UPDATE``
(or the file's write lock on SQLite), by the migrating transaction or, where
DDL commits implicitly (MySQL), by a second connection held for the duration.

``lock="auto"`` (the default) probes once per URL whether advisory locks
really exclude: two connections try the same key; a server that grants it to
both, or refuses the function, gets row locks. ``"advisory"`` and ``"row"``
choose without probing. Every migrator of one database must take the same
kind of lock (``auto`` gives the same answer for the same server).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Literal

from sqlalchemy import Table, exists, insert, inspect, literal, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.schema import CreateTable, DropTable
from sqlalchemy.sql import Executable

LOCK_ENV = "AGENTS_MEMORY_MIGRATION_LOCK"
"""The environment variable a front end reads when no ``lock=`` / ``--lock`` is given."""

LOCK_MODES = ("auto", "advisory", "row")

LockMode = Literal["auto", "advisory", "row"]
Chosen = Literal["advisory", "row"]

ROW_ID = 1

_log = logging.getLogger("alembic.agents_memory")

_probed: dict[str, bool] = {}
_probed_guard = threading.Lock()


def resolve_mode(given: str | None) -> LockMode:
    """``given`` (an argument, ``--lock``), else ``$AGENTS_MEMORY_MIGRATION_LOCK``, else ``auto``.

    Anything else is a ``ValueError`` naming where it came from, raised before a
    connection is opened.
    """
    source = "lock"
    value = given
    if value is None:
        value = os.environ.get(LOCK_ENV) or None
        source = f"${LOCK_ENV}"
    if value is None:
        return "auto"
    if not isinstance(value, str):
        msg = f"lock must be a str ({', '.join(LOCK_MODES)}), got {type(value).__name__}"
        raise TypeError(msg)
    if value not in LOCK_MODES:
        msg = (
            f"invalid migration lock {value!r} (from {source}): use one of "
            f"{', '.join(LOCK_MODES)} (auto probes whether the server's advisory locks "
            "exclude, and locks a row of <sessions>_migration_lock where they do not)"
        )
        raise ValueError(msg)
    return value  # type: ignore[return-value]  # (checked against LOCK_MODES above)


def _probe_key(engine: Engine) -> str:
    """One probe per server and database: the URL without its password."""
    return engine.url.set(password=None).render_as_string(hide_password=False)


def forget_probes() -> None:
    """Drop every cached probe answer (tests that change what a server offers)."""
    with _probed_guard:
        _probed.clear()


def choose(connection: Connection, mode: LockMode) -> Chosen:
    """The lock ``mode`` means on ``connection``'s server (``auto``: probed once per URL)."""
    if mode != "auto":
        return mode
    from agents_memory._databases import database_for  # noqa: PLC0415 - no cycle at import

    engine = connection.engine
    key = _probe_key(engine)
    with _probed_guard:
        known = _probed.get(key)
    if known is None:
        try:
            known = database_for(connection.dialect.name).advisory_locks_exclude(engine)
        except PoolTimeoutError:
            # The probe needs two connections beside the migrating one; a pool too small
            # for that keeps advisory locks (what every release before this one took).
            _log.warning(
                "the engine's pool could not lend two connections to probe advisory locks; "
                "taking the advisory lock (pass lock='row' where it does not exclude)"
            )
            return "advisory"
        with _probed_guard:
            _probed[key] = known
        if not known:
            _log.info(
                "advisory locks do not exclude on this server (granted twice, or refused): "
                "migrations lock a row of their lineage's migration lock table instead"
            )
    return "advisory" if known else "row"


def lock_row(table: Table) -> Executable:
    """``SELECT id … WHERE id = 1 FOR UPDATE`` (SQLite's compiler leaves ``FOR UPDATE`` out)."""
    return select(table.c.id).where(table.c.id == ROW_ID).with_for_update()


def create_statements(table: Table) -> tuple[Executable, Executable]:
    """``CREATE TABLE IF NOT EXISTS`` and an insert of the row that does nothing if it exists.

    The insert is ``INSERT … SELECT 1 WHERE NOT EXISTS (…)``: two migrators
    racing may both find it absent, and the loser's insert then fails on the
    primary key, which :func:`ensure_row` tolerates.
    """
    absent = ~exists(select(table.c.id).where(table.c.id == ROW_ID))
    row = insert(table).from_select(["id"], select(literal(ROW_ID)).where(absent))
    return CreateTable(table, if_not_exists=True), row


def ensure_row(connection: Connection, table: Table, attempts: int = 5) -> None:
    """Make the lock table and its row on a connection of its own (each step committed).

    Safe when migrators race: ``IF NOT EXISTS`` and the guarded insert make a
    repeat harmless, and a loser's error (Postgres may raise a unique violation
    from its catalog for two concurrent ``CREATE TABLE IF NOT EXISTS``; the row's
    primary key for two inserts) is rolled back and the steps run again, which
    then find what the winner made.
    """
    # A plain read first: it never waits (MVCC), while the guarded insert would queue
    # on the row lock a running migrator holds (InnoDB share-locks what an INSERT …
    # SELECT reads), so the lock's waiters wait on the FOR UPDATE.
    present = False
    if inspect(connection).has_table(table.name):
        found = connection.execute(select(table.c.id).where(table.c.id == ROW_ID)).first()
        present = found is not None
    connection.rollback()
    if present:
        return
    create, row = create_statements(table)
    for attempt in range(attempts):
        try:
            with connection.begin():
                connection.execute(create)
            with connection.begin():
                connection.execute(row)
        except DBAPIError:
            if connection.in_transaction():
                connection.rollback()
            if attempt == attempts - 1:
                raise
            continue
        return


def drop_statement(table: Table) -> Executable:
    """``DROP TABLE IF EXISTS``: what a downgrade to ``base`` does with the lock table."""
    return DropTable(table, if_exists=True)
