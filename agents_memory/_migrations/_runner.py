"""Running one lineage on one connection: the options, the lock and the SQLite guard.

Every front end ends here: :mod:`agents_memory.migrations` (and so the CLI and
``create_tables=True``) calls :func:`run_lineage`; the repository's ``env.py``
(plain ``alembic``) configures its context with the same :func:`migration_opts`,
:func:`sqlite_foreign_keys_off` and :func:`lock`.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator
from typing import Any

from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect
from sqlalchemy.engine import Connection
from sqlalchemy.types import TypeEngine

from agents_memory._databases import database_for
from agents_memory._migrations._layout import BUILT_AT, PARTITIONS_KEY, Layout, partition_names
from agents_memory._migrations._lock import LockMode, choose, drop_statement
from agents_memory._migrations._preflight import check_tables
from agents_memory._migrations._scripts import script_directory
from agents_memory._tables import TableNames
from agents_memory.models import get_models, migration_lock_table

NAMES_KEY = "agents_memory_tables"
"""Key under which revision scripts find the table names: ``op.get_context().opts[NAMES_KEY]``."""


def include_name(names: TableNames) -> Callable[[str | None, str, object], bool]:
    """Compare only our tables: the database may hold anything else."""
    ours = set(names.tables)

    def include(name: str | None, type_: str, _parents: object) -> bool:
        return type_ != "table" or name in ours

    return include


def include_object(names: TableNames) -> Callable[[Any, str | None, str, bool, Any], bool]:
    """Leave out what Postgres makes for a partitioned messages table on its own.

    A foreign key to a partitioned table is kept by the server as one constraint
    per partition (``…_fkey1``, ``…_fkey2``, each referring to a partition); the
    inspector lists them beside ours, and ``check`` would call them drift.
    """
    partitions = partition_names(names)

    def include(obj: Any, _name: str | None, type_: str, reflected: bool, _to: Any) -> bool:  # noqa: ANN401
        if type_ == "foreign_key_constraint" and reflected:
            return obj.referred_table.name not in partitions
        return True

    return include


def compare_type(
    context: MigrationContext,
    _inspected_column: Any,  # noqa: ANN401
    _metadata_column: Any,  # noqa: ANN401
    inspected_type: TypeEngine[Any],
    metadata_type: TypeEngine[Any],
) -> bool | None:
    """Alembic's type comparison, with the database module's additions (``None``: Alembic's)."""
    db = database_for(context.dialect.name)
    return db.compare_type(context.dialect, inspected_type, metadata_type)


def migration_opts(names: TableNames, partitions: int | None = None) -> dict[str, Any]:
    """The context options every front end uses for the lineage of ``names``.

    ``partitions``: the messages table's hash partitions where a revision builds it
    (see :func:`wanted_partitions`); ``None``: the plain layout.
    """
    return {
        PARTITIONS_KEY: partitions,
        "target_metadata": get_models(names).metadata,
        "version_table": names.version_table,
        "render_as_batch": True,
        "compare_type": compare_type,
        "include_name": include_name(names),
        "include_object": include_object(names),
        NAMES_KEY: names,
    }


def _lock_key(names: TableNames) -> int:
    digest = hashlib.sha1(names.version_table.encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


@contextlib.contextmanager
def lock(connection: Connection, names: TableNames, mode: LockMode = "auto") -> Iterator[None]:
    """Serialise migrators of one lineage across processes (the database module's lock).

    ``mode``: ``advisory``, ``row`` (the lineage's migration lock table) or
    ``auto`` (row where the server's advisory locks do not exclude; see ``_lock``).
    """
    db = database_for(connection.dialect.name)
    row = migration_lock_table(names) if choose(connection, mode) == "row" else None
    what = f"{names.sessions}/{names.messages}"
    with db.migration_lock(connection, _lock_key(names), what, row=row):
        yield


def drop_lock_table(connection: Connection, names: TableNames) -> None:
    """At ``base`` the lineage is gone, and its migration lock table (if any) with it.

    Run after the migration committed (a waiter on the row would otherwise wait
    in a cycle with the ``DROP``): a migrator that queued meanwhile simply makes
    the table again.
    """
    table = migration_lock_table(names)
    if inspect(connection).has_table(table.name):  # (MySQL notes an IF EXISTS that finds none)
        connection.execute(drop_statement(table))


def wanted_partitions(connection: Connection, layout: Layout) -> int | None:
    """The partitions ``layout`` asks of this database (``None``: plain), or ``ValueError``.

    Only databases with declarative hash partitioning (Postgres) take them; asked
    for explicitly elsewhere, it is an error before any DDL, while the environment's
    default leaves other databases plain.
    """
    db = database_for(connection.dialect.name)
    if layout.partitions is None or (not db.hash_partitions and not layout.explicit):
        return None
    if not db.hash_partitions:
        msg = (
            f"partitions={layout.partitions}: the hash-partitioned messages table is a "
            f"Postgres layout, and this is {db.label}; leave partitions out here"
        )
        raise ValueError(msg)
    return layout.partitions


def check_layout(
    context: MigrationContext, names: TableNames, partitions: int | None, *, explicit: bool
) -> None:
    """After the revisions ran: the messages table has the partitions asked for, or ``ValueError``.

    ``partitions``: what :func:`wanted_partitions` made of the layout for this run (the
    value the revisions were given); ``explicit``: whether the caller asked for it.

    The layout is chosen when revision ``BUILT_AT`` builds that table; a database
    already past it keeps its own. A run that stops below it cannot honour an
    explicit ``partitions=`` (the environment's default waits for a later run).
    Raised inside the migrating transaction, so on Postgres (transactional DDL)
    nothing of this run is kept.
    """
    if partitions is None:
        return
    connection = context.bind
    assert connection is not None  # noqa: S101 - configured with one
    at = context.get_current_revision()
    if BUILT_AT not in _lineage(at):
        if not explicit:
            return
        msg = (
            f"partitions={partitions}: the layout is chosen when revision {BUILT_AT} builds "
            f"the messages table, and this run stopped at {at or 'base'}; upgrade to "
            f"{BUILT_AT} or head with it"
        )
        raise ValueError(msg)
    db = database_for(connection.dialect.name)
    have = db.partition_count(connection, names.messages)
    if have == partitions:
        return
    built = f"{have} hash partitions" if have else "no partitions (the plain layout)"
    msg = (
        f"messages table {names.messages!r} has {built}, not {partitions}: the layout is "
        f"chosen when revision {BUILT_AT} builds that table, and this database has it already. "
        "To rebuild it with another layout, keeping every session and its items: "
        f"`agents-memory db downgrade {_before(BUILT_AT)}` with the same --url and table "
        f"options, then `agents-memory db upgrade --partitions {partitions}`"
    )
    raise ValueError(msg)


def _lineage(revision: str | None) -> set[str]:
    """``revision`` and every revision below it."""
    script = script_directory()
    return {r.revision for r in script.iterate_revisions(revision, "base")} if revision else set()


def _before(revision: str) -> str:
    down = script_directory().get_revision(revision).down_revision
    return str(down) if down else "base"


def sqlite_foreign_keys_off(connection: Connection) -> contextlib.AbstractContextManager[None]:
    """What a database needs around a table rebuild (SQLite: foreign keys off, then on)."""
    return database_for(connection.dialect.name).rebuild_guard(connection)


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
    connection: Connection,
    names: TableNames,
    revision: str,
    *,
    downgrade: bool = False,
    lock_mode: LockMode = "auto",
    layout: Layout | None = None,
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

    layout = layout or Layout()
    partitions = None if downgrade else wanted_partitions(connection, layout)
    ours = not connection.in_transaction()
    with sqlite_foreign_keys_off(connection):
        opts = migration_opts(names, partitions)
        context = MigrationContext.configure(
            connection, opts={**opts, "fn": steps, "script": script}
        )
        with (
            Operations.context(context),
            context.begin_transaction(),
            lock(connection, names, lock_mode),
        ):
            check_tables(connection, names)  # before the first DDL statement
            carry_on_legacy_lineage(Operations(context), names)
            context.run_migrations()
            if not downgrade:
                check_layout(context, names, partitions, explicit=layout.explicit)
        if ours and connection.in_transaction():
            # Commit before the guard switches foreign keys back on: SQLite ignores the
            # pragma inside a transaction, and the connection would go back to the pool
            # (or stay, in memory) without them, so ON DELETE CASCADE would not apply.
            connection.commit()
        if downgrade and revision == "base":
            drop_lock_table(connection, names)
            if ours and connection.in_transaction():
                connection.commit()
