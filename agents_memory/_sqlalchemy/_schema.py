"""Schema readiness: creating tables on request, and turning "no such table" into a next step."""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import Column, MetaData, String, Table, inspect, select
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from agents_memory._codec import logger
from agents_memory._databases import database_for
from agents_memory._errors import SchemaNotReadyError
from agents_memory._locking import LoopSpanningLock
from agents_memory._migrations._preflight import (
    TableMismatchError,
    explain,
    list_sets,
    mismatches,
    table_sets,
)
from agents_memory._tables import TableNames
from agents_memory._urls import mask_url, sqlite_file
from agents_memory.models import REVISION


def upgrade_command(url: str | URL, names: TableNames) -> str:
    """The exact shell command that brings this database's schema up to date."""
    parts = ["agents-memory", "db", "upgrade", "--url", f"'{mask_url(url)}'"]
    if names != TableNames():
        parts += ["--sessions-table", names.sessions, "--messages-table", names.messages]
    return " ".join(parts)


def _is_missing_schema(exc: DBAPIError, engine: AsyncEngine) -> bool:
    """A missing table or column, by the database module's reading of the driver's error."""
    return (
        exc.orig is not None and database_for(engine.dialect.name).classify(exc.orig) == "missing"
    )


@contextlib.contextmanager
def schema_errors(engine: AsyncEngine, names: TableNames) -> Iterator[None]:
    """Re-raise a missing-table/column error as :class:`SchemaNotReadyError` with the fix."""
    try:
        yield
    except DBAPIError as exc:
        if not _is_missing_schema(exc, engine):
            raise
        msg = (
            f"the agents_memory tables ({names.sessions}, {names.messages}) are missing or out "
            f"of date in {mask_url(engine.url)}; run `{upgrade_command(engine.url, names)}` "
            "(or pass create_tables=True during development)"
        )
        raise SchemaNotReadyError(msg) from exc


_ready: weakref.WeakKeyDictionary[Engine, dict[TableNames, bool]] = weakref.WeakKeyDictionary()
"""Name sets checked per engine, and whether their tables are at head (else legacy)."""
_locks: weakref.WeakKeyDictionary[Engine, LoopSpanningLock] = weakref.WeakKeyDictionary()
"""One schema check at a time per engine, whatever loop or thread runs it."""
_locks_guard = threading.Lock()


def _not_ready(
    engine: AsyncEngine,
    names: TableNames,
    at: str | None,
    head: str,
    others: list[tuple[str, str]] | None = None,
) -> str:
    where = f"{names.sessions}/{names.messages} in {mask_url(engine.url)}"
    if at is None and others:
        # Most likely a misspelled name: point at what exists before offering new tables.
        return (
            f"the agents_memory schema ({where}) has not been created; table-name sets that "
            f"exist there: {list_sets(others)}. Check --sessions-table/--messages-table (or "
            "sessions_table=/messages_table=); to create new, empty tables under these "
            f"names, run `{upgrade_command(engine.url, names)}`"
        )
    if at is None:
        state = f"the agents_memory schema ({where}) has not been created or migrated"
    elif at not in _known_revisions():
        return (
            f"the agents_memory schema ({where}) is at revision {at}, which this version of "
            f"agents_memory ({head} is its newest) does not know; upgrade the package"
        )
    else:
        state = f"the agents_memory schema ({where}) is at revision {at}, not {head}"
    return f"{state}; run `{upgrade_command(engine.url, names)}` (or pass create_tables=True)"


