"""Running one lineage on one connection: the options, the lock and the SQLite guard.

Every front end ends here: :mod:`agents_memory.migrations` (and so the CLI and
``create_tables=True``) calls :func:`run_lineage`; the repository's ``env.py``
(plain ``alembic``) configures its context with the same :func:`migration_opts`,
:func:`sqlite_foreign_keys_off` and :func:`lock`.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Connection
from sqlalchemy.types import TypeEngine

from agents_memory._migrations._scripts import script_directory
from agents_memory._tables import TableNames
from agents_memory._urls import dialect_family
from agents_memory.models import get_models

NAMES_KEY = "agents_memory_tables"
"""Key under which revision scripts find the table names: ``op.get_context().opts[NAMES_KEY]``."""


def include_name(names: TableNames) -> Callable[[str | None, str, object], bool]:
    """Compare only our two tables: the database may hold anything else."""
    ours = {names.sessions, names.messages}

    def include(name: str | None, type_: str, _parents: object) -> bool:
        return type_ != "table" or name in ours

    return include


def compare_type(
    context: MigrationContext,
    _inspected_column: Any,  # noqa: ANN401
    _metadata_column: Any,  # noqa: ANN401
    inspected_type: TypeEngine[Any],
    metadata_type: TypeEngine[Any],
) -> bool | None:
    """Alembic's type comparison, plus the fractional seconds of a MySQL ``DATETIME``.

    Alembic compares type arguments only when both sides have the same number of
    them, so ``DATETIME`` against ``DATETIME(6)`` would pass, and a column that
    lost its microseconds would go unnoticed. (MariaDB's ``JSON``, reflected as
    ``LONGTEXT``, needs nothing: Alembic already treats the two as synonyms.)
    ``None`` defers to Alembic's own comparison.
    """
    dialect = context.dialect
    if dialect_family(dialect.name) != "mysql":
        return None
    wanted = metadata_type.dialect_impl(dialect)
    if isinstance(wanted, mysql.DATETIME) and isinstance(inspected_type, mysql.DATETIME):
        return (inspected_type.fsp or 0) != (wanted.fsp or 0)
    return None


def migration_opts(names: TableNames) -> dict[str, Any]:
    """The context options every front end uses for the lineage of ``names``."""
    return {
        "target_metadata": get_models(names).metadata,
        "version_table": names.version_table,
        "render_as_batch": True,
        "compare_type": compare_type,
        "include_name": include_name(names),
        NAMES_KEY: names,
    }


def _lock_key(names: TableNames) -> int:
    digest = hashlib.sha1(names.version_table.encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


MYSQL_LOCK_TIMEOUT_S = 600
"""How long a MySQL/MariaDB migrator waits for another one migrating the same tables."""


@contextlib.contextmanager
def lock(connection: Connection, names: TableNames) -> Iterator[None]:
    """Serialise migrators of one lineage across processes, inside the migration transaction.

    Postgres: a transaction-scoped advisory lock. SQLite: ``BEGIN IMMEDIATE``
    takes the file's write lock up front, which also makes the DDL transactional
    (the sqlite3 module would otherwise run DDL outside any transaction).
    MySQL/MariaDB have no transactional DDL (each statement commits), so a named
    ``GET_LOCK`` held by the connection serialises migrators instead; it is
    released on the way out, since a pooled connection outlives the migration.
    """
    dialect = dialect_family(connection.dialect.name)
    if dialect == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _lock_key(names)})
    elif dialect == "sqlite":
        driver = connection.connection.driver_connection
        if not getattr(driver, "in_transaction", False):
            connection.exec_driver_sql("BEGIN IMMEDIATE")
    elif dialect == "mysql":
        with _mysql_lock(connection, names):
            yield
        return
    yield


class _PrimaryKeyNameNotes(logging.Filter):
    """Drop MariaDB's note that a PRIMARY KEY's name is ignored (its key is always ``PRIMARY``).

    Our naming convention names every constraint, and Alembic names its version
    table's key; MariaDB notes for each that the name was dropped, and asyncmy logs
    every server note as a warning, which lands on stderr (three lines per table
    set) for anyone who has not configured logging. Nothing is lost: the keys exist.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return "ignored for PRIMARY key" not in record.getMessage()


_MYSQL_DRIVER_LOGGER = logging.getLogger("asyncmy")


@contextlib.contextmanager
def _mysql_lock(connection: Connection, names: TableNames) -> Iterator[None]:
    # GET_LOCK names are at most 64 characters: a digest of the version table fits any set.
    name = f"agents_memory:{_lock_key(names) & 0xFFFFFFFFFFFFFFFF:016x}"
    params = {"name": name, "timeout": MYSQL_LOCK_TIMEOUT_S}
    got = connection.execute(text("SELECT GET_LOCK(:name, :timeout)"), params).scalar()
    if got != 1:
        msg = (
            f"another migration of {names.sessions}/{names.messages} held its lock for "
            f"{MYSQL_LOCK_TIMEOUT_S} s; wait for it to finish (or end that connection), then "
            "run the migration again"
        )
        raise RuntimeError(msg)
    quiet = _PrimaryKeyNameNotes()
    _MYSQL_DRIVER_LOGGER.addFilter(quiet)
    try:
        yield
    finally:
        _MYSQL_DRIVER_LOGGER.removeFilter(quiet)
        connection.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": name})


@contextlib.contextmanager
def sqlite_foreign_keys_off(connection: Connection) -> Iterator[None]:
    """Switch SQLite foreign keys off while tables are rebuilt, and back on after.

    Batch mode rebuilds a table by copying it and dropping the original; with
    foreign keys on, dropping the sessions table would cascade-delete every
    message. SQLite ignores the pragma inside an open transaction, so that case
    is refused rather than risked.
    """
    if connection.dialect.name != "sqlite":
        yield
        return
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


def carry_on_legacy_lineage(operations: Operations, names: TableNames) -> None:
    """Rename the version table an earlier release gave ``names`` to today's name, if needed.

    Sessions names of 52-63 characters used to get a version table whose
    primary key name did not fit Postgres or MySQL; their lineages exist only
    where that did not matter (SQLite, and MariaDB at 52 characters). Renaming
    the table keeps such a database at its revision instead of looking never
    migrated. Runs under the migration lock, before Alembic reads the version.
    """
    legacy = names.legacy_version_table
    if legacy is None:
        return
    insp = inspect(operations.get_bind())
    if insp.has_table(legacy) and not insp.has_table(names.version_table):
        operations.rename_table(legacy, names.version_table)


def run_lineage(
    connection: Connection, names: TableNames, revision: str, *, downgrade: bool = False
) -> None:
    """Move the lineage of ``names`` to ``revision`` on an open connection, in one transaction.

    Uses a bare ``MigrationContext`` (no ``EnvironmentContext``), so it can run
    from inside an application's own ``env.py`` without disturbing its context.
    """
    script = script_directory()

    def steps(rev: Any, _context: MigrationContext) -> Any:  # noqa: ANN401
        if downgrade:
            return script._downgrade_revs(revision, rev)  # noqa: SLF001 - as alembic.command does
        return script._upgrade_revs(revision, rev)  # noqa: SLF001

    with sqlite_foreign_keys_off(connection):
        context = MigrationContext.configure(
            connection, opts={**migration_opts(names), "fn": steps, "script": script}
        )
        with (
            Operations.context(context),
            context.begin_transaction(),
            lock(connection, names),
        ):
            carry_on_legacy_lineage(Operations(context), names)
            context.run_migrations()