async def ensure_schema(engine: AsyncEngine, names: TableNames, *, create: bool) -> bool:
    """Make sure the schema of ``names`` is at head, once per engine; whether it is.

    The answer (``True`` at head, ``False`` for tables used as they are) is the
    one place the statement variant is chosen (``Database.statements(expiry=)``):
    tables never migrated (the Agents SDK's, the seed's) have no ``expires_at`` and
    key their items by a global ``id``, and keep the legacy statements.

    With ``create`` the migrations run (the same scripts as ``agents-memory db
    upgrade``); otherwise the version table is read once and a missing or
    out-of-date schema raises :class:`SchemaNotReadyError` naming the command.
    Tables that predate migrations (the seed's, the Agents SDK's) are used as
    they are, with a warning. Concurrent first calls wait for one check.
    """
    sync_engine = engine.sync_engine
    known = _ready.get(sync_engine, {}).get(names)
    if known is not None:
        return known
    with _locks_guard:
        lock = _locks.setdefault(sync_engine, LoopSpanningLock())
    async with lock.hold():
        known = _ready.get(sync_engine, {}).get(names)
        if known is not None:
            return known
        head = REVISION
        expiry = True
        if create:
            from agents_memory import migrations  # noqa: PLC0415 - Alembic only to migrate

            await migrations.upgrade(
                engine, sessions_table=names.sessions, messages_table=names.messages
            )
        else:
            _require_file(engine, names)
            async with engine.connect() as conn:
                at = await conn.run_sync(lambda c: current_revision(c, names))
            others = await _inspect_unversioned(engine, names) if at is None else []
            if at is None and others is None:
                # Written by the seed's SQLiteSession or the Agents SDK: read it as it is.
                logger.warning(
                    "the agents_memory tables %s/%s in %s were created without migrations; "
                    "items work as they are, session metadata needs `%s`",
                    names.sessions,
                    names.messages,
                    mask_url(engine.url),
                    upgrade_command(engine.url, names),
                )
                expiry = False
            elif at != head:
                raise SchemaNotReadyError(_not_ready(engine, names, at, head, others))
        _ready.setdefault(sync_engine, {})[names] = expiry
        return expiry


def current_revision(connection: Connection, names: TableNames) -> str | None:
    """The revision recorded in the set's version table; ``None``: never migrated.

    What Alembic's ``MigrationContext.get_current_revision()`` reads, read here
    with Core so that opening a store (and every CLI command that only reads)
    loads no Alembic: it is needed only to migrate.
    """
    if not inspect(connection).has_table(names.version_table):
        return None
    version = Table(names.version_table, MetaData(), Column("version_num", String(32)))
    rows = connection.execute(select(version.c.version_num)).scalars().all()
    if len(rows) > 1:  # our lineages never branch: say so rather than pick one
        msg = (
            f"the version table {names.version_table} holds several revisions "
            f"({', '.join(rows)}), but agents_memory's migrations form one line: keep only "
            "the row of the newest revision applied to these tables"
        )
        raise SchemaNotReadyError(msg)
    return rows[0] if rows else None


def _known_revisions() -> set[str]:
    from agents_memory import migrations  # noqa: PLC0415 - only on this error's path

    return {r.revision for r in migrations.history()}


def _require_file(engine: AsyncEngine, names: TableNames) -> None:
    """A read of a SQLite file that does not exist fails without creating it.

    Opening the file to look for tables would leave an empty ``memory.db`` behind
    a failed first run; the next step is the same command either way.
    """
    path = sqlite_file(engine.url)
    # (a missing directory is left to the connect, whose error says to create it)
    if path is not None and not Path(path).exists() and Path(path).parent.is_dir():
        msg = (
            f"the agents_memory schema ({names.sessions}/{names.messages} in "
            f"{mask_url(engine.url)}) has not been created: there is no database file at "
            f"{path}; run `{upgrade_command(engine.url, names)}` (or pass create_tables=True)"
        )
        raise SchemaNotReadyError(msg)


async def _inspect_unversioned(
    engine: AsyncEngine, names: TableNames
) -> list[tuple[str, str]] | None:
    """Never migrated: ``None`` if usable tables of ``names`` exist, else the sets that do exist.

    Tables that exist in the wrong roles (swapped names) raise
    :class:`TableMismatchError`, as ``upgrade`` would, instead of being used.
    """

    def look(connection: Connection) -> list[tuple[str, str]] | None:
        insp = inspect(connection)
        problems = mismatches(insp, names)
        if problems:
            raise TableMismatchError(explain(insp, names, problems))
        if insp.has_table(names.sessions) and insp.has_table(names.messages):
            return None
        return table_sets(insp, near=names)

    async with engine.connect() as conn:
        return await conn.run_sync(look)
